"""The peers' accuracy on our windows: llama.cpp on a GGUF, the builder's INT4 graph, and the reasons a
peer is skipped; the report's peer rows carry the figures."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from qwen_onnx.measure.peer_accuracy import peer_accuracy
from qwen_onnx.measure.peers_table import standing_notes
from qwen_onnx.measure.reference import write_reference
from qwen_onnx.report.peer_rows import peer_metric_rows, peer_tables
from qwen_onnx.settings.gates import DEFAULT_GATES

WINDOW = 32


@pytest.fixture(scope="module")
def reference(pipeline, texts, tmp_path_factory):
    folder = tmp_path_factory.mktemp("peer-reference") / "reference"
    write_reference(pipeline["hf"], texts["evaluation"], folder, window=WINDOW, max_windows=2, generation_tokens=6,
                    threads=1)
    return folder


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                    reason="llama-cpp-python is not installed (envs/setup.sh --peers installs it)")
def test_llama_cpp_scores_a_float32_gguf_like_pytorch(pipeline, reference, tmp_path):
    """The tiny Qwen2 written to GGUF in float32 is the same model: llama.cpp's logits on the reference's
    token ids match PyTorch's to float32 rounding (1e-5 here). Greedy generation follows PyTorch's but
    for near-ties of the random model's logits: one of the five prompts parts after 3 of 6 tokens; the largest |Δlogit| is 7.5e-3 at KL below 1e-6."""
    from tiny_gguf import write_tiny_gguf

    gguf = write_tiny_gguf(pipeline["hf"], tmp_path / "tiny-f32.gguf")
    result = peer_accuracy("llama.cpp", reference, source=str(gguf), threads=1, gate_limits=DEFAULT_GATES["int4"],
                           output=tmp_path / "llama.cpp.accuracy.json")
    assert "skipped" not in result, result.get("skipped")
    assert result["runtime"] == "llama.cpp" and result["tokens"] == 2 * (WINDOW - 1)
    assert result["kl_mean"] < 1e-6 and result["top1_pct"] == 100.0 and abs(result["ppl_delta_pct"]) < 0.01
    assert result["max_abs_logit_diff"] < 0.02 and result["kv_cache_max_abs_diff"] < 1e-3  # 7.5e-3 measured
    assert result["generation_match_pct"] >= 80.0
    assert result["padded_batch"].startswith("not applicable") and result["gate"] == "PASS"
    assert result["vocab_compared"] == json.loads((pipeline["hf"] / "config.json").read_text())["vocab_size"]
    assert json.loads((tmp_path / "llama.cpp.accuracy.json").read_text())["gate_kind"] == "int4"


def test_the_builders_graph_is_scored_on_the_same_windows(pipeline, reference, tmp_path):
    from qwen_onnx.convert.genai_builder import build_genai_int4

    if importlib.util.find_spec("onnxruntime_genai") is None:
        pytest.skip("onnxruntime-genai is not installed")
    build_genai_int4(pipeline["hf"], tmp_path / "genai")
    result = peer_accuracy("genai-builder-int4", reference, genai_dir=tmp_path / "genai", threads=1,
                           gate_limits=DEFAULT_GATES["int4"])
    assert result["tokens"] == 2 * (WINDOW - 1) and result["gate_kind"] == "int4"
    # 4-bit round-to-nearest moves the tiny model's logits, but not past recognition
    assert 0 < result["kl_mean"] < 0.5 and result["top1_pct"] >= 40 and np.isfinite(result["ppl"])  # 0.21, 50% here


