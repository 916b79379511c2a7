"""The MatMulNBits kernel-time tool (lab/kernels.py): bytes per option, figures per round, errors."""

from __future__ import annotations

import numpy as np
import pytest

from lab.kernels import compare_kernels, layer_shapes, main, parse_option
from qwen_onnx.errors import QwenOnnxError


def test_layer_shapes_are_a_fused_qwen_layer():
    # Qwen2.5-0.5B: hidden 896, 2 KV heads of 64 (kv width 128), intermediate 4864
    assert layer_shapes(896, 4864, 128) == [(896, 1152), (896, 896), (896, 4864), (896, 4864), (4864, 896)]


def test_compare_kernels_times_every_option_with_its_stored_bytes(tmp_path):
    result = compare_kernels([(8, 32, 4), (4, 32, 4), (4, 16, 0)], hidden=64, intermediate=128, kv_width=16, layers=2,
                             threads=1, rounds=2, runs=2, output=tmp_path / "kernels.json")
    eight, four, four16 = result["options"]
    # per layer: K x N of qkv (64 x 96), o (64 x 64), gate and up (64 x 128), down (128 x 64)
    shapes = [(64, 96), (64, 64), (64, 128), (64, 128), (128, 64)]
    for row, bits, block in ((eight, 8, 32), (four, 4, 32), (four16, 4, 16)):
        packed = sum(n * k * bits // 8 for k, n in shapes)
        scales = sum(n * (k // block) * 4 for k, n in shapes)
        zero_points = sum(n * -(-(k // block) * bits // 8) for k, n in shapes)
        assert row["stored_mb"] == pytest.approx(2 * (packed + scales + zero_points) / 1e6)
        assert len(row["rounds_ms"]) == 2 and row["ms"] == pytest.approx(float(np.median(row["rounds_ms"])))
        assert row["gb_s"] == pytest.approx(row["stored_mb"] / row["ms"])
    assert four16["accuracy_level"] == 0 and eight["time_vs_first"] == 1.0
    assert four["time_vs_first"] == pytest.approx(four["ms"] / eight["ms"])
    assert result["isa"] and result["int8_kernel"] and result["process_per_measurement"] is True


def test_prefill_shape_times_the_float_matmul_beside_the_quantized_one():
    result = compare_kernels([(32, 0, 0), (8, 32, 4)], hidden=64, intermediate=128, kv_width=16, layers=1, threads=1,
                             rounds=1, runs=2, tokens=5)
    float_row, eight = result["options"]
    shapes = [(64, 96), (64, 64), (64, 128), (64, 128), (128, 64)]
    weights = sum(k * n for k, n in shapes)
    assert float_row["stored_mb"] == pytest.approx(4 * weights / 1e6)
    assert eight["stored_mb"] == pytest.approx(sum(n * k + n * (k // 32) * 4 + n * (k // 32) for k, n in shapes) / 1e6)
    for row in (float_row, eight):
        assert row["gflop_s"] == pytest.approx(2 * weights * 5 / (row["ms"] / 1000) / 1e9)
    assert result["tokens"] == 5 and parse_option("fp32") == (32, 0, 0)
    with pytest.raises(QwenOnnxError, match="at least one round, run and token, got 1, 1 and 0"):
        compare_kernels([(4, 32, 4)], rounds=1, runs=1, tokens=0)


@pytest.mark.parametrize("option, message", [((3, 32, 4), "no option 3/32/4"), ((4, 24, 4), "no option 4/24/4"),
                                             ((4, 32, 7), "no option 4/32/7")])
def test_an_option_matmulnbits_lacks_is_named(option, message):
    with pytest.raises(QwenOnnxError, match=message):
        compare_kernels([option])


def test_the_command_parses_options_and_refuses_bad_ones(capsys):
    assert parse_option("4/32") == (4, 32, 4) and parse_option("8/128/0") == (8, 128, 0)
    with pytest.raises(SystemExit):
        main(["4-32"])
    assert "is not BITS/BLOCK[/LEVEL]" in capsys.readouterr().err
    assert main(["5/32", "--rounds", "1"]) == 2
    assert "lab.kernels: MatMulNBits has no option 5/32/4" in capsys.readouterr().err
