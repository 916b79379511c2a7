"""Accuracy gates and the behavioural parity checks, on hand-built figures and the tiny Qwen2."""

import shutil

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from qwen_onnx.errors import GateError, QwenOnnxError
from qwen_onnx.measure.accuracy import evaluate_accuracy
from qwen_onnx.measure.parity import (
    chat_prompt_ids,
    kv_cache_parity,
    matched_prefix,
    onnx_generate,
    padded_batch_parity,
    shipped_prompts,
)
from qwen_onnx.run.runtime import OnnxCausalLM
from qwen_onnx.settings.gates import check_gate, variant_kind
from qwen_onnx.source.tokenizer import eos_token_ids
from qwen_onnx.store.artifacts import DATA_FILE, MODEL_FILE
from qwen_onnx.store.external import save_with_external_data

INT8_STATIC_GATE = {"ppl_delta_pct": 2.0, "top1_pct": 93.0, "kl_mean": 0.05}


def test_gate_passes_within_limits():
    metrics = {"ppl": 12.1, "ppl_delta_pct": 0.7, "top1_pct": 95.4, "kl_mean": 0.01, "nonfinite_logits": 0}
    assert check_gate(metrics, INT8_STATIC_GATE) == ("PASS", [])


def test_gate_fails_an_exploded_perplexity_with_the_failing_figures():
    # an exploded static INT8 variant: perplexity 83.3 against 12.03
    metrics = {"ppl": 83.3, "ppl_delta_pct": 592.4, "top1_pct": 40.9, "kl_mean": 1.9, "nonfinite_logits": 0}
    status, failures = check_gate(metrics, INT8_STATIC_GATE)
    assert status == "FAIL"
    assert failures == ["ppl_delta_pct 592.4 > 2", "top1_pct 40.9 < 93", "kl_mean 1.9 > 0.05"]


def test_gate_fails_nan_even_without_limits():
    status, failures = check_gate({"ppl": float("nan"), "nonfinite_logits": 12}, {})
    assert status == "FAIL"
    assert failures[0] == "nonfinite logits 12 > 0" and "not finite" in failures[1]
    assert check_gate({"ppl": 10.0, "top1_pct": float("nan")}, {"top1_pct": 90})[0] == "FAIL"


def test_gate_refuses_a_limit_on_an_unknown_figure():
    with pytest.raises(KeyError, match="'ppl_delta'"):
        check_gate({"ppl": 10.0}, {"ppl_delta": 1.0})


def test_variant_kinds():
    assert [variant_kind(v) for v in ("fp32", "preprocessed", "optimized", "fp16", "int8-dynamic", "int8-static")] == [
        "float", "float", "float", "float16", "int8_dynamic", "int8_static"]


def test_the_tflite_gate_kind_follows_its_quantization(tmp_path):
    from qwen_onnx.errors import OptionError
    from qwen_onnx.settings.defaults import TFLITE_QUANTIZATIONS
    from qwen_onnx.settings.gates import DEFAULT_GATES, folder_gate_kind, tflite_gate_kind

    expected = {"dynamic_int8": "int8_dynamic", "weight_only_int8": "int8_dynamic", "fp16": "float16", "none": "float",
                "dynamic_int4_block32": "int4", "dynamic_int4_block128": "int4"}
    assert {q: tflite_gate_kind(q) for q in TFLITE_QUANTIZATIONS} == expected
    assert all(kind in DEFAULT_GATES for kind in expected.values())
    assert variant_kind("tflite") == "int8_dynamic"  # the default quantization, dynamic_int8
    assert [variant_kind("tflite", q) for q in ("fp16", "none", "dynamic_int4_block32")] == ["float16", "float", "int4"]
    with pytest.raises(OptionError, match="tflite quantize 'int3' is unknown; give one of dynamic_int8"):
        tflite_gate_kind("int3")
    # a folder: a tflite one by the quantization in its tflite.json, whatever its name; any other by its name
    (tmp_path / "my-export").mkdir()
    (tmp_path / "my-export" / "tflite.json").write_text('{"quantize": "fp16"}')
    (tmp_path / "int4").mkdir()
    assert folder_gate_kind(tmp_path / "my-export") == "float16" and folder_gate_kind(tmp_path / "int4") == "int4"
    # any other by the kind its stage recorded, whatever its name; a registered name only for older folders
    (tmp_path / "blockwise-try").mkdir()
    (tmp_path / "blockwise-try" / "quantize.json").write_text('{"kind": "static", "gate_kind": "int8_mixed"}')
    assert folder_gate_kind(tmp_path / "blockwise-try") == "int8_mixed"
    (tmp_path / "int4-k_quant").mkdir()
    with pytest.raises(QwenOnnxError, match=r"int4-k_quant records no gate kind .* give the kind \(--gate-kind, one of "):
        folder_gate_kind(tmp_path / "int4-k_quant")
    with pytest.raises(KeyError, match="unknown variant 'int4-k_quant'"):
        variant_kind("int4-k_quant")


