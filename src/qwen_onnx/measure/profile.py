"""The ``profile`` stage: onnxruntime's kernel time per op type on one variant, with the bytes a
decode step reads and the bytes on disk."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from qwen_onnx.measure.inspect_graph import decode_weight_bytes, load_graph
from qwen_onnx.measure.latency import prompt_tokens
from qwen_onnx.measure.profiling import profile_ops
from qwen_onnx.settings import defaults
from qwen_onnx.settings.options import check_options
from qwen_onnx.source.text import load_tokenizer
from qwen_onnx.store.artifacts import MODEL_FILE, folder_bytes, model_path, write_json
from qwen_onnx.store.provenance import library_versions


def profile_variant(
    variant_dir: str | os.PathLike,
    text_path: str | os.PathLike,
    *,
    decode_prompt_tokens: int = defaults.LATENCY["decode_prompt_tokens"],
    threads: int = defaults.LATENCY["threads"],
    provider: str = defaults.LATENCY["provider"],
    output: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """ONNX Runtime's time per op type on one variant (:func:`profile_ops`: one profiled session, a
    prefill of the text's first ``decode_prompt_tokens`` tokens and 16 decode steps), with the
    bytes a decode step reads (``weight_bytes_per_token``) and on disk (``bytes_on_disk``).

    Raises:
        ArtifactError: the model or its external data is missing.
        TextError: the text is shorter than ``decode_prompt_tokens`` tokens.
    """
    check_options(decode_prompt_tokens=decode_prompt_tokens, threads=threads)
    model_path(variant_dir)
    prompt = prompt_tokens(load_tokenizer(variant_dir), text_path, decode_prompt_tokens)
    result = {
        "variant_dir": os.fspath(variant_dir),
        "profile": profile_ops(variant_dir, prompt, threads, provider),
        "bytes_on_disk": folder_bytes(variant_dir),
        "weight_bytes_per_token": decode_weight_bytes(load_graph(Path(variant_dir) / MODEL_FILE)),
        "threads": threads,
        "provider": provider,
        "library_versions": library_versions(),
    }
    if output is not None:
        write_json(output, result)
    return result
