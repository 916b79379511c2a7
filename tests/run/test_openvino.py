"""Our variants run by OpenVINO's CPU plugin (a real run on the tiny Qwen2, no mock of OpenVINO): its logits
against onnxruntime's on the same graph, the KV-cache decode against the full forward, what it reports,
and the reasons it refuses."""

from __future__ import annotations

import builtins
import importlib.util

import numpy as np
import pytest

from qwen_onnx.errors import OptionError, RunnerError
from qwen_onnx.measure.parity import kv_cache_parity
from qwen_onnx.run.openvino import BATCH_ONE, OpenVinoCausalLM
from qwen_onnx.run.runtime import OnnxCausalLM

pytestmark = pytest.mark.skipif(importlib.util.find_spec("openvino") is None,
                                reason="openvino is not installed (envs/setup.sh installs it, envs/requirements.txt)")

#: Largest |Δlogit| between OpenVINO (f32 hint, dynamic quantization off) and onnxruntime on the same float
#: arithmetic: measured 8.6e-6 (fp32), 6.6e-6 (optimized) and 7.6e-6 (int4 at accuracy_level 0) on logits up to
#: 6.4 in size (AVX-512 EPYC, OpenVINO 2026.4.1, onnxruntime 1.32): float32 rounding.
SAME_ARITHMETIC = 1e-4
#: Largest |Δlogit| between OpenVINO's default int4 run and onnxruntime's with our graph's accuracy_level 4
#: (onnxruntime quantizes MatMulNBits' activations to INT8 per block; OpenVINO keeps them f32 on this graph):
#: measured 0.23 with every top-1 equal, on the same machine.
ACTIVATION_QUANTIZATION = 0.5


def _ids(count: int, start: int = 3) -> np.ndarray:
    return np.arange(start, start + count, dtype=np.int64)


@pytest.fixture(scope="module")
def int4_float_activations(pipeline, tmp_path_factory):
    """The pipeline's int4 graph with every MatMulNBits at accuracy_level 0: onnxruntime then computes them with
    float activations, as OpenVINO does with its dynamic quantization off (the same weights)."""
    import onnx

    model = onnx.load(str(pipeline["int4"] / "model.onnx"))
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            for attribute in node.attribute:
                if attribute.name == "accuracy_level":
                    attribute.i = 0
    folder = tmp_path_factory.mktemp("int4-level0") / "int4"
    folder.mkdir()
    onnx.save(model, str(folder / "model.onnx"))
    return folder


@pytest.mark.parametrize("variant", ["fp32", "optimized", "int4-level0"])
def test_logits_match_onnxruntime_on_the_same_arithmetic(pipeline, int4_float_activations, variant):
    folder = int4_float_activations if variant == "int4-level0" else pipeline[variant]
    ov = OpenVinoCausalLM(folder, threads=1, dynamic_quantization_group_size=0)
    ort = OnnxCausalLM(folder, threads=1)
    ids = _ids(40).reshape(1, -1)
    got, present = ov.forward(ids)
    want, expected = ort.forward(ids)
    assert got.dtype == np.float32 and got.shape == want.shape and got.shape[:2] == (1, 40)
    assert np.abs(got - want).max() < SAME_ARITHMETIC, np.abs(got - want).max()
    assert set(present) == set(expected) == set(ort.kv.names)
    assert all(np.abs(present[k] - expected[k]).max() < SAME_ARITHMETIC for k in present)


def test_int4_with_onnxruntimes_activation_quantization(pipeline):
    """The pipeline's int4 (accuracy_level 4) with OpenVINO's defaults: the two runtimes quantize activations
    differently, so the logits differ by more than rounding, but not in their argmax."""
    ov, ort = OpenVinoCausalLM(pipeline["int4"], threads=1), OnnxCausalLM(pipeline["int4"], threads=1)
    ids = _ids(40).reshape(1, -1)
    got, want = ov.forward(ids)[0], ort.forward(ids)[0]
    assert np.abs(got - want).max() < ACTIVATION_QUANTIZATION, np.abs(got - want).max()
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.95


@pytest.mark.parametrize("variant", ["fp32", "int4"])
def test_kv_cache_decode_matches_the_full_forward(pipeline, variant):
    """A prefill then 16 single-token steps, the cache fed back by hand, against one pass over the whole
    sequence (measured: 2e-6 on fp32, 1e-5 on int4); greedy generation reads the same logits."""
    ov = OpenVinoCausalLM(pipeline[variant], threads=1)
    parity = kv_cache_parity(ov, _ids(48), 16)
    assert parity["kv_cache_max_abs_diff"] < SAME_ARITHMETIC and parity["kv_cache_top1_pct"] == 100.0
    steps, timings = [], []
    tokens, prefill = ov.greedy(_ids(10).reshape(1, -1), 6, timings=timings, step_logits=steps)
    assert tokens.shape == (6,) and prefill > 0 and len(timings) == 5 and all(t > 0 for t in timings)
    full, _ = ov.forward(np.concatenate([_ids(10), tokens[:-1]]).reshape(1, -1))
    assert np.abs(np.stack(steps) - full[0, 9:]).max() < SAME_ARITHMETIC
    assert list(ov.generate(_ids(10), 6, eos_ids=[int(tokens[2])])[0]) == list(tokens[:3])


def test_it_reports_what_openvino_runs(pipeline):
    """Precision hint f32 read back (the plugin's own default may be bf16), the threads asked for, no layer in
    bf16, and the 4-bit weights kept 4-bit (u4 layers)."""
    report = OpenVinoCausalLM(pipeline["int4"], threads=1).report()
    assert report["openvino"].startswith("2026.") and "FP32" in report["optimization_capabilities"]
    assert report["requested"] == {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1}
    assert report["compiled"]["INFERENCE_PRECISION_HINT"] == "f32" and report["compiled"]["INFERENCE_NUM_THREADS"] == 1
    assert report["plugin_default_precision"] in ("f32", "bf16", "f16")
    assert "u4" in report["layers_by_precision"] and not {"bf16", "f16"} & set(report["layers_by_precision"])
    assert report["kernels"] and not any("bf16" in kernel for kernel in report["kernels"])


def test_group_query_attention_graphs_run_batch_one(pipeline):
    ov = OpenVinoCausalLM(pipeline["optimized"], threads=1)
    assert ov.max_batch == 1 and OpenVinoCausalLM(pipeline["fp32"], threads=1).max_batch is None
    with pytest.raises(OptionError, match="batch 1 only"):
        ov.forward(np.stack([_ids(8), _ids(8)]))
    assert "openvinotoolkit/openvino#37207" in BATCH_ONE


def test_missing_openvino_bad_settings_and_graphs_it_cannot_compile_are_refused(pipeline, tmp_path, monkeypatch):
    from tiny_models import write_unknown_op_graph

    with pytest.raises(OptionError, match="threads must be at least 1"):
        OpenVinoCausalLM(pipeline["fp32"], threads=0)
    with pytest.raises(RunnerError, match=r"^OpenVINO 2026\.\S+ did not compile .*model.onnx: "):
        OpenVinoCausalLM(write_unknown_op_graph(tmp_path / "odd"), threads=1)
    real_import = builtins.__import__

    def no_openvino(name, *args, **kwargs):
        if name == "openvino":
            raise ImportError("No module named 'openvino'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_openvino)
    with pytest.raises(RunnerError, match=r"openvino is not installed .*; envs/setup.sh installs it"):
        OpenVinoCausalLM(pipeline["fp32"], threads=1)