def test_matched_prefix():
    assert matched_prefix([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert matched_prefix([1, 2], [1, 2, 3]) == 2
    assert matched_prefix([], [1]) == 0


@pytest.fixture(scope="module")
def prompt_ids(pipeline):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(pipeline["hf"])
    return tokenizer, chat_prompt_ids(tokenizer, shipped_prompts())


def test_prompts_have_different_lengths_and_end_with_the_generation_prompt(prompt_ids):
    tokenizer, ids = prompt_ids
    assert len({len(i) for i in ids}) == len(ids) >= 4
    assert all(tokenizer.decode(i).endswith("<|im_start|>assistant\n") for i in ids)


def test_eos_ids_come_from_generation_config(pipeline):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(pipeline["hf"])
    assert eos_token_ids(pipeline["fp32"]) == [
        tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")]


@pytest.mark.parametrize("variant", ["fp32", "optimized"])
def test_padded_batch_and_kv_cache_parity_of_float_variants(pipeline, prompt_ids, variant):
    tokenizer, ids = prompt_ids
    model = OnnxCausalLM(pipeline[variant])
    padded = padded_batch_parity(model, ids, tokenizer.pad_token_id)
    assert padded["padded_batch_nonfinite"] == 0
    assert padded["padded_batch_max_abs_diff"] < 1e-4
    assert padded["padded_batch_top1_pct"] == 100.0
    kv = kv_cache_parity(model, ids[0], 8)
    assert kv["kv_cache_max_abs_diff"] < 1e-4 and kv["kv_cache_steps"] == 8


def test_generation_stops_on_an_eos_id(pipeline, prompt_ids):
    _, ids = prompt_ids
    model = OnnxCausalLM(pipeline["fp32"])
    free = onnx_generate(model, ids[0], 12, eos_ids=[])
    assert len(free) == 12
    stopped = onnx_generate(model, ids[0], 12, eos_ids=[free[3]])
    assert stopped == free[: free.index(free[3]) + 1]


def break_variant(source, target):
    """A copy of ``source`` whose lm_head weight is replaced by noise: a deliberately broken variant."""
    shutil.copytree(source, target)
    proto = onnx.load(str(target / MODEL_FILE), load_external_data=True)
    head = next(n for n in proto.graph.node if n.name == "/lm_head/MatMul")
    weight = next(t for t in proto.graph.initializer if t.name == head.input[1])
    noise = np.random.default_rng(0).normal(0, 1.0, size=tuple(weight.dims)).astype(np.float32)
    weight.CopyFrom(numpy_helper.from_array(noise, weight.name))
    (target / DATA_FILE).unlink()
    (target / "manifest.json").unlink()  # a hand-made folder: no manifest (else its sha256 check refuses it)
    save_with_external_data(proto, target / MODEL_FILE)
    return target


def test_a_broken_variant_is_marked_fail_and_can_fail_the_stage(pipeline, texts, tmp_path):
    broken = break_variant(pipeline["fp32"], tmp_path / "broken")
    kwargs = dict(window=32, max_windows=2, generation_tokens=4, gate_limits=INT8_STATIC_GATE)
    result = evaluate_accuracy(broken, pipeline["hf"], texts["evaluation"], **kwargs)
    assert result["gate"] == "FAIL"
    assert any(f.startswith("top1_pct") for f in result["gate_failures"])
    good = evaluate_accuracy(pipeline["fp32"], pipeline["hf"], texts["evaluation"], **kwargs)
    assert good["gate"] == "PASS", good["gate_failures"]
    assert good["generation_match_pct"] == 100.0 and good["kv_cache_max_abs_diff"] < 1e-4
    out = tmp_path / "broken.accuracy.json"
    with pytest.raises(GateError, match="FAIL.*top1_pct"):
        evaluate_accuracy(broken, pipeline["hf"], texts["evaluation"], fail_on_gate=True, output=out, **kwargs)
    assert out.is_file()  # the figures are kept for the user even when the stage fails
