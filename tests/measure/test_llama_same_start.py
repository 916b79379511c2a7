"""The same-start llama.cpp peer: the hf folder written as a float32 GGUF and quantized by llama.cpp's own
quantizer (llama_model_quantize), scored on our windows and timed in the sitting; its rows compare quantizers,
the source GGUF's row compares runtimes."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

from qwen_onnx.measure.peers_table import compares, is_reference_peer, llama_cpp_recipe, standing_notes

HAVE_LLAMA = importlib.util.find_spec("llama_cpp") is not None
needs_llama = pytest.mark.skipif(not HAVE_LLAMA, reason="llama-cpp-python is not installed (envs/setup.sh --peers)")
WINDOW = 32


@pytest.fixture(scope="module")
def quantized(pipeline, tmp_path_factory):
    from qwen_onnx.convert.llama_quantize import llama_quantize

    root = tmp_path_factory.mktemp("llama-same-start")
    return {recipe: (root / f"llama.cpp-{recipe}", llama_quantize(pipeline["hf"], root / f"llama.cpp-{recipe}",
                                                                  recipe=recipe, threads=1))
            for recipe in ("q8_0", "q4_k_m")}


@pytest.fixture(scope="module")
def reference(pipeline, texts, tmp_path_factory):
    from qwen_onnx.measure.reference import write_reference

    folder = tmp_path_factory.mktemp("same-start-reference") / "reference"
    write_reference(pipeline["hf"], texts["evaluation"], folder, window=WINDOW, max_windows=2, generation_tokens=6,
                    threads=1)
    return folder


@needs_llama
def test_llama_cpp_quantizes_the_hf_folder_with_its_own_types(pipeline, quantized):
    """Q8_0 stores every 2-D weight at 34 bytes per 32; Q4_K_M falls back where a row is shorter than a
    k-quant block of 256 (the tiny model's 64 and 128): Q5_0 and, for its 6-bit picks, Q8_0, as llama.cpp
    logs. The bytes read per token count each weight at its type, the embedding as one row."""
    from safetensors.numpy import load_file

    weights = load_file(pipeline["hf"] / "model.safetensors")
    folder, record = quantized["q8_0"]
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", "model.gguf", "quantize.json"]
    assert (record["peer"], record["recipe"], record["imatrix"]) == ("llama.cpp-q8_0", "Q8_0", "none")
    two_d = [n for n, w in weights.items() if w.ndim == 2]
    assert record["weight_types"] == {n: "Q8_0" for n in two_d}
    expected = 0.0
    for name, w in weights.items():
        size = w.size * (34 / 32 if w.ndim == 2 else 4)
        expected += size / w.shape[0] if name == "model.embed_tokens.weight" else size
    assert record["decode_weight_bytes"] == round(expected)
    assert record["bytes"] == (folder / "model.gguf").stat().st_size
    _, k_quant = quantized["q4_k_m"]
    assert set(k_quant["weight_types"].values()) == {"Q5_0", "Q8_0"}
    assert k_quant["weight_types"]["model.layers.1.mlp.down_proj.weight"] == "Q8_0"  # Q6_K's fallback
    assert k_quant["decode_weight_bytes"] < record["decode_weight_bytes"]


@needs_llama
def test_the_same_start_row_is_scored_on_our_windows(quantized, reference, tmp_path):
    from qwen_onnx.measure.peer_accuracy import peer_accuracy
    from qwen_onnx.settings.gates import DEFAULT_GATES

    folder, record = quantized["q8_0"]
    result = peer_accuracy("llama.cpp-q8_0", reference, llama_cpp_dir=folder, threads=1,
                           gate_limits=DEFAULT_GATES["int4"], output=tmp_path / "llama.cpp-q8_0.accuracy.json")
    assert "skipped" not in result, result.get("skipped")
    assert (result["peer"], result["runtime"], result["recipe"], result["imatrix"]) == (
        "llama.cpp-q8_0", "llama.cpp", "Q8_0", "none")
    assert result["tokens"] == 2 * (WINDOW - 1) and result["gate_kind"] == "int4"
    assert 0 < result["kl_mean"] < 1e-2 and result["top1_pct"] >= 90.0  # 8-bit blocks of 32: KL 0.002 measured
    assert result["decode_weight_bytes"] == record["decode_weight_bytes"]
    k_folder, _ = quantized["q4_k_m"]
    k_quant = peer_accuracy("llama.cpp-q4_k_m", reference, llama_cpp_dir=k_folder, threads=1)
    assert result["kl_mean"] < k_quant["kl_mean"] and math.isfinite(k_quant["ppl"])
    missing = peer_accuracy("llama.cpp-q5_k_m", reference, llama_cpp_dir=tmp_path / "absent")
    assert missing["skipped"] == (f"no llama.cpp quantization at {tmp_path / 'absent'}: the llama_quantize stage "
                                  "wrote none")


@needs_llama
def test_the_sitting_times_a_same_start_row(pipeline, quantized, texts, tmp_path):
    from qwen_onnx.measure.peers import run_peers
    from qwen_onnx.settings.timing import TimingSettings

    folder, _ = quantized["q8_0"]
    timing = TimingSettings(rounds=1, prompt_lengths=[8], decode_prompt_tokens=8, new_tokens=4, threads=1)
    result = run_peers(pipeline["hf"], [pipeline["fp32"]], texts["evaluation"], timing, pytorch=False, llama_cpp=False,
                       genai_builder=False, genai_builder_ort=False, llama_cpp_dirs=[folder])
    rows = {r["peer"]: r for r in result["rows"]}
    assert list(rows) == ["fp32", "llama.cpp-q8_0"]
    row = rows["llama.cpp-q8_0"]
    assert row["skipped"] is None and row["decode_tok_s"] > 0 and row["runtime"] == "llama-cpp-python"
    assert (row["config"]["recipe"], row["config"]["imatrix"]) == ("Q8_0", "none")
    assert row["bytes_on_disk"] == (folder / "model.gguf").stat().st_size
    assert result["reference"] == "llama.cpp-q8_0"  # the only peer: the ratios divide by it
    assert rows["fp32"]["decode_tok_s_vs_peer"] == pytest.approx(rows["fp32"]["decode_tok_s"] / row["decode_tok_s"])


@needs_llama
def test_a_same_start_row_with_the_source_ggufs_tensor_types_takes_its_speed_untimed(pipeline, quantized, texts):
    from qwen_onnx.measure.peers import run_peers
    from qwen_onnx.measure.peers_llama_cpp import gguf_layout, same_kernels
    from qwen_onnx.measure.peers_table import peers_markdown
    from qwen_onnx.settings.timing import TimingSettings

    (q8, _), (q4, _) = quantized["q8_0"], quantized["q4_k_m"]
    source = q8 / "model.gguf"  # the source GGUF stands in for one whose layout llama.cpp's quantizer repeats
    layout = gguf_layout(source)
    assert layout["blk.0.ffn_down.weight"] == ("Q8_0", (128, 64))
    assert same_kernels(source, source) and not same_kernels(source, q4 / "model.gguf")
    timing = TimingSettings(rounds=2, prompt_lengths=[8], decode_prompt_tokens=8, new_tokens=4, threads=1)
    result = run_peers(pipeline["hf"], [], texts["evaluation"], timing, source=str(source), pytorch=False,
                       genai_builder=False, genai_builder_ort=False, llama_cpp_dirs=[q8, q4])
    rows = {r["peer"]: r for r in result["rows"]}
    assert list(rows) == ["llama.cpp", "llama.cpp-q8_0", "llama.cpp-q4_k_m"]
    twin, timed = rows["llama.cpp-q8_0"], rows["llama.cpp-q4_k_m"]
    assert twin["timed_as"] == "llama.cpp" and twin["skipped"] is None and twin["sitting_s"] == 0.0
    for figure in ("decode_tok_s", "prefill_ms_8", "ttft_ms", "peak_rss_mib", "rounds_decode_tok_s"):
        assert twin[figure] == rows["llama.cpp"][figure]
    assert twin["bytes_on_disk"] == source.stat().st_size and twin["config"]["recipe"] == "Q8_0"
    assert "timed_as" not in timed and len(timed["rounds_decode_tok_s"]) == 2 and timed["sitting_s"] > 0
    assert ("llama.cpp-q8_0: not timed; its GGUF holds as many tensors of each type and shape as llama.cpp's, so "
            "llama.cpp runs the same kernels over the same bytes: its speed and memory figures are llama.cpp's (its "
            "accuracy is its own).") in peers_markdown(result)


def test_the_kernel_mix_ignores_which_layer_holds_which_type():
    from qwen_onnx.measure.peers_llama_cpp import same_kernel_mix

    # the 0.5B's source Q4_K_M and llama.cpp's own Q4_K_M of its checkpoint: Q6_K down_proj in other layers
    source = {"blk.10.ffn_down.weight": ("Q6_K", (4864, 896)), "blk.11.ffn_down.weight": ("Q4_K", (4864, 896))}
    ours = {"blk.10.ffn_down.weight": ("Q4_K", (4864, 896)), "blk.11.ffn_down.weight": ("Q6_K", (4864, 896))}
    assert same_kernel_mix(source, ours)
    assert not same_kernel_mix(source, {**ours, "blk.11.ffn_down.weight": ("Q5_K", (4864, 896))})
    assert not same_kernel_mix(source, {"blk.10.ffn_down.weight": ("Q6_K", (4864, 896)),
                                        "blk.12.ffn_down.weight": ("Q4_K", (4864, 896))})


def test_each_peer_row_says_whether_it_compares_quantizers_or_runtimes():
    assert [compares(p) for p in ("llama.cpp", "llama.cpp-q4_k_m", "genai-builder-int4", "openvino-int4",
                                  "int4-openvino", "int4", "pytorch")] == [
        "runtime", "quantizer", "quantizer", "quantizer", "runtime", None, None]
    assert llama_cpp_recipe("llama.cpp-q5_k_m") == "q5_k_m" and llama_cpp_recipe("llama.cpp") is None
    assert is_reference_peer("llama.cpp-q4_k_m") and not is_reference_peer("int4-openvino")
    rows = [{"peer": "int4", "decode_tok_s": 30.0, "gate": "PASS", "kl_mean": 0.015},
            {"peer": "llama.cpp", "decode_tok_s": 35.0, "gate": "PASS", "kl_mean": 0.001},
            {"peer": "llama.cpp-q4_k_m", "decode_tok_s": 34.0, "gate": "PASS", "kl_mean": 0.005}]
    notes = standing_notes(rows)
    assert notes[1] == ("Both faster and more accurate (lower mean KL) than a variant of ours: llama.cpp (35.0 tokens/s, "
                        "KL 0.001; compares runtimes) over int4; llama.cpp-q4_k_m (34.0 tokens/s, KL 0.005; compares "
                        "quantizers) over int4.")
    assert notes[2] == ("Rows that compare quantizers (made from the hf folder our variants start from): "
                        "llama.cpp-q4_k_m; rows that compare runtimes (the source GGUF is the reference's own weights): "
                        "llama.cpp.")


def test_the_gguf_writer_round_trips_the_hf_folder(pipeline, tmp_path):
    """resolve reads the written GGUF back to the same weights and the same vocabulary, added tokens and chat
    template (the tiny tokenizer's pre-tokenizer is plain byte-level, the GGUF's Qwen2's: texts may split
    differently, the real Qwen tokenizers' do not)."""
    from safetensors.numpy import load_file

    from qwen_onnx.convert.gguf_writer import write_gguf
    from qwen_onnx.source.resolve import resolve
    from qwen_onnx.source.text import load_tokenizer

    path = write_gguf(pipeline["hf"], tmp_path / "m.gguf")
    resolve(str(path), tmp_path / "back")
    got, want = load_file(tmp_path / "back" / "model.safetensors"), load_file(pipeline["hf"] / "model.safetensors")
    assert sorted(got) == sorted(want) and all((got[n] == want[n]).all() for n in want)
    back, source = load_tokenizer(tmp_path / "back"), load_tokenizer(pipeline["hf"])
    assert back.get_vocab() == source.get_vocab() and back.chat_template == source.chat_template
    assert {i: str(t) for i, t in back.added_tokens_decoder.items()} == {
        i: str(t) for i, t in source.added_tokens_decoder.items()}
    assert json.loads((tmp_path / "back" / "config.json").read_text())["tie_word_embeddings"] is False
