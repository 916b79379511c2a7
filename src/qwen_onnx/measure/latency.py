"""Latency of an ONNX variant or of PyTorch eager fp32 on the CPU: load, prefill, TTFT, decode, memory.

Protocol (the same for every variant and for PyTorch, at the same thread count):

- load: creating the ONNX Runtime session (or ``from_pretrained`` for PyTorch), seconds;
- prefill: one forward pass over a prompt of each length in ``prompt_lengths`` tokens (taken from
  the evaluation text), ``warmup`` untimed then ``repeats`` timed passes; median and p90 in ms;
- time to first token (TTFT): a prefill of ``decode_prompt_tokens`` tokens plus the argmax of its
  last logits, median ms;
- decode: ``new_tokens`` greedy tokens with the KV cache after that prefill (end-of-sequence ids
  ignored so every run decodes the same count); tokens/s over the single-token steps, median of
  ``repeats`` runs, after ``warmup`` untimed runs of :data:`DECODE_WARMUP_TOKENS` tokens each (a
  warm-up primes the session's allocations and the caches; its length does not need to match the
  timed runs', and a full-length one cost a quarter of the decode measurement). The
  ONNX decode loop is the IO-bound one by default (``loop="bound"``,
  :class:`qwen_onnx.run.runtime.BoundDecoder`: no per-step allocation or copy of the KV cache); the
  result records ``decode_loop`` and the resolved ``session_settings``;
- peak RSS of the measuring process (``getrusage``), MiB;
- ONNX Runtime profiling (ONNX variants): a separate profiled session runs one prefill and 16
  decode steps; kernel time is summed per op type (:mod:`qwen_onnx.measure.profile`).

The settings (``prompt_lengths``, ``warmup``, ``repeats``, ``threads``...) are one
:class:`qwen_onnx.settings.timing.TimingSettings`, the config's ``latency`` section.

A tflite variant (:func:`measure_tflite_latency`) runs the same protocol with the LiteRT
interpreter; its fixed-length prefill signature makes short prompts cost a full prefill call, and
it has no op profile.

The memory-bandwidth roofline of decode uses ``weight_bytes_per_token``: the bytes of weights read
to decode one token (every initializer, with the embedding table and the rotary tables counted as one
row each, since a decode step reads one row of them: :func:`~qwen_onnx.measure.inspect_graph.decode_weight_bytes`).
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from qwen_onnx.errors import OptionError, TextError
from qwen_onnx.measure.inspect_graph import decode_weight_bytes, load_graph
from qwen_onnx.measure.inspect_tflite import tflite_weight_bytes_per_token
from qwen_onnx.measure.peers_table import sitting_figures
from qwen_onnx.measure.profile import profile_ops
from qwen_onnx.run.machine import peak_rss_mib  # noqa: F401 (re-exported: peers and the tests read it here)
from qwen_onnx.run.runtime import LOOPS, OnnxCausalLM
from qwen_onnx.run.session import resolve_settings
from qwen_onnx.run.tflite import TfliteCausalLM, read_tflite_info
from qwen_onnx.run.tflite_env import call_with_litert, litert_here
from qwen_onnx.settings.timing import TimingSettings
from qwen_onnx.source.text import load_token_encoder, prompt_tokens
from qwen_onnx.store.artifacts import (
    MODEL_FILE,
    folder_bytes,
    model_path,
    write_json,
)
from qwen_onnx.store.provenance import library_versions, package_version

log = logging.getLogger(__name__)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation (numpy's default)."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


#: Greedy tokens of each untimed decode warm-up run (at most ``new_tokens``).
DECODE_WARMUP_TOKENS = 16


def _time(fn: Callable[[], Any], warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
    return out


def timing_protocol(
    prefill: Callable[[np.ndarray], Any],
    generate: Callable[[np.ndarray, int, list[float]], float],
    tokens: np.ndarray,
    timing: TimingSettings,
) -> dict[str, Any]:
    """The timing protocol every runtime is measured with (ONNX, PyTorch, LiteRT, the peers), by ``timing``'s
    prompt lengths, decode prompt, new tokens, warm-up and repeats (``threads`` is the runtime's own).

    ``warmup_scope`` ``length`` (the default): each prompt length is prefilled ``warmup`` times
    unmeasured, then ``repeats`` times timed with ``time.perf_counter``; the decode prompt (the first
    ``decode_prompt_tokens`` of ``tokens``) is generated ``warmup`` times unmeasured (at most
    :data:`DECODE_WARMUP_TOKENS` tokens), then ``repeats`` times for ``new_tokens`` tokens. ``row``: the
    untimed decode runs first and is the row's only warm-up, so each length's first pass is the timed
    one. ``row`` shortens a round but times the 512-token prefill slower: a runtime's first pass at a new
    shape pays for it, so ``length`` stays the protocol (docs/timing.md, ``python -m lab.warmup_scope``).

    Args:
        prefill: runs one prefill of token ids int64 [length].
        generate: ``generate(prompt, count, steps)`` generates ``count`` tokens greedily after
            ``prompt``, appends each decode step's seconds to ``steps`` and returns the time to first
            token in seconds (prefill plus the first argmax).
        tokens: token ids int64 [n], at least the longest prompt.
        timing: the protocol's settings.

    Returns:
        ``prefill_ms_p50_{length}``, ``prefill_ms_p90_{length}`` (ms, over the timed prefills),
        ``ttft_ms``, ``ttft_ms_p90`` (ms), ``decode_tok_s`` (the median over the repeats of decode
        steps per second), ``decode_ms_per_token`` (its inverse, ms).
    """
    prompt = tokens[:timing.decode_prompt_tokens]

    def warm_decode():
        for _ in range(timing.warmup):
            generate(prompt, min(timing.new_tokens, DECODE_WARMUP_TOKENS), [])

    if timing.warmup_scope == "row":
        warm_decode()
    result: dict[str, Any] = {}
    for length in timing.prompt_lengths:
        times = _time(lambda: prefill(tokens[:length]), timing.warmup if timing.warmup_scope == "length" else 0,
                      timing.repeats)
        result[f"prefill_ms_p50_{length}"] = 1000.0 * statistics.median(times)
        result[f"prefill_ms_p90_{length}"] = 1000.0 * percentile(times, 90)
    if timing.warmup_scope == "length":
        warm_decode()
    ttfts, rates = [], []
    for _ in range(timing.repeats):
        steps: list[float] = []
        ttfts.append(generate(prompt, timing.new_tokens, steps))
        rates.append(len(steps) / sum(steps))
    result.update({
        "ttft_ms": 1000.0 * statistics.median(ttfts),
        "ttft_ms_p90": 1000.0 * percentile(ttfts, 90),
        "decode_tok_s": statistics.median(rates),
        "decode_ms_per_token": 1000.0 / statistics.median(rates),
    })
    return result


def sitting_measurement(
    prefill: Callable[[np.ndarray], Any],
    generate: Callable[[np.ndarray, int, list[float]], float],
    tokens: np.ndarray,
    timing: TimingSettings,
    load_s: float,
) -> dict[str, Any]:
    """One row's figures in a child of the timing sitting (:mod:`qwen_onnx.measure.peers`): a runtime's
    ``prefill`` and ``generate`` timed by :func:`timing_protocol` on ``tokens`` (int64 [n]) with ``timing``,
    with its ``load_s`` (seconds), as the sitting keeps them (:func:`qwen_onnx.measure.peers_table.sitting_figures`)."""
    result = timing_protocol(prefill, generate, tokens, timing)
    result["load_s"] = load_s
    return sitting_figures(result, timing.prompt_lengths)


def measure_latency(
    variant_dir: str | os.PathLike,
    text_path: str | os.PathLike,
    timing: TimingSettings = TimingSettings(),
    *,
    loop: str = "bound",
    settings: Mapping[str, Any] | None = None,
    output: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Time an ONNX variant (see the module docstring for the protocol).

    ``timing`` gives the protocol, the session's ``threads`` and ``provider``, and whether to ``profile``;
    ``loop`` is the decode loop (``bound`` or ``unbound``, :meth:`OnnxCausalLM.greedy`);
    ``settings`` override the session settings (:func:`qwen_onnx.run.session.session_options`).

    Returns:
        ``load_s``; ``prefill_ms_p50_{n}`` / ``prefill_ms_p90_{n}`` per prompt length; ``ttft_ms``;
        ``decode_tok_s``; ``peak_rss_mib``; ``bytes_on_disk``; ``weight_bytes_per_token``;
        ``profile`` (per-op-type kernel time, when ``profile``); ``decode_loop``;
        ``session_settings``; the settings and versions.

    Raises:
        ValueError: an unknown ``loop`` or session setting, or a text too short for the prompts.
        ArtifactError: the model or its external data is missing.
    """
    model_path(variant_dir)  # a missing folder is named here, not taken for a hub ID by the tokenizer
    tokens = prompt_tokens(load_token_encoder(variant_dir), text_path, timing.longest_prompt)
    result = measure_latency_of_tokens(variant_dir, tokens, timing, loop=loop, settings=settings)
    if output is not None:
        write_json(output, result)
    return result


def measure_latency_of_tokens(
    variant_dir: str | os.PathLike,
    tokens: np.ndarray,
    timing: TimingSettings = TimingSettings(),
    *,
    loop: str = "bound",
    settings: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """:func:`measure_latency` on prompt ids already tokenized: int64 [tokens], at least the longest
    prompt length and ``decode_prompt_tokens`` long (the sitting stage's children take this path, so
    none of them loads a tokenizer).

    Raises:
        ValueError: ``tokens`` shorter than a prompt, an unknown ``loop`` or session setting.
        ArtifactError: the model or its external data is missing.
    """
    if loop not in LOOPS:
        raise ValueError(f"loop must be one of {LOOPS}, got {loop!r}")
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if tokens.shape[0] < timing.longest_prompt:
        raise ValueError(f"{tokens.shape[0]} prompt tokens given, the protocol needs {timing.longest_prompt}")
    resolved = resolve_settings(settings)
    model = OnnxCausalLM(variant_dir, threads=timing.threads, provider=timing.provider, settings=settings)

    def generate(prompt, count, steps):
        return model.greedy(prompt, count, timings=steps, loop=loop)[1]  # noqa: F821 (deleted after its last use)

    result: dict[str, Any] = {"variant_dir": os.fspath(variant_dir), "runtime": "onnxruntime", "provider": timing.provider,
                              "decode_loop": loop, "session_settings": resolved,
                              "kv_share_buffer": model.decoder.share_buffer if loop == "bound" else False,
                              "load_s": model.load_seconds}
    result.update(timing_protocol(lambda ids: model.forward(ids.reshape(1, -1)), generate, tokens, timing))  # noqa: F821 (deleted after its last use)
    del model
    if timing.profile:
        result["profile"] = profile_ops(variant_dir, tokens[:timing.decode_prompt_tokens], timing.threads,
                                        timing.provider, loop=loop, settings=settings)
    result.update({
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "bytes_on_disk": folder_bytes(variant_dir),
        "weight_bytes_per_token": decode_weight_bytes(load_graph(Path(variant_dir) / MODEL_FILE)),
        **timing.record(),
        "library_versions": library_versions(),
    })
    log.info("load %.2f s, TTFT %.1f ms, decode %.2f tokens/s", result["load_s"], result["ttft_ms"], result["decode_tok_s"])
    return result


#: Why a tflite variant's latency JSON has no op profile.
TFLITE_PROFILE_NOTE = ("no op profile: ONNX Runtime's profiler does not apply to the LiteRT interpreter, and its "
                       "own op profiler is not exposed by ai-edge-litert's Python interpreter")


def measure_tflite_latency(
    variant_dir: str | os.PathLike,
    text_path: str | os.PathLike | None,
    timing: TimingSettings = TimingSettings(),
    *,
    tokens: np.ndarray | None = None,
    output: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Time a tflite variant (:mod:`qwen_onnx.convert.tflite`) with the LiteRT interpreter, by the module's protocol.

    The same prompts and :func:`timing_protocol` as :func:`measure_latency`, run by
    :class:`qwen_onnx.run.tflite.TfliteCausalLM` at ``timing.threads`` (the interpreter's ``num_threads``;
    ``timing.provider`` and ``timing.profile`` do not apply).
    The prefill signature has a fixed length L (``prefill_length``): a prompt of n tokens costs
    ceil(n / L) calls of L tokens each, so a prompt shorter than L pays for L
    (``prefill_signature_calls_{n}`` records the count per prompt length). Decode feeds the KV
    cache back through the ``decode`` signature, one token per call.

    Args:
        text_path: the prompts' text, tokenized here; or None with ``tokens``.
        timing: the protocol's settings.
        tokens: the prompts' token ids, int64 [n] (the sitting tokenizes once for every row,
            instead of each measuring process loading transformers' tokenizer, about 4 s).

    Returns:
        The keys of :func:`measure_latency` (``load_s``: the interpreter's creation with the
        manifest check, s; ``prefill_ms_p50_{n}``/``prefill_ms_p90_{n}``, ``ttft_ms`` (ms),
        ``decode_tok_s``, ``peak_rss_mib`` (MiB), ``bytes_on_disk`` (``model.tflite``, bytes),
        ``weight_bytes_per_token`` (bytes, :func:`qwen_onnx.measure.inspect_tflite.tflite_weight_bytes_per_token`,
        with ``weight_bytes_per_token_note``)); ``runtime`` ``litert``, ``provider``,
        ``profile`` None with ``profile_note``; ``prefill_length``, ``kv_cache_length``,
        ``tflite_quantize``, ``prefill_signature_calls_{n}`` and ``prefill_note``.

    Raises:
        OptionError: prompts (longest prompt length; ``decode_prompt_tokens + new_tokens``) longer than the
            model's KV cache (the message names both).
        ArtifactError: the folder has no ``model.tflite`` or ``tflite.json``.
        TextError: a text too short for the prompts.
        ExportError: ai-edge-litert is not installed here and there is no TFLite environment.
    """
    if not litert_here():  # first: locals() is the arguments
        return call_with_litert(measure_tflite_latency, kwargs=locals())  # the whole measurement in .venv-tflite
    info = read_tflite_info(variant_dir)
    length, cache = int(info["prefill_length"]), int(info["kv_cache_length"])
    lengths, decode_prompt, new_tokens = timing.prompt_lengths, timing.decode_prompt_tokens, timing.new_tokens
    needed = max(max(lengths), decode_prompt + new_tokens)
    if needed > cache:
        raise OptionError(f"the latency protocol needs {needed} positions (prompt lengths up to {max(lengths)}, "
                          f"decode {decode_prompt} + {new_tokens} tokens), more than this tflite variant's KV "
                          f"cache of {cache}; convert it with tflite.kv_cache_length of at least {needed} or "
                          "shorten the prompts")
    longest = timing.longest_prompt
    if tokens is None:
        tokens = prompt_tokens(load_token_encoder(variant_dir), text_path, longest)
    elif len(tokens) < longest:
        raise TextError(f"{len(tokens)} prompt tokens given; the protocol needs {longest}")
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    started = time.perf_counter()
    lm = TfliteCausalLM(variant_dir, threads=timing.threads)
    load_s = time.perf_counter() - started

    def generate(prompt, count, steps):
        begin = time.perf_counter()
        token = int(np.argmax(lm.prefill(prompt)[-1]))  # noqa: F821 (deleted after its last use)
        ttft = time.perf_counter() - begin
        for _ in range(count - 1):
            step = time.perf_counter()
            token = int(np.argmax(lm.decode(token)))  # noqa: F821 (deleted after its last use)
            steps.append(time.perf_counter() - step)
        return ttft

    result: dict[str, Any] = {"variant_dir": os.fspath(variant_dir), "runtime": "litert",
                              "provider": "LiteRT interpreter (CPU)", "load_s": load_s}
    result.update(timing_protocol(lm.prefill, generate, tokens, timing))
    del lm
    weight_bytes, weight_note = tflite_weight_bytes_per_token(variant_dir)
    calls = {n: -(-n // length) for n in lengths}
    result.update({
        "profile": None,
        "profile_note": TFLITE_PROFILE_NOTE,
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "bytes_on_disk": (Path(variant_dir) / info["tflite_file"]).stat().st_size,
        "weight_bytes_per_token": weight_bytes,
        "weight_bytes_per_token_note": weight_note,
        "prefill_length": length,
        "kv_cache_length": cache,
        "tflite_quantize": info["quantize"],
        **{f"prefill_signature_calls_{n}": c for n, c in calls.items()},
        "prefill_note": (f"the prefill signature has a fixed length of {length} tokens: a prompt of n tokens costs "
                         f"ceil(n / {length}) calls of {length} tokens, so a prompt shorter than {length} pays for "
                         f"{length} (calls per prompt length: {', '.join(f'{n}: {c}' for n, c in calls.items())})"),
        **timing.record(),
        "library_versions": {**library_versions(), "ai-edge-litert": package_version("ai-edge-litert"),
                             "litert-torch": info.get("litert_torch_version")},
    })
    log.info("tflite: load %.2f s, TTFT %.1f ms, decode %.2f tokens/s", result["load_s"], result["ttft_ms"],
             result["decode_tok_s"])
    if output is not None:
        write_json(output, result)
    return result


def median_decode_step(
    model: OnnxCausalLM, prompt: np.ndarray, new_tokens: int, warmup_tokens: int = 8, loop: str = "bound"
) -> float:
    """Median seconds of one KV-cache decode step: an untimed greedy decode of ``warmup_tokens``,
    then a timed one of ``new_tokens`` (``new_tokens - 1`` single-token steps) after ``prompt``
    (int64 [prompt]), both with the decode ``loop`` (``bound`` or ``unbound``)."""
    model.greedy(prompt, warmup_tokens, loop=loop)
    steps: list[float] = []
    model.greedy(prompt, new_tokens, timings=steps, loop=loop)
    return statistics.median(steps)


