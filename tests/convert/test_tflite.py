"""The tflite variant (litert-torch): the folder, its signatures, logits and greedy tokens against PyTorch, bad input.

In ``.venv``, which has no LiteRT, the conversion, accuracy, timing and inspection run in the TFLite environment
(:mod:`qwen_onnx.run.tflite_env`) and the tests that run LiteRT in their own process are skipped;
the last test runs those (marked ``litert``) inside ``.venv-tflite``, on the folders converted here.

Tolerances were measured on the tiny random Qwen2 (hidden 64, logits of magnitude up to ~6) and
are set a few times above the measurement (TFLITE_NOTES.md).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from timing_checks import assert_timed

from qwen_onnx.convert import tflite as tflite_module
from qwen_onnx.convert.tflite import convert_tflite, count_weight_only_ops
from qwen_onnx.errors import ArchitectureError, ExportError, OptionError
from qwen_onnx.run.tflite import TfliteCausalLM
from qwen_onnx.run.tflite_env import litert_here, tflite_python, versions
from qwen_onnx.store.artifacts import SIGNATURES_FILE, TFLITE_FILE
from qwen_onnx.store.manifest import MANIFEST_FILE, verify_manifest

#: The cache holds the accuracy stage's longest chat prompt on the tiny tokenizer (105 tokens) plus its generation.
PREFILL, KV = 8, 128
#: fp32 (quantize none) against transformers: max |logit difference| measured 1.1e-5.
FP32_ATOL = 1e-4


def in_litert(test):
    """A test that runs LiteRT (or litert-torch) in its own process: only inside the TFLite environment, where
    :func:`test_the_litert_tests_pass_inside_the_tflite_environment` runs the tests marked ``litert``."""
    skip = pytest.mark.skipif(not litert_here(converter=True), reason="runs LiteRT in this process: in .venv-tflite, "
                              "where this module's last test runs them")
    return pytest.mark.litert(skip(test))


def prompt(n, seed=0):
    return np.random.default_rng(seed).integers(10, 300, size=n).tolist()


@pytest.fixture(scope="module")
def torch_model(tiny_qwen2):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_qwen2, torch_dtype=torch.float32).eval()


def torch_logits(model, ids):
    """float32 [sequence_length, vocab] of every position."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


#: The folder of the conversions made in ``.venv``, given to this module's litert tests in ``.venv-tflite``
#: (:func:`test_the_litert_tests_pass_inside_the_tflite_environment`), which read them instead of converting again.
CONVERTED_VARIABLE = "QWEN_ONNX_TEST_TFLITE_CONVERTED"


@pytest.fixture(scope="module")
def converted(tiny_qwen2, tmp_path_factory):
    """The tiny Qwen2 converted twice: fp32 (``none``) and ``dynamic_int8``: ``{quantize: (folder, info)}``, the
    info as :func:`convert_tflite` returns it and the folder's tflite.json holds it."""
    if given := os.environ.get(CONVERTED_VARIABLE):
        return {q: (Path(given) / q, json.loads((Path(given) / q / SIGNATURES_FILE).read_text()))
                for q in ("none", "dynamic_int8")}
    root = tmp_path_factory.mktemp("tflite")
    return {q: (root / q, convert_tflite(tiny_qwen2, root / q, prefill_length=PREFILL, kv_cache_length=KV, quantize=q))
            for q in ("none", "dynamic_int8")}


