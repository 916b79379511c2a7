"""A model card in every variant folder: huggingface_hub parses its metadata, and its body carries the run's
figures, the CPU they ran on and how to load the folder."""

from __future__ import annotations

import json
import os

from huggingface_hub import ModelCard

from qwen_onnx.report.model_card import card_metadata, write_model_cards

MACHINE = {"cpu_model": "AMD EPYC", "isa": "AVX-512 VNNI"}
ROW = {"model": "m", "variant": "int4", "gate": "PASS", "gate_failures": "", "ppl_delta_pct": 0.75,
       "kl_mean": 0.0141, "top1_pct": 92.9, "bytes_on_disk": 512_300_000, "weight_bytes_per_token": 410_600_000,
       "decode_tok_s": 66.94, "ttft_ms": 1041.2, "threads": 2, "accuracy_isa": "AVX-512 VNNI",
       "speed_isa": "AVX-512 VNNI", "timing_load": "idle"}


def _results(tmp_path, source):
    (tmp_path / "m" / "hf").mkdir(parents=True)
    (tmp_path / "m" / "hf" / "source.json").write_text(json.dumps(source))
    folder = tmp_path / "m" / "int4"
    folder.mkdir()
    (folder / "quantize.json").write_text(json.dumps({"settings": {"algorithm": "k_quant_int", "block_size": 32,
                                                                   "search": True}}))
    (folder / "genai_config.json").write_text("{}")
    os.utime(folder, (1_000_000, 1_000_000))
    return folder


def test_a_hub_source_gives_the_base_model_and_licence(tmp_path):
    folder = _results(tmp_path, {"source": "Qwen/Qwen2.5-0.5B-Instruct", "kind": "hub",
                                 "model_card": {"base_model": "Qwen/Qwen2.5-0.5B-Instruct", "license": "apache-2.0"}})
    (card,) = write_model_cards(tmp_path, [ROW, {**ROW, "variant": "pytorch"}], MACHINE)
    assert card == folder / "README.md" and folder.stat().st_mtime == 1_000_000  # the folder's time kept
    parsed = ModelCard.load(card)
    assert parsed.data.to_dict() == {
        "base_model": "Qwen/Qwen2.5-0.5B-Instruct", "base_model_relation": "quantized", "library_name": "onnxruntime",
        "license": "apache-2.0", "pipeline_tag": "text-generation",
        "tags": ["qwen-onnx", "onnx", "int4", "matmulnbits", "text-generation"]}
    text = parsed.text
    assert "| +0.75% | 0.0141 | 92.9% | PASS |" in text
    assert "512.3 MB on disk; 410.6 MB of weights read per decoded token." in text
    assert ("Decode 66.9 tokens/s, time to first token 1,041 ms, 2 threads on AMD EPYC (AVX-512 VNNI; timing idle)"
            in text)
    assert "`algorithm`: k_quant_int; `block_size`: 32; `search`: True" in text
    assert "og.Model(\".\")" in text and "The source states `apache-2.0`." in text
    # a time to first token under 10 ms keeps two significant figures (a tiny model's 0.34 ms is not "0 ms")
    (card,) = write_model_cards(tmp_path, [{**ROW, "ttft_ms": 0.3412}], MACHINE)
    assert "time to first token 0.34 ms," in ModelCard.load(card).text


def test_a_gguf_without_licence_or_base_model_says_so():
    source = {"source": "embedded:qwen2.5-coder-0.5b-instruct-q4_k_m", "kind": "parts",
              "model_card": {"gguf": {"name": "Qwen2.5 Coder 0.5B Instruct AWQ", "base_models": []}}}
    assert card_metadata("int4", source) == {"library_name": "onnxruntime", "pipeline_tag": "text-generation",
                                             "tags": ["qwen-onnx", "onnx", "int4", "matmulnbits", "text-generation"]}
    linked = {**source, "model_card": {"gguf": {"license": "apache-2.0", "base_models": [
        {"name": "Qwen2.5 Coder 0.5B Instruct", "repo_url": "https://huggingface.co/Qwen/Qwen2.5-Coder-0.5B-Instruct"}]}}}
    meta = card_metadata("tflite", linked)
    assert (meta["base_model"], meta["base_model_relation"], meta["library_name"], meta["license"]) == (
        "Qwen/Qwen2.5-Coder-0.5B-Instruct", "quantized", "litert", "apache-2.0")
    assert "base_model_relation" not in card_metadata("optimized", linked)  # the same weights, fused


def test_the_card_of_an_untimed_variant_without_a_licence(tmp_path):
    _results(tmp_path, {"source": "embedded:x", "kind": "parts", "model_card": {"gguf": {"name": "X GGUF"}}})
    (card,) = write_model_cards(tmp_path, [{**ROW, "decode_tok_s": None}], MACHINE)
    text = card.read_text()
    assert "made by qwen-onnx" in text and "from `embedded:x` (X GGUF)" in text
    assert "Not timed in this run (the report says why)." in text
    assert "The source states no licence: check the original model's before you redistribute this one." in text
