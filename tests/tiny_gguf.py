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


#: Byte offsets of the fp16 scale fields in one block of the k-quant types gguf-py cannot quantize
#: (ggml-common.h's block_q4_K, block_q5_K, block_q6_K, block_q3_K, block_q2_K): their blocks are written here
#: from random bytes with those fields set to sane steps.
K_QUANT_FP16_FIELDS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q3_K": (108,), "Q2_K": (80, 82)}


def gguf_block_weight(type_name: str, k: int, n: int, seed: int = 0):
    """float32 [K, N]: a weight stored as GGUF blocks of ``type_name`` and dequantized by gguf-py, as ``resolve``
    reads a GGUF. Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 blocks are gguf-py's quantization of normal weights; the
    k-quants' blocks (:data:`K_QUANT_FP16_FIELDS`) are random bytes (every code, sub-block scale and minimum)
    with fp16 steps of 1e-3 to 3e-3. ``k`` must be a multiple of the type's block (256 for the k-quants)."""
    import gguf
    import numpy as np
    from gguf.constants import GGML_QUANT_SIZES

    rng = np.random.default_rng(seed)
    qtype = gguf.GGMLQuantizationType[type_name]
    block, size = GGML_QUANT_SIZES[qtype]
    if type_name in K_QUANT_FP16_FIELDS:
        raw = rng.integers(0, 256, (n, k // block, size), dtype=np.uint8)
        for at in K_QUANT_FP16_FIELDS[type_name]:
            steps = rng.uniform(1e-3, 3e-3, (n, k // block)).astype(np.float16)
            raw[..., at:at + 2] = steps[..., None].view(np.uint8)
        rows = gguf.quants.dequantize(raw.reshape(n, -1), qtype)
    else:
        weights = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
        rows = gguf.quants.dequantize(gguf.quants.quantize(weights, qtype), qtype)
    return np.ascontiguousarray(rows.astype(np.float32).T)
