"""The ``profile`` stage: onnxruntime's kernel time per op type on one variant, with the bytes a
decode step reads and the bytes on disk.

ORT writes a Chrome-trace JSON when ``SessionOptions.enable_profiling`` is set
(https://onnxruntime.ai/docs/performance/tune-performance/profiling-tools.html). Each executed
node is an event with ``"cat": "Node"``, a name ending in ``_kernel_time``, ``dur`` in
microseconds and ``args.op_name``. Shares are of the summed kernel time (:func:`summarise_trace`).
"""

from __future__ import annotations

import collections
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from qwen_onnx.measure.inspect_graph import decode_weight_bytes, load_graph
from qwen_onnx.run.runtime import OnnxCausalLM
from qwen_onnx.settings.timing import TimingSettings
from qwen_onnx.source.text import load_token_encoder, prompt_tokens
from qwen_onnx.store.artifacts import MODEL_FILE, folder_bytes, model_path, write_json
from qwen_onnx.store.provenance import library_versions


def profile_variant(
    variant_dir: str | os.PathLike,
    text_path: str | os.PathLike,
    timing: TimingSettings = TimingSettings(),
    *,
    output: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """ONNX Runtime's time per op type on one variant (:func:`profile_ops`: one profiled session at
    ``timing.threads`` on ``timing.provider``, a prefill of the text's first ``timing.decode_prompt_tokens``
    tokens and 16 decode steps), with the bytes a decode step reads (``weight_bytes_per_token``) and on disk
    (``bytes_on_disk``). The other timing settings do not apply.

    Raises:
        ArtifactError: the model or its external data is missing.
        TextError: the text is shorter than ``decode_prompt_tokens`` tokens.
    """
    model_path(variant_dir)
    prompt = prompt_tokens(load_token_encoder(variant_dir), text_path, timing.decode_prompt_tokens)
    result = {
        "variant_dir": os.fspath(variant_dir),
        "profile": profile_ops(variant_dir, prompt, timing.threads, timing.provider),
        "bytes_on_disk": folder_bytes(variant_dir),
        "weight_bytes_per_token": decode_weight_bytes(load_graph(Path(variant_dir) / MODEL_FILE)),
        "threads": timing.threads,
        "provider": timing.provider,
        "library_versions": library_versions(),
    }
    if output is not None:
        write_json(output, result)
    return result


def summarise_trace(path: str | os.PathLike, top: int | None = None) -> dict[str, Any]:
    """Kernel time per op type from an ORT profile trace.

    Returns:
        ``total_ms`` (summed kernel time, ms), ``ops`` a list of ``{op_type, ms, pct, calls}``
        sorted by time, largest first (``top`` entries at most, the rest summed as ``other``).
    """
    with open(path, encoding="utf-8") as f:
        events = json.load(f)
    duration: dict[str, float] = collections.defaultdict(float)
    calls: dict[str, int] = collections.Counter()
    for event in events:
        if event.get("cat") != "Node" or not str(event.get("name", "")).endswith("_kernel_time"):
            continue
        op = event.get("args", {}).get("op_name", "unknown")
        duration[op] += float(event.get("dur", 0.0))
        calls[op] += 1
    total = sum(duration.values())
    ranked = sorted(duration.items(), key=lambda kv: kv[1], reverse=True)
    ops = [
        {"op_type": op, "ms": us / 1000.0, "pct": 100.0 * us / total if total else 0.0, "calls": calls[op]}
        for op, us in ranked
    ]
    if top is not None and len(ops) > top:
        rest = ops[top:]
        ops = ops[:top] + [{
            "op_type": "other",
            "ms": sum(o["ms"] for o in rest),
            "pct": sum(o["pct"] for o in rest),
            "calls": sum(o["calls"] for o in rest),
        }]
    return {"total_ms": total / 1000.0, "ops": ops}


def profile_ops(variant_dir, prompt: np.ndarray, threads: int, provider: str, decode_steps: int = 16,
                loop: str = "bound", settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Per-op-type share of ONNX Runtime kernel time over one prefill and ``decode_steps`` decode steps."""
    with tempfile.TemporaryDirectory(prefix="qwen-onnx-profile-") as scratch:
        model = OnnxCausalLM(variant_dir, threads=threads, provider=provider,
                             profile_prefix=str(Path(scratch) / "ort"), settings=settings)
        model.greedy(prompt, decode_steps + 1, loop=loop)
        trace = model.session.end_profiling()
        summary = summarise_trace(trace, top=12)
        del model
    summary.update({"prompt_tokens": int(prompt.shape[0]), "decode_steps": decode_steps})
    return summary

