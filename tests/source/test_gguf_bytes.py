"""Bytes of weights llama.cpp reads per decoded token of a GGUF checkpoint, from its tensors' GGML types."""

from __future__ import annotations

import pytest

from qwen_onnx.source.gguf_file import bits_per_weight, gguf_decode_weight_bytes

SHAPES = {"model.embed_tokens.weight": (100, 64), "model.layers.0.mlp.down_proj.weight": (64, 256),
          "model.norm.weight": (64,), "lm_head.weight": (100, 64)}
TYPES = {"model.embed_tokens.weight": "Q8_0", "model.layers.0.mlp.down_proj.weight": "Q4_K", "lm_head.weight": "Q6_K"}


def test_bits_per_weight_are_gguf_pys_block_sizes():
    assert bits_per_weight("Q8_0") == 8.5  # 34 bytes per 32 weights
    assert bits_per_weight("Q4_K") == 4.5  # 144 bytes per 256
    assert bits_per_weight("Q6_K") == 6.5625  # 210 bytes per 256


def test_each_tensor_at_its_type_the_embedding_as_one_row():
    # Q8_0 row 64 x 8.5 / 8 = 68, Q4_K 64 x 256 x 4.5 / 8 = 9216, float32 norm 256, Q6_K 100 x 64 x 6.5625 / 8 = 5250
    assert gguf_decode_weight_bytes(SHAPES, TYPES) == 68 + 9216 + 256 + 5250


def test_a_tied_checkpoint_reads_the_whole_table_for_its_logits():
    tied = {k: v for k, v in SHAPES.items() if k != "lm_head.weight"}
    assert gguf_decode_weight_bytes(tied, TYPES) == 68 + 6800 + 9216 + 256  # the Q8_0 table: 100 x 64 x 8.5 / 8


def test_an_unknown_type_is_refused():
    with pytest.raises(KeyError):
        gguf_decode_weight_bytes(SHAPES, {**TYPES, "lm_head.weight": "Q9_9"})
