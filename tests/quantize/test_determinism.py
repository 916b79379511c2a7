"""Same inputs, same commit, same CPU: the same bytes. Every quantizer (the calibrated, searched and
smoothed ones included) builds the tiny Qwen2's variant three times, each in a fresh process, on 2
cores, 2 cores again and 1 core; model.onnx and its external data must be byte-identical."""

import os

import pytest
from child_jobs import BUILD_KINDS, build_variant

from qwen_onnx.measure.sitting import run_in_child


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to compare 1 and 2")
@pytest.mark.parametrize("kind", BUILD_KINDS)
def test_rebuilding_a_variant_gives_the_same_bytes(pipeline, texts, tmp_path, kind):
    dirs = {k: str(v) for k, v in pipeline.items()}
    hashes = [run_in_child(build_variant, kind, dirs, str(texts["calibration"]), str(tmp_path / f"build{i}"), cores)
              for i, cores in enumerate((2, 2, 1))]
    assert "model.onnx" in hashes[0]
    assert any(name.endswith(".onnx_data") for name in hashes[0]) or kind == "fp16", hashes[0]
    different = {name for name in hashes[0] if len({h.get(name) for h in hashes}) > 1}
    assert not different, f"{kind}: {sorted(different)} differ between builds on 2, 2 and 1 cores"
