"""The tflite variant (litert-torch): the folder, its signatures, logits and greedy tokens against PyTorch, bad input.

Tolerances were measured on the tiny random Qwen2 (hidden 64, logits of magnitude up to ~6) and
are set a few times above the measurement (TFLITE_NOTES.md).
"""

from __future__ import annotations

import importlib.metadata
import json

import numpy as np
import pytest
import torch

from qwen_onnx.artifacts import MANIFEST_FILE, verify_manifest
from qwen_onnx.errors import ArchitectureError, OptionError
from qwen_onnx.tflite import SIGNATURES_FILE, TFLITE_FILE, TfliteCausalLM, convert_tflite

PREFILL, KV = 8, 32
#: fp32 (quantize none) against transformers: max |logit difference| measured 1.1e-5.
FP32_ATOL = 1e-4


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


@pytest.fixture(scope="module")
def converted(tiny_qwen2, tmp_path_factory):
    """The tiny Qwen2 converted twice: fp32 (``none``) and ``dynamic_int8``."""
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
    assert info["litert_torch_version"] == importlib.metadata.version("litert-torch")


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


def test_fp32_greedy_tokens_equal_pytorchs(converted, torch_model):
    ids = prompt(6, seed=3)
    expected, sequence = [], list(ids)
    for _ in range(8):
        token = int(torch_logits(torch_model, sequence)[-1].argmax())
        expected.append(token)
        sequence.append(token)
    assert len(set(expected)) > 1  # not a degenerate repetition
    assert TfliteCausalLM(converted["none"][0], threads=2).generate(ids, max_new_tokens=8) == expected


def test_greedy_stops_when_the_cache_is_full(converted):
    lm = TfliteCausalLM(converted["none"][0], threads=1)
    new = lm.generate(prompt(KV - 3), max_new_tokens=10)
    assert len(new) == 4 and lm.position == KV  # one token from the prefill, three decoded at 29, 30, 31
    with pytest.raises(OptionError, match="outside the KV cache"):
        lm.decode(new[-1])


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
    ids = prompt(11, seed=11)
    got = TfliteCausalLM(tmp_path / "fp16", threads=1).prefill(ids)
    np.testing.assert_allclose(got, torch_logits(torch_model, ids), rtol=0, atol=0.05)


def test_workflow_config_refuses_a_prefill_longer_than_the_cache():
    from qwen_onnx.options import check_config

    models = {"m": {"source": "embedded:x", "params_billion": 0.5}}
    check_config({"models": models, "tflite": {"prefill_length": 32, "kv_cache_length": 32}})
    with pytest.raises(OptionError, match=r"^tflite\.prefill_length 2048 is longer than kv_cache_length 1280"):
        check_config({"models": models, "tflite": {"prefill_length": 2048}})
    with pytest.raises(OptionError, match=r"^models\.m\.tflite\.prefill_length 64 is longer than kv_cache_length 32"):
        check_config({"models": {"m": {**models["m"], "tflite": {"kv_cache_length": 32}}}, "tflite": {"prefill_length": 64}})
