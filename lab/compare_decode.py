"""A/B decode speed of several ONNX variants, decode loops and session settings, measured in turns."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any, Mapping, Sequence

import numpy as np

from lab.command import run_command
from qwen_onnx.measure.latency import median_decode_step
from qwen_onnx.measure.sitting import interleaved_rounds
from qwen_onnx.run.runtime import LOOPS, OnnxCausalLM
from qwen_onnx.run.session import resolve_settings
from qwen_onnx.settings.options import check_options
from qwen_onnx.source.text import EVALUATION_TEXT, prompt_tokens, shipped_text
from qwen_onnx.store.artifacts import model_path, write_json
from qwen_onnx.store.provenance import library_versions


def _decode_tok_s(variant_dir: str, prompt: np.ndarray, new_tokens: int, threads: int, provider: str,
                  loop: str = "bound", settings: Mapping[str, Any] | None = None) -> float:
    """One fresh session: one over :func:`median_decode_step`."""
    model = OnnxCausalLM(variant_dir, threads=threads, provider=provider, settings=settings)
    return 1.0 / median_decode_step(model, prompt, new_tokens, loop=loop)


def compare_decode(
    variant_dirs: Sequence[str | os.PathLike],
    text_path: str | os.PathLike,
    *,
    prompt_tokens_count: int = 128,
    new_tokens: int = 64,
    rounds: int = 5,
    threads: int = 2,
    provider: str = "CPUExecutionProvider",
    loops: Sequence[str] = ("bound",),
    settings: Mapping[str, Mapping[str, Any]] | None = None,
    output: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Decode speed of several ONNX variants measured in turns, for a fair A/B on a noisy machine.

    The contestants are every variant x decode loop (``loops``) x named session settings
    (``settings``: label -> overrides of :func:`qwen_onnx.run.session.session_options`; default one
    entry ``default`` with none), in that order.

    Each round measures every variant once, the order rotating by one each round, so a slow spell
    of a shared machine falls on all variants alike. Each measurement runs in a fresh process
    (``spawn``): one session, an untimed warm-up decode, then ``new_tokens`` greedy tokens with the
    KV cache after the same ``prompt_tokens_count``-token prompt. Sessions sharing one process are
    not comparable: there, the first session created decoded 12% slower than a second session of
    the same model (measured on Qwen2.5-Coder-0.5B, onnxruntime 1.32). A round's figure is one
    over the median step time; a variant's figure is the median of its rounds.

    Args:
        variant_dirs: ONNX variant folders; the first contestant is the baseline of ``ratio_to_first``.
        text_path: UTF-8 text whose first tokens are the prompt.
        rounds: timed rounds (at least 1).
        loops: decode loops, ``bound`` and/or ``unbound``.

    Returns:
        ``variants``: per contestant (in the order above) ``path``, ``loop``, ``settings_label``,
        ``session_settings`` (resolved), ``decode_tok_s`` (median of the rounds), ``rounds_tok_s``
        (one figure per round), ``ratio_to_first``; and the settings of the run.

    Raises:
        QwenOnnxError: no variant, fewer than one round or fewer than two new tokens, an unknown
            loop or session setting.
        ArtifactError: a variant folder without a model (raised from the measuring process).
    """
    from qwen_onnx.errors import QwenOnnxError
    from qwen_onnx.source.text import load_tokenizer

    if not variant_dirs:
        raise QwenOnnxError("no variant folder given; name at least one")
    check_options(prompt_tokens=prompt_tokens_count, new_tokens=new_tokens, rounds=rounds, threads=threads)
    settings = dict(settings) if settings else {"default": {}}
    try:
        resolved = {label: resolve_settings(overrides) for label, overrides in settings.items()}
    except ValueError as error:
        raise QwenOnnxError(str(error)) from error
    if not loops or any(loop not in LOOPS for loop in loops):
        raise QwenOnnxError(f"loops must be some of {LOOPS}, got {list(loops)}")
    contestants = [(os.fspath(d), loop, label) for d in variant_dirs for loop in loops for label in settings]
    for variant_dir in variant_dirs:  # every folder checked before anything is measured
        model_path(variant_dir)
    prompt = prompt_tokens(load_tokenizer(variant_dirs[0]), text_path, prompt_tokens_count)
    jobs = [(f"{path} ({loop} loop, {label})", _decode_tok_s, (path, prompt, new_tokens, threads, provider, loop, settings[label]))
            for path, loop, label in contestants]
    per_round = interleaved_rounds(jobs, rounds)
    medians = [statistics.median(v) for v in per_round]
    result = {
        "variants": [
            {"path": path, "loop": loop, "settings_label": label, "session_settings": resolved[label],
             "decode_tok_s": m, "rounds_tok_s": v, "ratio_to_first": m / medians[0]}
            for (path, loop, label), m, v in zip(contestants, medians, per_round)
        ],
        "prompt_tokens": prompt_tokens_count, "new_tokens": new_tokens, "rounds": rounds, "threads": threads,
        "provider": provider, "process_per_measurement": True, "library_versions": library_versions(),
    }
    if output is not None:
        write_json(output, result)
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="decode tokens/s of several variants measured in turns (A/B)")
    p.add_argument("variants", nargs="+", help="variant folders; the first is the baseline")
    p.add_argument("--text", default=str(shipped_text(EVALUATION_TEXT)))
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--loops", nargs="+", choices=["bound", "unbound"], default=["bound"],
                   help="decode loops to compare (every variant runs each)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("-o", "--output", default=None)
    return p


def run(a: argparse.Namespace) -> dict:
    """The command: :func:`compare_decode` of the given variants."""
    return compare_decode(a.variants, a.text, prompt_tokens_count=a.prompt_tokens, new_tokens=a.new_tokens,
                          rounds=a.rounds, threads=a.threads, loops=a.loops, output=a.output)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m lab.compare_decode --help`` from the repository root; 2 and one line on bad input."""
    return run_command("lab.compare_decode", build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
