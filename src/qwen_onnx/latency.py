"""Latency of an ONNX variant on the CPU: load, prefill (time to first token) and KV-cache decode.

Protocol: one session with a fixed intra-op thread count; ``warmup`` untimed runs, then
``repeats`` timed runs of a greedy generation of ``new_tokens`` tokens from a prompt of
``prompt_tokens`` tokens of the evaluation text. Decode tokens/s counts the single-token steps
after the prefill (``new_tokens - 1`` steps); figures are medians over the repeats.
"""

from __future__ import annotations

import logging
import os
import resource
import statistics
import time

from .artifacts import folder_bytes, library_versions, write_json
from .runtime import OnnxCausalLM
from .text import token_windows

log = logging.getLogger(__name__)


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (``getrusage``; Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def measure_latency(
    variant_dir: str | os.PathLike,
    text_path: str | os.PathLike,
    *,
    prompt_tokens: int = 128,
    new_tokens: int = 64,
    threads: int | None = 2,
    provider: str = "CPUExecutionProvider",
    warmup: int = 1,
    repeats: int = 3,
    output: str | os.PathLike | None = None,
) -> dict:
    """Time a variant's load, prefill and decode.

    Args:
        variant_dir: ONNX variant folder.
        text_path: text whose first ``prompt_tokens`` tokens form the prompt (needs a tokenizer in
            ``variant_dir``).
        prompt_tokens: prompt length in tokens.
        new_tokens: tokens generated per run (at least 2).
        threads: intra-op threads.
        provider: ONNX Runtime execution provider.
        warmup: untimed runs before measuring.
        repeats: timed runs.
        output: JSON file to write, if given.

    Returns:
        ``load_s`` (s), ``prefill_ms`` and ``ttft_ms`` (ms, median), ``decode_tok_s`` (tokens/s,
        median), ``decode_ms_per_token``, ``peak_rss_mb`` (MiB), ``bytes_on_disk``, and the
        settings.

    Raises:
        ValueError: ``new_tokens`` < 2 or ``repeats`` < 1.
    """
    from transformers import AutoTokenizer

    if new_tokens < 2 or repeats < 1:
        raise ValueError(f"need new_tokens >= 2 and repeats >= 1, got {new_tokens} and {repeats}")
    tokenizer = AutoTokenizer.from_pretrained(variant_dir)
    prompt = token_windows(tokenizer, text_path, prompt_tokens, 1)
    model = OnnxCausalLM(variant_dir, threads=threads, provider=provider)
    for _ in range(warmup):
        model.greedy(prompt, new_tokens)
    prefills, rates, per_token = [], [], []
    for _ in range(repeats):
        steps: list[float] = []
        started = time.perf_counter()
        _, prefill = model.greedy(prompt, new_tokens, timings=steps)
        total = time.perf_counter() - started
        prefills.append(prefill)
        rates.append(len(steps) / sum(steps))
        per_token.append(1000.0 * sum(steps) / len(steps))
        log.info("run: prefill %.1f ms, decode %.2f tokens/s, total %.2f s", 1000 * prefill, rates[-1], total)
    result = {
        "load_s": round(model.load_seconds, 3),
        "prefill_ms": 1000.0 * statistics.median(prefills),
        "ttft_ms": 1000.0 * statistics.median(prefills),
        "decode_tok_s": statistics.median(rates),
        "decode_ms_per_token": statistics.median(per_token),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "bytes_on_disk": folder_bytes(variant_dir),
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "threads": threads,
        "provider": provider,
        "repeats": repeats,
        "library_versions": library_versions(),
    }
    if output is not None:
        write_json(output, result)
    return result
