"""A resolved Hugging Face folder written as a float GGUF file: the start llama.cpp's own quantizer takes.

The tensor and metadata names are llama.cpp's for the ``qwen2`` and ``qwen3`` architectures, as its
``convert_hf_to_gguf.py`` writes them (``Qwen2Model``, ``Qwen3Model``: q/k unpermuted; q/k/v biases in
Qwen2; q/k RMSNorms and an own head size, ``attention.key_length``, in Qwen3; ``output.weight`` only when
the embeddings are not tied); the tokenizer as llama.cpp's ``gpt2`` byte-level BPE with the ``qwen2``
pre-tokenizer, each added token typed as ``convert_hf_to_gguf.py`` types it (special: CONTROL, else
USER_DEFINED), padding ids UNUSED, the chat template and the eos/pad ids. Written with gguf-py's
``GGUFWriter``; float32 tensors keep the weights exactly (``resolve`` reads such a file back to max |Δ| = 0).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from qwen_onnx.errors import ArchitectureError
from qwen_onnx.store.artifacts import require_hf_checkpoint

log = logging.getLogger(__name__)

#: Hugging Face name (after ``model.layers.{i}.``) -> llama.cpp's (after ``blk.{i}.``).
LAYER_TENSORS = {
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
#: The tensors outside the decoder layers.
GLOBAL_TENSORS = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                  "lm_head.weight": "output.weight"}


def gguf_tensor_name(hf_name: str) -> str:
    """llama.cpp's tensor name for a Hugging Face Qwen2/Qwen3 tensor name
    (``model.layers.3.mlp.up_proj.weight`` -> ``blk.3.ffn_up.weight``).

    Raises:
        ArchitectureError: a tensor a Qwen2/Qwen3 causal LM does not have.
    """
    if hf_name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[hf_name]
    parts = hf_name.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in LAYER_TENSORS:
        return f"blk.{parts[2]}.{LAYER_TENSORS[parts[3]]}"
    raise ArchitectureError(f"tensor {hf_name} has no llama.cpp name for qwen2/qwen3; the GGUF writer knows "
                            "the dense Qwen causal LMs only")


def token_table(hf_dir: Path, vocab_size: int,
                added: Sequence[Mapping[str, Any]] | None = None) -> tuple[list[str], list[int], list[str]]:
    """The GGUF token list, token types and merges of the tokenizer in ``hf_dir``.

    Args:
        hf_dir: a folder with ``tokenizer.json`` (a byte-level BPE).
        vocab_size: rows of the embedding table; ids without a token are ``[PAD{id}]``, typed UNUSED.
        added: added tokens ``{"id", "content", "type"}`` to write instead of ``tokenizer.json``'s
            (``type`` CONTROL or USER_DEFINED); default: ``tokenizer.json``'s, CONTROL when special.

    Returns:
        ``(tokens, types, merges)``: [vocab_size] strings, [vocab_size] ``gguf.TokenType`` values, and the
        merges as ``"a b"`` strings.

    Raises:
        ArchitectureError: the tokenizer holds more tokens than the embedding table has rows.
    """
    import gguf

    tokenizer = json.loads((hf_dir / "tokenizer.json").read_text(encoding="utf-8"))
    by_id = {int(i): t for t, i in tokenizer["model"]["vocab"].items()}
    types = {i: gguf.TokenType.NORMAL for i in by_id}
    if added is None:
        added = [{"id": t["id"], "content": t["content"], "type": "CONTROL" if t.get("special") else "USER_DEFINED"}
                 for t in tokenizer.get("added_tokens", [])]
    for token in added:
        by_id[int(token["id"])] = str(token["content"])
        types[int(token["id"])] = gguf.TokenType[str(token["type"])]
    if by_id and max(by_id) >= vocab_size:
        raise ArchitectureError(f"the tokenizer has token id {max(by_id)}, past the {vocab_size} rows of the "
                                "embedding table; the checkpoint and its tokenizer do not belong together")
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(vocab_size)]
    kinds = [int(types.get(i, gguf.TokenType.UNUSED)) for i in range(vocab_size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    return tokens, kinds, merges


def write_gguf(hf_dir: str | os.PathLike, path: str | os.PathLike, *,
               tensor_types: Mapping[str, str] | None = None,
               added_tokens: Sequence[Mapping[str, Any]] | None = None,
               extra_keys: Mapping[str, int] | None = None) -> Path:
    """Write the Qwen2/Qwen3 checkpoint of ``hf_dir`` as a GGUF file at ``path`` (module docstring).

    Args:
        hf_dir: a Hugging Face folder with one ``model.safetensors`` (the ``resolve`` stage's ``hf``).
        path: the ``.gguf`` file to write.
        tensor_types: llama.cpp tensor name -> a GGML type gguf-py quantizes (``Q8_0``, ``Q5_0``, ``Q4_0``...),
            for a quantization mix; every other tensor is float32 (default: all float32).
        added_tokens: the added tokens to write (:func:`token_table`); default: the tokenizer's own.
        extra_keys: further ``ARCH.``-less integer hyperparameters (for tests of readers' refusals).

    Returns:
        ``path``.

    Raises:
        ArtifactError: ``hf_dir`` is not a Hugging Face checkpoint.
        ArchitectureError: not a Qwen2/Qwen3 causal LM, or a tokenizer that does not fit the table.
    """
    import gguf
    import numpy as np
    from safetensors import safe_open

    hf_dir, path = require_hf_checkpoint(hf_dir), Path(path)
    config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    arch = config.get("model_type")
    if arch not in ("qwen2", "qwen3"):
        raise ArchitectureError(f"{hf_dir}: model_type {arch!r}; the GGUF writer knows qwen2 and qwen3")
    tokens, types, merges = token_table(hf_dir, int(config["vocab_size"]), added_tokens)
    generation = hf_dir / "generation_config.json"
    eos = json.loads(generation.read_text()).get("eos_token_id") if generation.is_file() else None
    eos = eos if eos is not None else config.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(hf_dir.parent.name if hf_dir.name == "hf" else hf_dir.name)
    writer.add_context_length(int(config["max_position_embeddings"]))
    writer.add_embedding_length(int(config["hidden_size"]))
    writer.add_block_count(int(config["num_hidden_layers"]))
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(int(config["num_attention_heads"]))
    writer.add_head_count_kv(int(config["num_key_value_heads"]))
    writer.add_rope_freq_base(float(config["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    head_dim = config.get("head_dim")
    if arch == "qwen3" or (head_dim and head_dim != config["hidden_size"] // config["num_attention_heads"]):
        writer.add_key_length(int(head_dim))
        writer.add_value_length(int(head_dim))
    scaling = config.get("rope_scaling") or {}
    kind = scaling.get("rope_type") or scaling.get("type")
    if kind and kind != "default":
        writer.add_rope_scaling_type(gguf.RopeScalingType(kind))
        writer.add_rope_scaling_factor(float(scaling["factor"]))
        if scaling.get("original_max_position_embeddings"):
            writer.add_rope_scaling_orig_ctx_len(int(scaling["original_max_position_embeddings"]))
    for key, value in (extra_keys or {}).items():
        writer.add_uint32(f"{arch}.{key}", int(value))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if not tensor_types else gguf.LlamaFileType.GUESSED)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    if eos is not None:
        writer.add_eos_token_id(int(eos))
    if config.get("pad_token_id") is not None:
        writer.add_pad_token_id(int(config["pad_token_id"]))
    writer.add_add_bos_token(False)
    tokenizer_config = json.loads((hf_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    template = tokenizer_config.get("chat_template")
    if template is None and (hf_dir / "chat_template.jinja").is_file():
        template = (hf_dir / "chat_template.jinja").read_text(encoding="utf-8")
    if template:
        writer.add_chat_template(template)
    weights = sorted(hf_dir.glob("*.safetensors"))
    for file in weights:
        with safe_open(str(file), framework="numpy") as f:
            for name in f.keys():
                data = np.ascontiguousarray(f.get_tensor(name), dtype=np.float32)
                target = gguf_tensor_name(name)
                qtype = (tensor_types or {}).get(target)
                if qtype is None:
                    writer.add_tensor(target, data)
                else:
                    kind = gguf.GGMLQuantizationType[qtype]
                    writer.add_tensor(target, gguf.quants.quantize(data, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    log.info("wrote %s (%s, %d tokens, %.1f MB)", path, arch, len(tokens), path.stat().st_size / 1e6)
    return path
