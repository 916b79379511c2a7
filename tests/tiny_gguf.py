"""A llama.cpp-loadable GGUF of a tiny Qwen2 or Qwen3 checkpoint, written with the ``gguf`` package's writer.

The tensor and metadata names are llama.cpp's for the ``qwen2`` and ``qwen3`` architectures (the mapping of
llama.cpp's ``convert_hf_to_gguf.py``: q/k unpermuted, q/k/v biases in Qwen2, q/k RMSNorms and an own head
size, ``attention.key_length``, in Qwen3); the tokenizer is stored as llama.cpp's ``gpt2`` byte-level BPE
with the ``qwen2`` pre-tokenizer, added tokens typed as ``convert_hf_to_gguf.py`` types them (special:
CONTROL, else USER_DEFINED), padding ids UNUSED. Weights stay float32, so the file is exact, not a
quantized copy.
"""

from __future__ import annotations

import json
from pathlib import Path

_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}


def gguf_name(hf_name: str) -> str:
    """llama.cpp's tensor name for a Hugging Face Qwen2 tensor name."""
    if hf_name in _GLOBAL:
        return _GLOBAL[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)  # model.layers.{i}.{rest}
    return f"blk.{layer}.{_LAYER[rest]}"


def write_tiny_gguf(hf_dir: Path, path: Path, quantized: dict[str, str] | None = None,
                    extra_tokens: dict[str, str] | None = None, extra_keys: dict[str, int] | None = None) -> Path:
    """Write the Qwen2 or Qwen3 checkpoint in ``hf_dir`` as a GGUF at ``path``; returns ``path``.

    Tensors are float32 except those named in ``quantized`` (GGUF name -> a type gguf-py can
    quantize: Q8_0, Q5_0, Q4_0, ...), as a llama.cpp quantization mix stores them. ``extra_tokens``
    (content -> ``CONTROL`` or ``USER_DEFINED``) take the ids after the tokenizer's own, which the
    checkpoint's ``vocab_size`` must leave free (padding rows, as Qwen's 151,936 rows do);
    ``extra_keys`` (``ARCH.``-less key -> integer) are written as further hyperparameters."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    config = json.loads((hf_dir / "config.json").read_text())
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    vocab = dict(tok["model"]["vocab"])
    special = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    vocab.update(special)
    size = config["vocab_size"]
    kinds = {t: gguf.TokenType.CONTROL for t in special}
    for content, kind in (extra_tokens or {}).items():
        vocab[content] = len(vocab)
        kinds[content] = gguf.TokenType[kind]
    assert len(vocab) <= size, f"{len(vocab)} tokens do not fit vocab_size {size}"
    by_id = {i: t for t, i in vocab.items()}
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(size)]
    types = [kinds.get(t, gguf.TokenType.NORMAL if i in by_id else gguf.TokenType.UNUSED) for i, t in enumerate(tokens)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]

    arch = config["model_type"]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny-qwen2")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(float(config["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    if arch == "qwen3":
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    for key, value in (extra_keys or {}).items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_pad_token_id(config["pad_token_id"])
    writer.add_add_bos_token(False)
    template = json.loads((hf_dir / "tokenizer_config.json").read_text()).get("chat_template")
    if template is None and (hf_dir / "chat_template.jinja").is_file():
        template = (hf_dir / "chat_template.jinja").read_text()
    if template:
        writer.add_chat_template(template)
    for name, tensor in load_file(str(hf_dir / "model.safetensors")).items():
        data = np.ascontiguousarray(tensor, dtype=np.float32)
        qtype = (quantized or {}).get(gguf_name(name))
        if qtype is None:
            writer.add_tensor(gguf_name(name), data)
        else:
            kind = gguf.GGMLQuantizationType[qtype]
            writer.add_tensor(gguf_name(name), gguf.quants.quantize(data, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
