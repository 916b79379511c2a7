"""A llama.cpp-loadable GGUF of a tiny Qwen2 or Qwen3 checkpoint: the product's own writer
(:func:`qwen_onnx.convert.gguf_writer.write_gguf`, llama.cpp's names and token types), with what tests add:
a quantization mix, added tokens at the padding ids, and further hyperparameters.
"""

from __future__ import annotations

import json
from pathlib import Path


def write_tiny_gguf(hf_dir: Path, path: Path, quantized: dict[str, str] | None = None,
                    extra_tokens: dict[str, str] | None = None, extra_keys: dict[str, int] | None = None) -> Path:
    """Write the Qwen2 or Qwen3 checkpoint in ``hf_dir`` as a GGUF at ``path``; returns ``path``.

    Tensors are float32 except those named in ``quantized`` (GGUF name -> a type gguf-py can
    quantize: Q8_0, Q5_0, Q4_0, ...), as a llama.cpp quantization mix stores them. ``extra_tokens``
    (content -> ``CONTROL`` or ``USER_DEFINED``) take the ids after the tokenizer's own, which the
    checkpoint's ``vocab_size`` must leave free (padding rows, as Qwen's 151,936 rows do);
    ``extra_keys`` (``ARCH.``-less key -> integer) are written as further hyperparameters."""
    from qwen_onnx.convert.gguf_writer import write_gguf

    tokenizer = json.loads((hf_dir / "tokenizer.json").read_text())
    added = [{"id": t["id"], "content": t["content"], "type": "CONTROL" if t.get("special") else "USER_DEFINED"}
             for t in tokenizer.get("added_tokens", [])]
    next_id = len(tokenizer["model"]["vocab"]) + len([t for t in added if t["content"] not in tokenizer["model"]["vocab"]])
    for content, kind in (extra_tokens or {}).items():
        added.append({"id": next_id, "content": content, "type": kind})
        next_id += 1
    return write_gguf(hf_dir, path, tensor_types=quantized, added_tokens=added, extra_keys=extra_keys)