def test_conversion_writes_the_folder(converted):
    folder, info = converted["dynamic_int8"]
    for name in (TFLITE_FILE, SIGNATURES_FILE, MANIFEST_FILE, "config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (folder / name).is_file(), name
    assert verify_manifest(folder)
    assert json.loads((folder / SIGNATURES_FILE).read_text()) == json.loads(json.dumps(info))
    assert info["tflite_bytes"] == (folder / TFLITE_FILE).stat().st_size
    # int8 weights: the file is well under the fp32 one (368 KB against 696 KB measured)
    assert info["tflite_bytes"] < 0.7 * converted["none"][1]["tflite_bytes"]
    assert info["seconds"] > 0 and info["peak_rss_mib"] > 100
    assert info["litert_torch_version"] == versions(["litert-torch"])["litert-torch"] is not None


@in_litert
def test_weight_only_roles_make_down_proj_and_lm_head_float_products(converted):
    """The default dynamic_int8 keeps every down_proj and the lm_head weight-only: in the flatbuffer,
    their FULLY_CONNECTED ops read a weight that a DEQUANTIZE op makes (2 layers + lm_head per signature)."""
    folder, info = converted["dynamic_int8"]
    assert info["weight_only_roles"] == ["down_proj", "lm_head"]
    assert info["weight_only_ops"] == count_weight_only_ops(folder / TFLITE_FILE) == {f"prefill_{PREFILL}": 3, "decode": 3}
    # other quantizations have no dynamic products to keep float: the roles are not applied, and recorded so
    assert converted["none"][1]["weight_only_roles"] == [] and converted["none"][1]["weight_only_ops"] == {}
    assert count_weight_only_ops(converted["none"][0] / TFLITE_FILE) == {f"prefill_{PREFILL}": 0, "decode": 0}


@in_litert
def test_weight_only_roles_that_match_no_op_stop_the_conversion(tiny_qwen2, tmp_path, monkeypatch):
    """A litert-torch whose op names no longer match the roles' patterns would convert silently unchanged
    (as its own per-block overrides do); the count after the conversion stops it instead."""
    monkeypatch.setitem(tflite_module._WEIGHT_ONLY_OPS, "down_proj", r"no-such-op")
    with pytest.raises(ExportError, match=r"should make 3 FULLY_CONNECTED ops per signature weight-only; litert-torch's "
                                          r"recipe made \{") as error:
        convert_tflite(tiny_qwen2, tmp_path / "out", prefill_length=PREFILL, kv_cache_length=KV)
    # only the lm_head matched
    assert "'decode': 1" in str(error.value) and f"'prefill_{PREFILL}': 1" in str(error.value)
    assert "\n" not in str(error.value) and "set tflite.weight_only_roles: []" in str(error.value)
    assert not (tmp_path / "out").exists()


def test_signatures_have_the_configured_shapes(converted, tiny_qwen2):
    config = json.loads((tiny_qwen2 / "config.json").read_text())
    vocab, layers = config["vocab_size"], config["num_hidden_layers"]
    kv_heads, head_dim = config["num_key_value_heads"], config["hidden_size"] // config["num_attention_heads"]
    for quantize, (_, info) in converted.items():
        assert (info["prefill_length"], info["kv_cache_length"], info["quantize"]) == (PREFILL, KV, quantize)
        assert set(info["signatures"]) == {f"prefill_{PREFILL}", "decode"}
        assert info["prefill_signature"] == f"prefill_{PREFILL}" and info["decode_signature"] == "decode"
        cache = {f"kv_cache_{kv}_{i}": {"shape": [1, KV, kv_heads, head_dim], "dtype": "float32",
                                        "axes": ["batch_size", "kv_cache_length", "kv_heads", "head_dim"]}
                 for kv in "kv" for i in range(layers)}
        for name, length in ((f"prefill_{PREFILL}", PREFILL), ("decode", 1)):
            signature = info["signatures"][name]
            assert signature["inputs"] == {
                "tokens": {"shape": [1, length], "dtype": "int32", "axes": ["batch_size", "sequence_length"]},
                "input_pos": {"shape": [length], "dtype": "int32", "axes": ["sequence_length"]}, **cache}
            assert signature["outputs"] == {
                "logits": {"shape": [1, length, vocab], "dtype": "float32",
                           "axes": ["batch_size", "sequence_length", "vocab"]}, **cache}


@in_litert
@pytest.mark.parametrize("n", [5, PREFILL, 13])  # padded, exact, two chunks (the second moved back to overlap)
def test_fp32_prefill_and_decode_match_pytorch(converted, torch_model, n):
    lm = TfliteCausalLM(converted["none"][0], threads=1)
    ids = prompt(n + 4, seed=n)
    reference = torch_logits(torch_model, ids)  # [n + 4, vocab]
    got = lm.prefill(ids[:n])
    assert got.shape == (n, reference.shape[1]) and got.dtype == np.float32
    np.testing.assert_allclose(got, reference[:n], rtol=0, atol=FP32_ATOL)
    for position in range(n, n + 4):
        np.testing.assert_allclose(lm.decode(ids[position]), reference[position], rtol=0, atol=FP32_ATOL)
    assert lm.position == n + 4


@in_litert
def test_fp32_greedy_tokens_equal_pytorchs(converted, torch_model):
    ids = prompt(6, seed=3)
    expected, sequence = [], list(ids)
    for _ in range(8):
        token = int(torch_logits(torch_model, sequence)[-1].argmax())
        expected.append(token)
        sequence.append(token)
    assert len(set(expected)) > 1  # not a degenerate repetition
    assert TfliteCausalLM(converted["none"][0], threads=2).generate(ids, max_new_tokens=8) == expected


@in_litert
def test_greedy_stops_when_the_cache_is_full(converted):
    lm = TfliteCausalLM(converted["none"][0], threads=1)
    new = lm.generate(prompt(KV - 3), max_new_tokens=10)
    assert len(new) == 4 and lm.position == KV  # one token from the prefill, three decoded at 29, 30, 31
    with pytest.raises(OptionError, match="outside the KV cache"):
        lm.decode(new[-1])


@in_litert
def test_dynamic_int8_logits_are_close(converted, torch_model):
    """Measured on these 13 prompt + 8 decode positions: max |diff| 0.38, mean KL 0.0029 nats, top-1 19 of 21.

    The tiny model's random weights (std 0.2) give near-ties that int8 weights flip; the 0.5B's
    figures come from the accuracy stage, not from here."""
    lm = TfliteCausalLM(converted["dynamic_int8"][0], threads=1)
    ids = prompt(21, seed=7)
    reference = torch_logits(torch_model, ids)
    got = np.concatenate([lm.prefill(ids[:13]), np.stack([lm.decode(t) for t in ids[13:]])])
    assert got.shape == reference.shape
    diff = np.abs(got - reference).max()
    log_p = torch.log_softmax(torch.from_numpy(reference), -1)
    log_q = torch.log_softmax(torch.from_numpy(got), -1)
    kl = float((log_p.exp() * (log_p - log_q)).sum(-1).mean())
    top1 = float((got.argmax(-1) == reference.argmax(-1)).mean())
    assert 1e-3 < diff < 1.5, diff  # quantized (not fp32) yet close
    assert kl < 0.02, kl
    assert top1 >= 0.75, top1


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(prefill_length=64, kv_cache_length=32), "prefill_length 64 is longer than kv_cache_length 32"),
    (dict(prefill_length=0, kv_cache_length=32), "prefill_length 0 is out of range"),
    (dict(quantize="full_int8"), "no full-integer"),
    (dict(quantize="int3"), "unknown"),
    (dict(weight_only_roles=["up_proj"]), r"\['up_proj'\] are not roles it can keep weight-only; give some of down_proj, lm_head"),
])
def test_bad_options_raise_one_line_and_write_nothing(tiny_qwen2, tmp_path, kwargs, match):
    with pytest.raises(OptionError, match=match) as error:
        convert_tflite(tiny_qwen2, tmp_path / "out", **kwargs)
    assert "\n" not in str(error.value)
    assert list(tmp_path.iterdir()) == []


