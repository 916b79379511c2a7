"""Does a row's decode rate need all its timed tokens? Per measuring process, the rate over the first n timed decode
steps against the rate over all of them, with the sitting's own protocol.

    python -m lab.decode_tokens results/qwen2.5-coder-1.5b/hf results/qwen2.5-coder-1.5b/fp32 --rounds 3

A folder with ``model.onnx`` is timed as the sitting times an ONNX variant (:func:`qwen_onnx.measure.latency.measure_latency`,
the bound loop), a Hugging Face folder as its PyTorch row (:func:`qwen_onnx.measure.latency_torch.measure_torch_latency`):
a fresh process per measurement, the rows in interleaved rounds (:func:`qwen_onnx.measure.sitting.interleaved_rounds`),
``config.yaml``'s ``latency`` settings but for one prompt length (the prefills are not looked at). Each process's
timed decode steps are recorded by wrapping the protocol's ``generate``. The figure per process and ``n``: the rate
over the first ``n`` steps over the rate over all ``new_tokens - 1``. A row whose ratio stays within a few percent in
every process would give the same decode figure with fewer tokens; the spread between processes (rounds) is what the
rounds are for, which fewer tokens would not narrow (docs/timing.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence

import yaml

from qwen_onnx.measure.sitting import interleaved_rounds
from qwen_onnx.settings.timing import TimingSettings
from qwen_onnx.source.text import EVALUATION_TEXT, shipped_text

REPO = Path(__file__).resolve().parents[1]
#: Timed steps whose rate is compared with all of them.
PREFIXES = (16, 32)


def decode_steps(folder: str, text_path: str, timing: TimingSettings) -> dict[str, Any]:
    """One measurement in this process (the sitting's child): ``decode_tok_s`` as the sitting reports it and
    ``steps_s``, the seconds of each timed decode step (float, ``new_tokens - 1`` of them)."""
    from qwen_onnx.measure import latency, latency_torch

    recorded: list[list[float]] = []
    protocol = latency.timing_protocol

    def recording_protocol(prefill, generate, tokens, settings):
        def recording(prompt, count, steps):
            ttft = generate(prompt, count, steps)
            recorded.append(list(steps))
            return ttft
        return protocol(prefill, recording, tokens, settings)

    latency.timing_protocol = latency_torch.timing_protocol = recording_protocol
    if (Path(folder) / "model.onnx").is_file():
        result = latency.measure_latency(folder, text_path, timing)
    else:
        result = latency_torch.measure_torch_latency(folder, text_path, timing)
    return {"decode_tok_s": result["decode_tok_s"], "steps_s": recorded[-1]}  # the timed run is the last


def prefix_ratios(steps: Sequence[float], prefixes: Sequence[int] = PREFIXES) -> dict[int, float]:
    """``{n: rate over the first n steps / rate over all steps}`` (above 1: the first steps were faster)."""
    whole = len(steps) / sum(steps)
    return {n: (n / sum(steps[:n])) / whole for n in prefixes if n < len(steps)}


def compare(folders: Sequence[str], rounds: int, timing: TimingSettings, text_path: str) -> dict[str, Any]:
    """Every folder measured in ``rounds`` interleaved rounds; per folder its processes' decode rates and ratios."""
    loads: list = []
    results = interleaved_rounds([(f, decode_steps, (f, text_path, timing)) for f in folders], rounds, loads=loads)
    rows = []
    for folder, per_round, load in zip(folders, results, loads):
        ratios = [prefix_ratios(r["steps_s"]) for r in per_round]
        rows.append({"folder": folder, "decode_tok_s": [r["decode_tok_s"] for r in per_round],
                     "ratios": ratios, "busy": [x["busy"] for x in load],
                     "largest_deviation_pct": {n: 100 * max(abs(r[n] - 1) for r in ratios) for n in ratios[0]}})
    return {"rounds": rounds, "new_tokens": timing.new_tokens, "timing": timing.record(), "rows": rows}


def markdown(result: dict[str, Any]) -> str:
    """A table: per row, the median decode rate and, per prefix, the ratio of each process and the largest deviation."""
    prefixes = list(result["rows"][0]["largest_deviation_pct"])
    lines = ["| row | decode tok/s (median) | "
             + " | ".join(f"first {n} / all {result['new_tokens'] - 1}, per process | largest, %" for n in prefixes)
             + " | busy rounds |", "|---" * (3 + 2 * len(prefixes)) + "|"]
    for row in result["rows"]:
        cells = [f"{statistics.median(row['decode_tok_s']):.2f}"]
        for n in prefixes:
            cells += [", ".join(f"{r[n]:.3f}" for r in row["ratios"]), f"{row['largest_deviation_pct'][n]:.1f}"]
        lines.append(f"| {row['folder']} | " + " | ".join(cells) + f" | {sum(row['busy'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", help="ONNX variant folders (model.onnx) or Hugging Face folders (PyTorch)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--config", default=str(REPO / "config.yaml"))
    p.add_argument("--text", default=str(shipped_text(EVALUATION_TEXT)))
    p.add_argument("-o", "--output", default=None, help="write the figures as JSON here")
    a = p.parse_args(argv)
    latency = dict(yaml.safe_load(Path(a.config).read_text())["latency"])
    latency.update(prompt_lengths=[min(latency["prompt_lengths"])], profile=False)
    result = compare(a.folders, a.rounds, TimingSettings.from_config(latency), a.text)
    if a.output:
        Path(a.output).write_text(json.dumps(result, indent=1))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
