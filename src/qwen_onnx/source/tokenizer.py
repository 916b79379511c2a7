"""The resolved folder's tokenizer and generation config: a GGUF's own tokens restored on the tokenizer
transformers builds, the added-token table, and the end-of-sequence ids generation stops at."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from qwen_onnx.errors import SourceError
from qwen_onnx.source.gguf_file import GgufTokenizer
from qwen_onnx.store.artifacts import write_json
from qwen_onnx.store.provenance import library_versions

log = logging.getLogger(__name__)


def restore_gguf_tokens(tokenizer: Any, gguf: GgufTokenizer, name: str) -> None:
    """Give a tokenizer read from a GGUF the file's own added tokens and token roles, in place.

    transformers' converter registers only ``<|endoftext|>``, ``<|im_start|>`` and ``<|im_end|>`` as
    whole tokens and names ``<|endoftext|>`` the end-of-sequence token whatever the file says: a
    Qwen2.5-Coder GGUF then splits ``<|fim_prefix|>`` into 7 ids and ``<tool_call>`` into 4. Here every
    CONTROL token becomes a special added token and every USER_DEFINED one a non-special added token
    (llama.cpp's ``convert_hf_to_gguf.py`` writes them from the Hugging Face added tokens that way), each
    at the id the GGUF gives it, and ``eos``/``pad``/``unk`` (and ``bos`` when the file adds it) are the
    file's (``tokenizer.ggml.*_token_id``).

    Raises:
        SourceError: an added token does not land on the id the GGUF gives it (a vocabulary that does
            not hold it there).
    """
    from tokenizers import AddedToken

    tokenizer.add_tokens([AddedToken(content, special=(kind == "CONTROL"), normalized=False)
                          for _, content, kind in gguf.added])
    wrong = [f"{content} -> {tokenizer.convert_tokens_to_ids(content)} (GGUF: {token_id})"
             for token_id, content, _ in gguf.added if tokenizer.convert_tokens_to_ids(content) != token_id]
    if wrong:
        raise SourceError(f"{name}: the tokenizer read from the GGUF puts its added tokens at other ids than the "
                          f"file ({', '.join(wrong[:3])}); the GGUF's token list is inconsistent, convert it again")
    vocab = tokenizer.convert_ids_to_tokens
    tokenizer.eos_token = vocab(gguf.roles["eos"]) if "eos" in gguf.roles else tokenizer.eos_token
    tokenizer.pad_token = vocab(gguf.roles["pad"]) if "pad" in gguf.roles else None
    tokenizer.unk_token = vocab(gguf.roles["unk"]) if "unk" in gguf.roles else None
    tokenizer.bos_token = vocab(gguf.roles["bos"]) if gguf.add_bos and "bos" in gguf.roles else None


def added_token_table(tokenizer: Any) -> list[dict[str, Any]]:
    """Every added token of ``tokenizer`` as ``{"id", "content", "type"}``, in id order.

    ``type`` is GGUF's: ``CONTROL`` for a special token, ``USER_DEFINED`` for another added token
    (:data:`qwen_onnx.source.gguf_file.KEPT_TOKEN_TYPES`). Recorded by ``resolve`` in ``source.json``, read by
    the accuracy stage's tokenizer check (:mod:`qwen_onnx.measure.tokens`).
    """
    return [{"id": int(i), "content": str(t), "type": "CONTROL" if t.special else "USER_DEFINED"}
            for i, t in sorted(tokenizer.added_tokens_decoder.items())]


def eos_token_ids(folder: str | os.PathLike) -> list[int]:
    """Every end-of-sequence id in ``generation_config.json`` (a list or a single id), else ``config.json``'s."""
    for name in ("generation_config.json", "config.json"):
        path = Path(folder) / name
        if path.is_file():
            value = json.loads(path.read_text()).get("eos_token_id")
            if value is not None:
                return [int(v) for v in (value if isinstance(value, list) else [value])]
    return []


def complete_generation_config(folder: str | os.PathLike, tokenizer_eos: int | None = None) -> list[int]:
    """Give ``folder/generation_config.json`` the end-of-sequence ids the evaluation uses.

    A checkpoint whose ``generation_config.json`` is ``{}`` (or lacks ``eos_token_id``) makes
    ``generate`` (transformers, optimum's ``ORTModelForCausalLM``) run past the end of the answer.
    The ids written are :func:`eos_token_ids` of the folder (generation config,
    else ``config.json``), else the tokenizer's EOS id; every variant folder copies this file.

    Returns:
        The EOS ids now in the generation config (empty when none is known anywhere).
    """
    path = Path(folder) / "generation_config.json"
    settings = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    ids = eos_token_ids(folder) or ([int(tokenizer_eos)] if tokenizer_eos is not None else [])
    if ids and settings.get("eos_token_id") is None:
        settings["eos_token_id"] = ids if len(ids) > 1 else ids[0]
        settings.setdefault("transformers_version", library_versions().get("transformers"))
        log.info("generation_config.json had no eos_token_id: set to %s", settings["eos_token_id"])
        write_json(path, settings)
    return ids
