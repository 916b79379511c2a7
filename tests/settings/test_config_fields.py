"""Config fields that change the computation (qwen_onnx.settings.qwen_config): every graph reproduces them,
checked against PyTorch where they matter (past the original context for RoPE scaling), or resolve
refuses the checkpoint in one line before any output."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tiny_models import build_tiny_qwen

from qwen_onnx.convert.export import export_onnx
from qwen_onnx.convert.optimize import optimize_variant
from qwen_onnx.errors import ArchitectureError
from qwen_onnx.measure.accuracy import load_torch_model, torch_logits
from qwen_onnx.measure.parity import kv_cache_parity
from qwen_onnx.run.runtime import OnnxCausalLM
from qwen_onnx.settings.qwen_config import context_length, layer_windows, rope_type
from qwen_onnx.source.resolve import resolve

ORIGINAL = 64  # max_position_embeddings of the scaled tiny models; the tests run 200 tokens


def _ids(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(5, 380, size=(1, n), dtype=np.int64)


@pytest.mark.parametrize("scaling", [
    {"type": "linear", "factor": 4},
    {"type": "yarn", "factor": 4, "original_max_position_embeddings": ORIGINAL},
    {"rope_type": "llama3", "factor": 4, "low_freq_factor": 1, "high_freq_factor": 4,
     "original_max_position_embeddings": ORIGINAL},
])
def test_static_rope_scaling_matches_pytorch_past_the_original_context(tmp_path, scaling):
    """The builder sized its rotary caches to max_position_embeddings: past 64 tokens the optimized
    graph failed with "cos_cache dimension 0 shall not be less than total_sequence_length". Its caches
    now come from transformers over factor x the original context; fp32 and optimized match PyTorch
    at 200 tokens, through the KV cache too."""
    build_tiny_qwen(tmp_path / "src", "qwen2", rope_scaling=scaling, max_position_embeddings=ORIGINAL)
    resolve(str(tmp_path / "src"), tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert context_length(config) == 4 * ORIGINAL and rope_type(config) == scaling.get("rope_type", scaling.get("type"))
    export_onnx(tmp_path / "hf", tmp_path / "fp32", opset=17)
    info = optimize_variant(tmp_path / "hf", tmp_path / "optimized")
    assert info["rotary_cache_positions"] == 4 * ORIGINAL
    genai = json.loads((tmp_path / "optimized" / "genai_config.json").read_text())
    assert genai["model"]["context_length"] == genai["search"]["max_length"] == 4 * ORIGINAL
    ids = _ids(200)
    reference = torch_logits(load_torch_model(tmp_path / "hf"), ids)
    for name in ("fp32", "optimized"):
        model = OnnxCausalLM(tmp_path / name)
        logits, _ = model.forward(ids)
        assert np.abs(logits - reference).max() < 1e-3, name
        assert (logits.argmax(-1) == reference.argmax(-1)).all(), name
        cached = kv_cache_parity(model, ids[0], decode_steps=150)  # prefill 50, decode to 200
        assert cached["kv_cache_max_abs_diff"] < 1e-3, (name, cached)


@pytest.mark.parametrize("scaling, word", [
    ({"type": "dynamic", "factor": 4}, "recomputes the rotary frequencies from each input's length"),
    ({"rope_type": "longrope", "factor": 4, "short_factor": [1.0] * 8, "long_factor": [4.0] * 8,
      "original_max_position_embeddings": ORIGINAL}, "switches between short and long rotary factors"),
])
def test_length_dependent_rope_scaling_is_refused_before_any_output(tmp_path, scaling, word):
    """dynamic NTK: fp32 scored perplexity +14.7%, KL 1.19, top-1 12.6% against PyTorch at 200
    tokens (a traced graph keeps one length's frequencies); now resolve refuses it in one line."""
    build_tiny_qwen(tmp_path / "src", "qwen2", rope_scaling=scaling, max_position_embeddings=ORIGINAL)
    kind = scaling.get("rope_type", scaling.get("type"))
    with pytest.raises(ArchitectureError) as error:
        resolve(str(tmp_path / "src"), tmp_path / "hf")
    message = str(error.value)
    assert f"rope_scaling type {kind!r} (factor 4) {word}" in message and "remove rope_scaling" in message
    assert "\n" not in message and not (tmp_path / "hf").exists()


def test_layer_windows_follow_layer_types():
    """Which layers transformers windows: from max_window_layers on, or as layer_types says; none
    without use_sliding_window (Qwen2.5's configs carry sliding_window 32768 switched off)."""
    base = {"model_type": "qwen2", "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4}
    assert layer_windows({**base, "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 3}) == [
        -1, -1, -1, 16]
    assert layer_windows({**base, "use_sliding_window": False, "sliding_window": 32768}) == [-1] * 4


@pytest.mark.parametrize("family", ["qwen3"])
def test_head_dim_wider_than_hidden_over_heads(tmp_path, family):
    """Qwen3 gives head_dim on its own (Qwen3-0.6B: 128 with hidden 1024 and 16 heads); 32 here with
    hidden 64 and 4 heads: fp32 and optimized match PyTorch."""
    hf = build_tiny_qwen(tmp_path / "hf", family, head_dim=32)
    export_onnx(hf, tmp_path / "fp32", opset=17)
    optimize_variant(hf, tmp_path / "optimized")
    ids = _ids(80, seed=2)
    reference = torch_logits(load_torch_model(hf), ids)
    for name in ("fp32", "optimized"):
        logits, _ = OnnxCausalLM(tmp_path / name).forward(ids)
        assert np.abs(logits - reference).max() < 1e-3, name