def test_unsupported_model_type_raises_one_line_and_writes_nothing(tiny_qwen2, tmp_path):
    other = tmp_path / "llama"
    other.mkdir()
    config = json.loads((tiny_qwen2 / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    with pytest.raises(ArchitectureError, match="model_type 'llama' cannot be converted to TFLite") as error:
        convert_tflite(other, tmp_path / "out", prefill_length=PREFILL, kv_cache_length=KV)
    assert "\n" not in str(error.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llama"]


@in_litert
def test_qwen3_fp32_matches_pytorch(tmp_path_factory):
    """Qwen3 (q/k RMSNorm, explicit head_dim): max |logit difference| measured 5.7e-6."""
    from tiny_models import build_tiny_qwen
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("tflite-qwen3")
    hf_dir = build_tiny_qwen(root / "model", "qwen3")
    convert_tflite(hf_dir, root / "tflite", prefill_length=PREFILL, kv_cache_length=KV, quantize="none")
    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
    ids = prompt(14, seed=5)
    reference = torch_logits(model, ids)
    lm = TfliteCausalLM(root / "tflite", threads=1)
    got = np.concatenate([lm.prefill(ids[:10]), np.stack([lm.decode(t) for t in ids[10:]])])
    np.testing.assert_allclose(got, reference, rtol=0, atol=FP32_ATOL)


def test_cli_converts_fp16_and_refuses_bad_lengths_in_one_line(tiny_qwen2, torch_model, tmp_path, capsys):
    """fp16 weights: max |logit difference| against transformers measured 0.0077."""
    from qwen_onnx.cli import main

    assert main(["tflite", str(tiny_qwen2), "-o", str(tmp_path / "bad"), "--prefill-length", "64",
                 "--kv-cache-length", "32"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("qwen-onnx tflite: tflite prefill_length 64 is longer than kv_cache_length 32") and "\n" not in err
    assert not (tmp_path / "bad").exists()

    assert main(["tflite", str(tiny_qwen2), "-o", str(tmp_path / "fp16"), "--prefill-length", str(PREFILL),
                 "--kv-cache-length", str(KV), "--quantize", "fp16"]) == 0
    info = json.loads((tmp_path / "fp16" / SIGNATURES_FILE).read_text())
    assert json.loads(capsys.readouterr().out) == info  # litert-torch's progress went to stderr
    assert (info["quantize"], info["prefill_length"], info["kv_cache_length"]) == ("fp16", PREFILL, KV)
    if not litert_here():
        return  # the logits: checked where LiteRT runs in this process (the module's run in .venv-tflite)
    ids = prompt(11, seed=11)
    got = TfliteCausalLM(tmp_path / "fp16", threads=1).prefill(ids)
    np.testing.assert_allclose(got, torch_logits(torch_model, ids), rtol=0, atol=0.05)


def test_workflow_config_refuses_a_prefill_longer_than_the_cache():
    from qwen_onnx.settings.options import check_config

    models = {"m": {"source": "embedded:x", "params_billion": 0.5}}
    check_config({"models": models, "tflite": {"prefill_length": 32, "kv_cache_length": 32}})
    with pytest.raises(OptionError, match=r"^tflite\.prefill_length 2048 is longer than kv_cache_length 1280"):
        check_config({"models": models, "tflite": {"prefill_length": 2048}})
    with pytest.raises(OptionError, match=r"^models\.m\.tflite\.prefill_length 64 is longer than kv_cache_length 32"):
        check_config({"models": {"m": {**models["m"], "tflite": {"kv_cache_length": 32}}}, "tflite": {"prefill_length": 64}})


# --- the workflow variant: budget, accuracy, latency, inspection, peers, report --------------------------------

#: The reference of the accuracy tests: windows of 24 tokens, 3 prefill chunks of PREFILL each.
WINDOW = 24


def test_the_skip_decision_is_the_memory_budget():
    from qwen_onnx.convert.tflite import conversion_rss_gib, tflite_skip_reason

    assert conversion_rss_gib(0.49) == pytest.approx(12.74, abs=0.01)
    assert tflite_skip_reason("qwen2.5-coder-0.5b", 0.49, {}) is None
    assert tflite_skip_reason("qwen2.5-coder-1.5b", 1.54) == (
        "qwen2.5-coder-1.5b tflite: skipped, litert-torch's conversion would need about 40 GiB (26 GiB per "
        "billion parameters, measured on the 0.5B), above tflite.max_rss_gib = 16")
    assert tflite_skip_reason("qwen2.5-coder-1.5b", 1.54, {"max_rss_gib": 41}) is None
    assert tflite_skip_reason("m", 0.49, {"max_rss_gib": 8}).endswith("about 13 GiB (26 GiB per billion parameters, "
                                                                      "measured on the 0.5B), above tflite.max_rss_gib = 8")
    assert tflite_skip_reason("m", 0.001, {"enabled": False}) == "m tflite: not built, tflite.enabled is false"


@pytest.fixture(scope="module")
def reference(tiny_qwen2, texts, tmp_path_factory):
    from qwen_onnx.measure.reference import write_reference

    folder = tmp_path_factory.mktemp("tflite-reference") / "reference"
    write_reference(tiny_qwen2, texts["evaluation"], folder, window=WINDOW, max_windows=2, generation_tokens=6, threads=1)
    return folder


@pytest.fixture(scope="module")
def accuracy(converted, reference, tmp_path_factory):
    """Both conversions' accuracy JSON against the reference, with the gates the workflow gives them."""
    from qwen_onnx.measure.accuracy import accuracy_from_reference
    from qwen_onnx.settings.gates import default_gate, folder_gate_kind

    out = {}
    for quantize, (folder, _) in converted.items():
        kind = folder_gate_kind(folder)
        path = tmp_path_factory.mktemp("tflite-accuracy") / "tflite.accuracy.json"
        out[quantize] = (path, accuracy_from_reference(folder, reference, threads=1, kv_decode_steps=4,
                                                       gate_limits=default_gate(kind), gate_kind=kind, output=path))
    return out


def test_fp32_tflite_accuracy_equals_the_reference(accuracy):
    """fp32 (``none``) against PyTorch's stored logits: measured ppl change 3e-6 %, max |Δlogit| 1e-5."""
    path, result = accuracy["none"]
    assert json.loads(path.read_text())["ppl"] == result["ppl"]
    assert result["tokens"] == 2 * (WINDOW - 1) and result["window"] == WINDOW
    assert abs(result["ppl"] - result["ppl_reference"]) / result["ppl_reference"] < 1e-3
    assert result["top1_pct"] == 100.0 and result["kl_mean"] < 1e-6
    assert result["max_abs_logit_diff"] < FP32_ATOL
    assert result["kv_cache_steps"] == 4 and result["kv_cache_max_abs_diff"] < FP32_ATOL
    assert result["kv_cache_top1_pct"] == 100.0
    assert result["generation_match_pct"] == 100.0 and result["generation_exact"] == len(result["generation"]) == 5
    assert result["padded_batch"] == "not applicable: LiteRT signatures are batch 1"
    assert not any(k.startswith("padded_batch_") for k in result)
    # the float gate's padded-batch limit is set aside, every other one applies and passes
    assert result["gate_kind"] == "float" and result["gate"] == "PASS", result["gate_failures"]
    assert result["gate_limits_not_applicable"] == {"padded_batch_max_abs_diff": 0.05}
    assert "padded_batch_max_abs_diff" not in result["gate_limits"] and result["gate_limits"]["top1_pct"] == 99.5
    assert result["runtime"] == "litert" and result["tflite_quantize"] == "none"


def test_int8_tflite_accuracy_is_close_and_gated_as_int8_dynamic(accuracy):
    _, result = accuracy["dynamic_int8"]
    assert result["gate_kind"] == "int8_dynamic" and set(result["gate_limits"]) == {"ppl_delta_pct", "top1_pct", "kl_mean"}
    assert 1e-3 < result["max_abs_logit_diff"] < 1.5 and result["kl_mean"] < 0.02
    assert abs(result["ppl_delta_pct"]) < 5 and result["top1_pct"] > 75
    assert result["kv_cache_max_abs_diff"] < 0.05  # int8 weights, but the same on both paths


def test_windows_longer_than_the_kv_cache_are_refused_in_one_line(converted, tiny_qwen2, texts, tmp_path):
    from qwen_onnx.measure.accuracy import accuracy_from_reference
    from qwen_onnx.measure.reference import write_reference

    write_reference(tiny_qwen2, texts["evaluation"], tmp_path / "long", window=KV + 8, max_windows=1,
                    generation_tokens=1, threads=1)
    with pytest.raises(OptionError, match=rf"windows of {KV + 8} tokens do not fit this tflite variant's KV cache "
                                          rf"of {KV} positions; convert it with tflite.kv_cache_length of at least "
                                          rf"{KV + 8}") as error:
        accuracy_from_reference(converted["none"][0], tmp_path / "long", threads=1, output=tmp_path / "a.json")
    assert "\n" not in str(error.value) and not (tmp_path / "a.json").exists()


def test_task_accuracy_runs_the_tflite_folder_and_skips_prompts_past_its_cache(converted, tiny_qwen2, tmp_path):
    """HumanEval's chat prompts on the tiny tokenizer (279 and 325 tokens) do not fit the 128 positions: each
    record says so (in .venv the stage runs in .venv-tflite and its result comes back)."""
    from qwen_onnx.measure.task_accuracy import task_accuracy

    result = task_accuracy(converted["none"][0], tiny_qwen2, problems=["HumanEval/53", "HumanEval/23"],
                           max_new_tokens=4, threads=1, output=tmp_path / "tflite.task.json")
    assert json.loads((tmp_path / "tflite.task.json").read_text()) == json.loads(json.dumps(result))
    assert [r["task_id"] for r in result["records"]] == ["HumanEval/53", "HumanEval/23"]
    assert [r["reason"] for r in result["records"]] == [
        f"the prompt of {r['prompt_tokens']} tokens leaves no room in the litert model's {KV} positions"
        for r in result["records"]]


@pytest.fixture(scope="module")
def latency(converted, texts):
    from qwen_onnx.measure.latency import measure_tflite_latency
    from qwen_onnx.settings.timing import TimingSettings

    return measure_tflite_latency(converted["dynamic_int8"][0], texts["evaluation"], TimingSettings(
        prompt_lengths=(4, 8, 16), decode_prompt_tokens=16, new_tokens=5, threads=1, warmup=0, repeats=2))


def test_tflite_latency_follows_the_protocol(latency, converted):
    assert_timed(latency, (4, 8, 16))
    assert latency["peak_rss_mib"] > 50 and latency["threads"] == 1 and latency["prompt_lengths"] == [4, 8, 16]
    # a 4-token prompt pays one full 8-token call, as an 8-token one does; 16 tokens two
    assert [latency[f"prefill_signature_calls_{n}"] for n in (4, 8, 16)] == [1, 1, 2]
    assert "fixed length of 8 tokens" in latency["prefill_note"]
    assert latency["profile"] is None and "LiteRT" in latency["profile_note"]
    size = (converted["dynamic_int8"][0] / TFLITE_FILE).stat().st_size
    assert latency["bytes_on_disk"] == size
    config = json.loads((converted["dynamic_int8"][0] / "config.json").read_text())
    vocab, hidden = config["vocab_size"], config["hidden_size"]
    # the int8 embedding table (untied) is read one row per token
    assert latency["weight_bytes_per_token"] == size - vocab * hidden + hidden
    assert "embedding table" in latency["weight_bytes_per_token_note"]
    assert latency["runtime"] == "litert" and latency["tflite_quantize"] == "dynamic_int8"


def test_tflite_latency_refuses_prompts_past_the_cache(converted, texts):
    from qwen_onnx.measure.latency import measure_tflite_latency
    from qwen_onnx.settings.timing import TimingSettings

    with pytest.raises(OptionError, match=rf"needs {KV + 1} positions .* KV cache of {KV}"):
        measure_tflite_latency(converted["none"][0], texts["evaluation"], TimingSettings(
            prompt_lengths=(8,), decode_prompt_tokens=KV - 4, new_tokens=5, threads=1))


def test_tflite_latency_takes_the_sittings_token_ids(converted, texts):
    """The sitting tokenizes once and hands each tflite measurement the ids (no tokenizer in the child);
    too few ids are refused with the count needed."""
    from qwen_onnx.errors import TextError
    from qwen_onnx.measure.latency import measure_tflite_latency
    from qwen_onnx.settings.timing import TimingSettings
    from qwen_onnx.source.text import load_tokenizer, prompt_tokens

    folder = converted["dynamic_int8"][0]
    tokens = prompt_tokens(load_tokenizer(folder), texts["evaluation"], 16)
    timing = TimingSettings(prompt_lengths=(4, 8, 16), decode_prompt_tokens=16, new_tokens=3, threads=1, warmup=0,
                            repeats=1)
    result = measure_tflite_latency(folder, None, timing, tokens=tokens)
    assert_timed(result, (4, 8, 16))
    with pytest.raises(TextError, match="^15 prompt tokens given; the protocol needs 16$"):
        measure_tflite_latency(folder, None, timing, tokens=tokens[:15])


def test_inspect_names_the_signatures_ops_and_quantized_weights(converted):
    from qwen_onnx.measure.inspect_tflite import inspect_tflite, inspect_tflite_markdown

    info = inspect_tflite(converted["dynamic_int8"][0])
    assert info["format"] == "tflite" and info["quantize"] == "dynamic_int8"
    assert info["signatures"] == converted["dynamic_int8"][1]["signatures"]
    assert set(info["subgraphs"]) == {f"prefill_{PREFILL}", "decode"}
    assert info["nodes"] == info["subgraphs"][f"prefill_{PREFILL}"]["nodes"] > 50
    assert info["op_types"]["FULLY_CONNECTED"] == 2 * 5 + 1 and info["op_types"]["EMBEDDING_LOOKUP"] == 1
    # every weight MatMul and the embedding table int8 (5 per layer: fused qkv, o, gate, up, down; lm_head; table)
    assert info["quant_ops"] == {"int8 weights": 2 * 5 + 2}
    config = json.loads((converted["dynamic_int8"][0] / "config.json").read_text())
    hidden, inner, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    kv = config["num_key_value_heads"] * hidden // config["num_attention_heads"]
    per_layer = hidden * (hidden + 2 * kv) + hidden * hidden + 3 * hidden * inner  # qkv, o, gate, up, down
    assert info["initializers"]["bytes_per_dtype"]["int8"] == 2 * per_layer + 2 * vocab * hidden  # one byte a weight
    assert info["embedding"]["dtype"] == "int8" and not info["embedding"]["shared"]
    assert info["bytes_on_disk"] == (converted["dynamic_int8"][0] / TFLITE_FILE).stat().st_size
    fp32 = inspect_tflite(converted["none"][0])
    assert fp32["quant_ops"] == {} and set(fp32["initializers"]["bytes_per_dtype"]) <= {"float32", "int32"}
    text = inspect_tflite_markdown(info)
    assert "## Signature `decode`" in text and "| input | `tokens` | int32 | [1, 1] | batch_size, sequence_length |" in text


def test_cli_inspect_reads_a_tflite_folder_as_the_workflow_does(converted, tmp_path):
    """`qwen-onnx inspect` on a tflite folder used to fail (it read model.onnx only) while the
    workflow's inspect read it; both now go through inspect_graph.inspect_variant."""
    from qwen_onnx.cli import main
    from qwen_onnx.measure.inspect_tflite import inspect_tflite

    folder = converted["dynamic_int8"][0]
    assert main(["inspect", str(folder), "--json", str(tmp_path / "i.json"), "--markdown", str(tmp_path / "i.md")]) == 0
    info = json.loads((tmp_path / "i.json").read_text())
    assert info == json.loads(json.dumps(inspect_tflite(folder)))
    assert info["format"] == "tflite" and info["quant_ops"] == {"int8 weights": 2 * 5 + 2}
    assert "## Signature `decode`" in (tmp_path / "i.md").read_text()


def test_peers_measure_the_tflite_variant(converted, tiny_qwen2, texts, tmp_path):
    from qwen_onnx.measure.peers import run_peers
    from qwen_onnx.settings.timing import TimingSettings

    timing = TimingSettings(rounds=1, prompt_lengths=(8,), decode_prompt_tokens=8, new_tokens=3, threads=1, warmup=0,
                            repeats=1)
    result = run_peers(tiny_qwen2, [], texts["evaluation"], timing, tflite_dir=converted["dynamic_int8"][0],
                       pytorch=False, llama_cpp=False, genai_builder=False, genai_builder_ort=False,
                       output=tmp_path / "peers.json", markdown=tmp_path / "peers.md")
    [row] = result["rows"]
    assert row["peer"] == "dynamic_int8" and row["skipped"] is None and row["rounds"] == 1
    assert row["runtime"] == "LiteRT interpreter (qwen-onnx TfliteCausalLM)"
    assert_timed(row, (8,))
    assert row["bytes_on_disk"] == (converted["dynamic_int8"][0] / TFLITE_FILE).stat().st_size
    assert "| dynamic_int8 | LiteRT interpreter" in (tmp_path / "peers.md").read_text()


def test_report_has_tflite_rows_and_a_line_per_skipped_model(accuracy, latency, converted, tmp_path):
    import csv

    from fake_reports import fake_reports

    from qwen_onnx.measure.inspect_tflite import inspect_tflite
    from qwen_onnx.report.build import build_report
    from qwen_onnx.store.artifacts import write_json

    files = {"inspect": [], "accuracy": [], "latency": [], "pytorch": []}
    for model in ("tiny", "big"):
        (tmp_path / model).mkdir()
        fake, machine = fake_reports(tmp_path / model, ["fp32"])
        for kind in files:
            files[kind] += fake[kind]
        if model == "tiny":  # the tflite variant of the small model only
            write_json(tmp_path / "tflite.inspect.json", inspect_tflite(converted["dynamic_int8"][0]))
            # the fake reports' prompt length only, as the workflow measures every variant at the same ones
            write_json(tmp_path / "tflite.latency.json",
                       {k: v for k, v in latency.items() if not k.startswith("prefill_ms_") or k.endswith("_8")})
            files["inspect"].append(tmp_path / "tflite.inspect.json")
            files["accuracy"].append(accuracy["dynamic_int8"][0])
            files["latency"].append(tmp_path / "tflite.latency.json")
    outputs = dict(markdown=tmp_path / "report.md", html_path=tmp_path / "report.html",
                   csv_path=tmp_path / "metrics.csv", json_path=tmp_path / "metrics.json",
                   plots={k: tmp_path / f"{k}.png" for k in ("ppl_vs_size", "decode_tok_s", "prefill_latency")})
    rows = build_report(["tiny", "big"], ["fp32", "tflite"], files, machine, prompt_lengths=(8,),
                        tflite={"tiny": {"params_billion": 0.001}, "big": {"params_billion": 1.54, "max_rss_gib": 16}},
                        **outputs)
    assert [(r["model"], r["variant"]) for r in rows] == [
        ("tiny", "pytorch"), ("tiny", "fp32"), ("tiny", "tflite"), ("big", "pytorch"), ("big", "fp32")]
    tflite = rows[2]
    assert tflite["padded_batch_max_abs_diff"] == "n/a" and tflite["top_op"] is None
    assert tflite["gate"] == accuracy["dynamic_int8"][1]["gate"] and tflite["decode_tok_s"] == latency["decode_tok_s"]
    assert tflite["roofline_pct"] > 0 and tflite["quant_ops"] == 2 * 5 + 2
    md = (tmp_path / "report.md").read_text()
    assert ("- big tflite: skipped, litert-torch's conversion would need about 40 GiB (26 GiB per billion "
            "parameters, measured on the 0.5B), above tflite.max_rss_gib = 16") in md
    accuracy_table = md.split("## Accuracy")[1].split("## Latency")[0]
    assert "| tiny | tflite |" in accuracy_table and "| n/a | n/a |" in accuracy_table
    assert "| tiny | tflite |" in md.split("## Graphs")[1] and "TFLite" in md.split("## Graphs")[1]
    with open(tmp_path / "metrics.csv", newline="") as f:
        assert [r["variant"] for r in csv.DictReader(f) if r["model"] == "tiny"] == ["pytorch", "fp32", "tflite"]
    assert "big tflite: skipped" in (tmp_path / "report.html").read_text()


@pytest.mark.skipif(not tflite_python().is_file(), reason=f"no TFLite environment ({tflite_python()}): envs/setup.sh "
                    "makes .venv-tflite")
def test_the_litert_tests_pass_inside_the_tflite_environment(converted):
    """In ``.venv`` this module skips its tests that run LiteRT in their own process (marked ``litert``): here they run
    in ``.venv-tflite``, on the folders this module converted in ``.venv`` (its other tests sent those conversions,
    and their LiteRT calls, to ``.venv-tflite``; the litert tests convert in their own process too)."""
    if litert_here(converter=True):
        pytest.skip("LiteRT imports here: this module runs every test in this process")
    root = converted["none"][0].parent
    done = subprocess.run([str(tflite_python()), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n0", "-m", "litert",
                           "tests/convert/test_tflite.py"], cwd=Path(__file__).resolve().parents[2], capture_output=True,
                          text=True, timeout=3600, env={**os.environ, CONVERTED_VARIABLE: str(root)})
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    # the seven litert tests (one of them thrice, parametrised), none skipped; the module's others deselected
    assert re.fullmatch(r"9 passed, \d+ deselected(, \d+ warnings?)? in .*", summary), summary