def test_a_peer_that_cannot_run_is_recorded_with_the_reason(pipeline, reference, tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    missing = peer_accuracy("llama.cpp", reference, source=str(pipeline["hf"]), output=tmp_path / "a.json")
    assert (missing["peer"], missing["skipped"]) == ("llama.cpp", "llama-cpp-python is not installed; "
                                                                  "envs/setup.sh --peers installs it")
    assert "kl_mean" not in missing and missing["isa"]  # no figures, but the machine it was tried on
    assert json.loads((tmp_path / "a.json").read_text())["skipped"] == missing["skipped"]
    monkeypatch.setattr(importlib.util, "find_spec", real)
    if real("llama_cpp") is not None:  # a Hugging Face folder has no GGUF for llama.cpp
        assert peer_accuracy("llama.cpp", reference, source=str(pipeline["hf"]))["skipped"].startswith("no GGUF: ")
    (tmp_path / "failed").mkdir()
    (tmp_path / "failed" / "builder.json").write_text(json.dumps({"error": "builder failed: out of memory"}))
    failed = peer_accuracy("genai-builder-int4", reference, genai_dir=tmp_path / "failed")
    assert failed["skipped"] == "no builder graph: builder failed: out of memory"


def test_peer_rows_carry_the_peers_accuracy(tmp_path):
    reports = tmp_path / "m" / "reports"
    reports.mkdir(parents=True)
    rows = [{"peer": "pytorch", "decode_tok_s": 5.0, "ttft_ms": 100.0},
            {"peer": "llama.cpp", "decode_tok_s": 30.0, "ttft_ms": 50.0, "bytes_on_disk": 491_000_000},
            {"peer": "genai-builder-int4", "decode_tok_s": 40.0, "ttft_ms": 40.0},
            {"peer": "genai-builder-int4-ort", "decode_tok_s": 41.0, "ttft_ms": 40.0}]
    (reports / "peers.json").write_text(json.dumps({"rows": rows, "threads": 2}))
    (reports / "llama.cpp.accuracy.json").write_text(json.dumps(
        {"ppl_delta_pct": 1.9, "kl_mean": 0.031, "top1_pct": 91.0, "tokens": 1530, "gate": "PASS", "gate_failures": [],
         "gate_limits": {"top1_pct": 90}, "isa": "AVX2", "padded_batch": "not applicable: llama.cpp runs batch 1 here"}))
    (reports / "genai-builder-int4.accuracy.json").write_text(json.dumps(
        {"ppl_delta_pct": 5.1, "kl_mean": 0.05, "top1_pct": 83.4, "gate": "FAIL",
         "gate_failures": ["top1_pct 83.4 < 90"], "isa": "AVX2"}))
    by = {r["variant"]: r for r in peer_metric_rows(["m"], [reports / "peers.json"], [8])}
    assert (by["llama.cpp"]["kl_mean"], by["llama.cpp"]["top1_pct"], by["llama.cpp"]["gate"]) == (0.031, 91.0, "PASS")
    assert by["llama.cpp"]["eval_tokens"] == 1530 and by["llama.cpp"]["accuracy_isa"] == "AVX2"
    assert by["llama.cpp"]["padded_batch_max_abs_diff"] == "n/a"
    # the builder's graph in our runtime is the same graph: the same accuracy
    assert by["genai-builder-int4"]["gate"] == by["genai-builder-int4-ort"]["gate"] == "FAIL"
    assert by["genai-builder-int4-ort"]["gate_failures"] == "top1_pct 83.4 < 90"
    # the "Against peers" table: speed and accuracy side by side, ours from their report rows
    results = {"rounds": 3, "threads": 2, "new_tokens": 64, "decode_prompt_tokens": 128, "prompt_lengths": [8],
               "rows": [rows[0], {**rows[1], "config": {"version": "0.3.36"}}, *rows[2:],
                        {"peer": "int4", "decode_tok_s": 35.0, "ttft_ms": 60.0}]}
    (reports / "peers.json").write_text(json.dumps(results))
    ours = {"model": "m", "variant": "int4", "gate": "PASS", "ppl_delta_pct": 0.6, "kl_mean": 0.02, "top1_pct": 92.3}
    (table,) = peer_tables(["m"], [reports / "peers.json"], [ours, *by.values()])
    assert table["columns"][:7] == ["model", "peer", "runtime", "gate", "ppl_delta_pct", "kl_mean", "top1_pct"]
    cells = {r["peer"]: (r["gate"], r["kl_mean"], r["top1_pct"], r["decode_tok_s"]) for r in table["rows"]}
    assert cells["int4"] == ("PASS", 0.02, 92.3, 35.0) and cells["llama.cpp"] == ("PASS", 0.031, 91.0, 30.0)
    assert cells["genai-builder-int4"] == ("FAIL", 0.05, 83.4, 40.0) and cells["pytorch"] == (None, None, None, 5.0)
    assert table["notes"][-3:] == [
        "Our fastest variant that passes its gate, int4 (35.0 tokens/s), decodes 0.85× the fastest peer, "
        "genai-builder-int4-ort (FAIL), and 1.17× the fastest peer that passes, llama.cpp.",
        "No peer is both faster and more accurate (lower mean KL) than any variant of ours.",
        "Rows that compare quantizers (made from the hf folder our variants start from): genai-builder-int4, "
        "genai-builder-int4-ort; rows that compare runtimes (the source GGUF is the reference's own weights): "
        "llama.cpp."]


def test_standing_names_each_peer_faster_and_more_accurate_than_a_variant_of_ours():
    """The 0.5B's sitting on the Xeon AVX-512 VNNI + AMX (b56eecf, 2026-12-05), figures rounded."""
    rows = [{"peer": "pytorch", "decode_tok_s": 10.9, "kl_mean": 0.0, "weight_bytes_per_token": 1976e6},
            {"peer": "fp32", "decode_tok_s": 12.1, "gate": "PASS", "kl_mean": 2e-11},
            {"peer": "int4", "decode_tok_s": 39.3, "gate": "PASS", "kl_mean": 0.011, "weight_bytes_per_token": 477.2e6},
            {"peer": "tflite", "decode_tok_s": 13.6, "gate": "PASS", "kl_mean": 0.0038},
            {"peer": "int4-openvino", "decode_tok_s": 23.4, "gate": "PASS", "kl_mean": 0.0101},
            {"peer": "int8-dynamic-openvino", "decode_tok_s": 23.3, "gate": "PASS", "kl_mean": 0.00113},
            {"peer": "int8-mixed", "skipped": "not built"},
            {"peer": "llama.cpp", "decode_tok_s": 26.3, "gate": "PASS", "kl_mean": 0.0011,
             "weight_bytes_per_token": 375.3e6},
            {"peer": "genai-builder-int4", "decode_tok_s": 46.2, "gate": "FAIL", "kl_mean": 0.114,
             "weight_bytes_per_token": 317.4e6},
            {"peer": "openvino-int4", "decode_tok_s": 33.1, "gate": "FAIL", "kl_mean": 0.0989}]
    assert standing_notes(rows) == [
        "Our fastest variant that passes its gate, int4 (39.3 tokens/s), decodes 0.85× the fastest peer, "
        "genai-builder-int4 (FAIL), and 1.49× the fastest peer that passes, llama.cpp.",
        "Both faster and more accurate (lower mean KL) than a variant of ours: llama.cpp (26.3 tokens/s, KL 0.0011; "
        "compares runtimes) over tflite, int4-openvino, int8-dynamic-openvino.",
        "Rows that compare quantizers (made from the hf folder our variants start from): genai-builder-int4, "
        "openvino-int4; rows that compare runtimes (the source GGUF is the reference's own weights): llama.cpp.",
        "int4 reads 477 MB of weights per token: 1.27× llama.cpp's 375 MB, 1.50× genai-builder-int4's 317 MB."]
    # no variant of ours passes, or no peer was timed
    failing = [{**r, "gate": "FAIL"} if r["peer"] in ("fp32", "int4", "tflite") else r for r in rows[:4]]
    assert standing_notes([*failing, rows[-1]])[0] == "None of our timed variants passes its gate."
    assert standing_notes(rows[:6]) == []


def test_llama_cpp_reads_the_gguf_types_resolve_recorded(tmp_path):
    """llama.cpp's bytes per token: each weight at its GGUF type's bits (source.json's weight_types) over the
    checkpoint's shapes, the embedding as one row; an ONNX peer folder is counted as our graphs are."""
    from safetensors.numpy import save_file

    from qwen_onnx.report.peer_rows import peer_weight_bytes_per_token

    hf = tmp_path / "hf"
    hf.mkdir()
    save_file({"model.embed_tokens.weight": np.zeros((100, 64), np.float32),
               "model.layers.0.mlp.down_proj.weight": np.zeros((64, 256), np.float32),
               "model.norm.weight": np.zeros(64, np.float32), "lm_head.weight": np.zeros((100, 64), np.float32)},
              str(hf / "model.safetensors"))
    (hf / "source.json").write_text(json.dumps({"kind": "gguf", "weight_types": {
        "model.embed_tokens.weight": "Q8_0", "model.layers.0.mlp.down_proj.weight": "Q4_K", "lm_head.weight": "Q6_K"}}))
    # one Q8_0 row 64 x 8.5 bits + Q4_K 64 x 256 x 4.5 bits + the norm's 64 float32 + Q6_K 100 x 64 x 6.5625 bits
    assert peer_weight_bytes_per_token({"peer": "llama.cpp", "path": None}, hf) == 68 + 9216 + 256 + 5250
    (hf / "source.json").write_text(json.dumps({"kind": "hub"}))
    assert peer_weight_bytes_per_token({"peer": "llama.cpp", "path": None}, hf) is None
    assert peer_weight_bytes_per_token({"peer": "genai-builder-int4", "path": str(tmp_path / "gone")}, hf) is None


@pytest.mark.skipif(importlib.util.find_spec("openvino") is None,
                    reason="openvino is not installed (envs/setup.sh installs it, envs/requirements.txt)")
def test_our_variants_run_by_openvino_are_scored_on_their_own_gate(pipeline, reference, tmp_path):
    """fp32 by OpenVINO (f32 hint) is the same model as PyTorch's, padded batch included, and passes the float
    gate; int4 by OpenVINO is scored on the same windows against the int4 gate, without the padded batch
    (OpenVINO runs GroupQueryAttention graphs batch 1), with what OpenVINO reported."""
    fp32 = peer_accuracy("fp32-openvino", reference, variant_dir=pipeline["fp32"], threads=1,
                         gate_limits=DEFAULT_GATES["float"], output=tmp_path / "fp32-openvino.accuracy.json")
    assert (fp32["peer"], fp32["runtime"], fp32["gate_kind"]) == ("fp32-openvino", "openvino", "float")
    assert fp32["gate"] == "PASS"
    assert fp32["tokens"] == 2 * (WINDOW - 1) and fp32["kl_mean"] < 1e-6 and fp32["top1_pct"] == 100.0
    assert fp32["padded_batch_max_abs_diff"] < 1e-3 and fp32["kv_cache_max_abs_diff"] < 1e-3
    assert fp32["openvino"]["compiled"]["INFERENCE_PRECISION_HINT"] == "f32"
    assert json.loads((tmp_path / "fp32-openvino.accuracy.json").read_text())["gate"] == "PASS"
    int4 = peer_accuracy("int4-openvino", reference, variant_dir=pipeline["int4"], threads=1,
                         gate_limits=DEFAULT_GATES["int4"], output=tmp_path / "int4-openvino.accuracy.json")
    assert (int4["gate_kind"], int4["runtime"], int4["tokens"]) == ("int4", "openvino", 2 * (WINDOW - 1))
    assert int4["padded_batch"].startswith("not applicable: OpenVINO 2026.4 runs GroupQueryAttention graphs batch 1")
    assert "padded_batch_max_abs_diff" not in int4 and np.isfinite(int4["ppl"]) and int4["kv_cache_max_abs_diff"] < 1e-3
    assert "u4" in int4["openvino"]["layers_by_precision"]


def test_an_openvino_row_that_cannot_run_is_recorded_with_the_reason(pipeline, reference, tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else real(name, *a))
    missing = peer_accuracy("int4-openvino", reference, variant_dir=pipeline["int4"], output=tmp_path / "a.json")
    assert missing["skipped"] == "openvino is not installed; envs/setup.sh installs it (envs/requirements.txt)"
    monkeypatch.setattr(importlib.util, "find_spec", real)
    gone = peer_accuracy("int4-openvino", reference, variant_dir=tmp_path / "int4")
    assert gone["skipped"] == f"no ONNX variant folder at {tmp_path / 'int4'}: build the variant first"
    with pytest.raises(Exception, match="unknown peer 'int4-tensorrt'"):
        peer_accuracy("int4-tensorrt", reference)


def test_openvino_rows_read_their_own_accuracy(tmp_path):
    reports = tmp_path / "m" / "reports"
    reports.mkdir(parents=True)
    rows = [{"peer": "int4", "decode_tok_s": 30.0}, {"peer": "int4-openvino", "decode_tok_s": 25.0, "ttft_ms": 90.0},
            {"peer": "int8-dynamic-openvino", "skipped": "openvino not installed"}]
    (reports / "peers.json").write_text(json.dumps({"rows": rows, "threads": 2}))
    (reports / "int4-openvino.accuracy.json").write_text(json.dumps(
        {"ppl_delta_pct": 0.8, "kl_mean": 0.02, "top1_pct": 92.0, "gate": "PASS", "gate_failures": [],
         "gate_kind": "int4",
         "padded_batch": "not applicable: OpenVINO 2026.4 runs GroupQueryAttention graphs batch 1 only"}))
    (row,) = peer_metric_rows(["m"], [reports / "peers.json"], [8])
    assert (row["variant"], row["gate"], row["kl_mean"]) == ("int4-openvino", "PASS", 0.02)
    assert row["provider"] == "OpenVINO CPU plugin (f32 hint)"
    assert row["padded_batch_max_abs_diff"] == "n/a" and row["decode_tok_s"] == 25.0
