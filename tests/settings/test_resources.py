"""The resources each workflow job declares (qwen_onnx.settings.resources): memory and run time from the model's
parameter count, by the session a job holds, with GPTQ's Hessians on the int4 stage."""

from __future__ import annotations

import pytest

from qwen_onnx.settings import resources as r


def test_memory_is_a_line_in_the_fp32_weights_with_headroom_in_mb():
    # export: 1.15 x (2.3 GiB + 2.1 GiB per fp32 GB); the 1.5B's 6.16 GB; 1 GiB = 1073.741824 MB
    assert r.mem_mb("export", 1.54) == int(1073.741824 * 1.15 * (2.3 + 2.1 * 6.16)) == 18813
    assert r.mem_mb("export", 0.49) == int(1073.741824 * 1.15 * (2.3 + 2.1 * 1.96)) == 7922
    # above the largest peaks published: the 1.5B's export 15,573 MiB, float16 17,287, the 0.5B's genai_builder 7,018
    assert r.mem_mb("export", 1.54) > 15573 * 1.048576 and r.mem_mb("float16", 1.54) > 17287 * 1.048576
    assert r.mem_mb("genai_builder", 0.49) > 7018 * 1.048576
    with pytest.raises(KeyError):
        r.mem_mb("no_such_stage", 1.0)


def test_a_session_job_declares_by_what_its_session_holds():
    assert [r.session_kind(n) for n in ("fp32", "fp16", "optimized", "tflite", "int4", "int4-openvino",
                                        "llama.cpp-q4_k_m", "int8-dynamic-openvino")] == [
        "float", "float", "float", "tflite", "quantized", "quantized", "quantized", "quantized"]
    assert r.mem_mb("accuracy", 1.54, session="fp32") == int(1073.741824 * 1.15 * (2.2 + 1.1 * 6.16)) == 11083
    assert r.mem_mb("accuracy", 1.54, session="int4-openvino") == int(1073.741824 * 1.15 * (2.1 + 0.8 * 6.16))
    assert r.mem_mb("task_accuracy", 1.54, session="int4") == int(1073.741824 * 1.15 * (0.9 + 0.3 * 6.16)) == 3393


def test_gptq_adds_its_hessians_to_the_int4_stage_only():
    on = {"gptq_updates": True, "algorithm": "k_quant_int"}
    assert r.gptq_gib(on) == 3.5 and r.gptq_gib({**on, "gptq_roles": ["lm_head"]}) == 0.5
    assert r.gptq_gib({**on, "algorithm": "rtn"}) == 0.0 and r.gptq_gib({}) == 0.0
    base = r.mem_mb("quantize_int4", 0.5)
    assert r.mem_mb("quantize_int4", 0.5, int4_settings=on) - base == pytest.approx(1073.741824 * 3.5, abs=1)
    assert r.mem_mb("quantize_dynamic", 0.5, int4_settings=on) == r.mem_mb("quantize_dynamic", 0.5)


def test_run_time_and_the_tflite_and_task_declarations():
    assert r.runtime_min("export", 1.5) == int(10 + 5 * 1.1 * 6.0) == 43  # docs/cluster.md's 1.5B export
    assert r.runtime_min("quantize_int4", 0.5) == int(10 + 5 * 5.2 * 2.0) == 62
    # 164 problems on the 0.5B: 10 + 5 x 164 x 5.1 s x 2 GB / 60
    assert r.task_runtime_min(164, 0.5) == int(10 + 5 * 164 * 5.1 * 2.0 / 60) == 149
    assert r.tflite_mem_mb(13.0) == int(1073.741824 * 1.15 * 13.0)
    assert r.tflite_mem_mb(0.01) == int(1073.741824 * 1.15 * 1.2)  # at least the imports' 1.2 GiB
