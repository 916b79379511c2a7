"""A/B of the timing protocol's warm-up scope on every row of a model's sitting: the same figures?"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from typing import Any, Sequence

from lab.command import run_command
from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.measure.peers import run_peers
from qwen_onnx.run.machine import isa_name
from qwen_onnx.settings.timing import WARMUP_SCOPES, TimingSettings
from qwen_onnx.source.text import EVALUATION_TEXT, shipped_text
from qwen_onnx.store.artifacts import write_json
from qwen_onnx.store.provenance import library_versions


def figure_keys(prompt_lengths: Sequence[int]) -> list[str]:
    """The sitting's speed figures compared: ``prefill_ms_{n}`` per prompt length, ``ttft_ms``, ``decode_tok_s``."""
    return [f"prefill_ms_{n}" for n in prompt_lengths] + ["ttft_ms", "decode_tok_s"]


def summarize(sittings: Sequence[dict[str, Any]], prompt_lengths: Sequence[int]) -> list[dict[str, Any]]:
    """Per row, per figure: the median over the sittings of each scope and their ratio ``row / length``.

    Args:
        sittings: ``{"scope", "seconds", "rows"}`` per sitting, ``rows`` as :func:`run_peers` returns them.

    Returns:
        One dict per row measured in every sitting: ``peer``, and per figure ``{figure}_row``,
        ``{figure}_length`` (medians) and ``{figure}_ratio`` (row over length).
    """
    peers = [r["peer"] for r in sittings[0]["rows"]]
    out = []
    for peer in peers:
        per_scope: dict[str, list[dict[str, Any]]] = {scope: [] for scope in WARMUP_SCOPES}
        for sitting in sittings:
            row = next((r for r in sitting["rows"] if r["peer"] == peer), None)
            if row is None or row.get("skipped"):
                break
            per_scope[sitting["scope"]].append(row)
        else:
            if not all(per_scope.values()):
                continue
            entry: dict[str, Any] = {"peer": peer}
            for key in figure_keys(prompt_lengths):
                medians = {scope: statistics.median(r[key] for r in rows) for scope, rows in per_scope.items()}
                entry.update({f"{key}_{scope}": m for scope, m in medians.items()})
                entry[f"{key}_ratio"] = medians["row"] / medians["length"]
            out.append(entry)
    return out


def compare_warmup_scopes(
    hf_dir: str | os.PathLike,
    variant_dirs: Sequence[str | os.PathLike],
    text_path: str | os.PathLike,
    timing: TimingSettings = TimingSettings(),
    *,
    alternations: int = 3,
    output: str | os.PathLike | None = None,
    **sitting: Any,
) -> dict[str, Any]:
    """The sitting (:func:`qwen_onnx.measure.peers.run_peers`, one round each) under each warm-up scope
    (:func:`qwen_onnx.measure.latency.timing_protocol`), alternated ``alternations`` times in the orders
    row-length, length-row, ... so that a drift of the machine falls on both alike.

    Args:
        timing: the sittings' settings; ``rounds`` and ``warmup_scope`` are set here (one round, each scope).
        sitting: :func:`run_peers`'s other arguments (``tflite_dir``, ``openvino_dirs``, ``work_dir``...).

    Returns:
        ``sittings`` (scope, wall ``seconds``, rows), ``rows`` (:func:`summarize`), ``seconds`` per
        scope (median wall time of one sitting round), the CPU's ISA and library versions.

    Raises:
        QwenOnnxError: fewer than one alternation.
    """
    if alternations < 1:
        raise QwenOnnxError(f"alternations must be at least 1, got {alternations}")
    sittings = []
    for k in range(alternations):
        for scope in WARMUP_SCOPES if k % 2 == 0 else WARMUP_SCOPES[::-1]:
            started = time.perf_counter()
            one = dataclasses.replace(timing, rounds=1, warmup_scope=scope)
            result = run_peers(hf_dir, variant_dirs, text_path, one, **sitting)
            sittings.append({"scope": scope, "seconds": time.perf_counter() - started, "rows": result["rows"],
                             "busy_rows": result["busy_rows"]})
    summary = {
        "rows": summarize(sittings, timing.prompt_lengths),
        "seconds": {scope: statistics.median(s["seconds"] for s in sittings if s["scope"] == scope)
                    for scope in WARMUP_SCOPES},
        "busy_rows": sorted({peer for s in sittings for peer in s["busy_rows"]}),
        "alternations": alternations, "isa": isa_name(), "library_versions": library_versions(),
        "sittings": sittings,
    }
    if output is not None:
        write_json(output, summary)
    return summary


def markdown(summary: dict[str, Any]) -> str:
    """One line per row: each figure's ratio row / length (1.00 = the same)."""
    keys = [k[: -len("_ratio")] for k in summary["rows"][0] if k.endswith("_ratio")] if summary["rows"] else []
    lines = ["| row | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for row in summary["rows"]:
        lines.append(f"| {row['peer']} | " + " | ".join(f"{row[k + '_ratio']:.3f}" for k in keys) + " |")
    seconds = summary["seconds"]
    lines.append(f"\nOne sitting round: row {seconds['row']:.0f} s, length {seconds['length']:.0f} s "
                 f"({summary['isa']}; rows beside other load: {', '.join(summary['busy_rows']) or 'none'}).")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="the sitting under each warm-up scope, alternated (A/B)")
    p.add_argument("hf_dir", help="the resolved Hugging Face folder (results/MODEL/hf)")
    p.add_argument("variants", nargs="*", help="our ONNX variant folders")
    p.add_argument("--text", default=str(shipped_text(EVALUATION_TEXT)))
    p.add_argument("--tflite", default=None, help="our tflite variant folder")
    p.add_argument("--openvino", nargs="*", default=[], help="variant folders also run by OpenVINO")
    p.add_argument("--openvino-ir", default=None, help="optimum-intel's INT4 IR folder (row openvino-int4)")
    p.add_argument("--work-dir", default=None, help="folder of the cached builder graph (WORK_DIR/genai-builder-int4)")
    p.add_argument("--alternations", type=int, default=3)
    p.add_argument("-o", "--output", default=None)
    return p


def run(a: argparse.Namespace) -> None:
    """The command: :func:`compare_warmup_scopes`, its table printed."""
    summary = compare_warmup_scopes(a.hf_dir, a.variants, a.text, alternations=a.alternations, output=a.output,
                                    tflite_dir=a.tflite, openvino_dirs=a.openvino, openvino_ir_dir=a.openvino_ir,
                                    work_dir=a.work_dir, genai_builder_ort=False)
    print(markdown(summary))


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m lab.warmup_scope --help`` from the repository root; 2 and one line on bad input."""
    return run_command("lab.warmup_scope", build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
