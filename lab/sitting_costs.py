"""Where a sitting's time goes, row by row, and how far one round strays from the median of three.

    python -m lab.sitting_costs results/qwen2.5-coder-0.5b/reports/peers.json results/qwen2.5-coder-1.5b/reports/peers.json

Reads finished sittings (``peers.json``) only: nothing is measured. Per timed row: its sitting time (all rounds,
process start-up included), and per measuring process the load (``load_s``), the prefills (each prompt length
once untimed, once timed: twice the medians), the decode (the 16-token warm-up and the timed tokens at the
median rate), the time to first token, and the rest (process start-up, imports, the second of idle watching
before each process). Then the largest deviation of a single round from the median of the rounds, per figure:
what a row timed in one round instead of three would risk.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from qwen_onnx.measure.latency import DECODE_WARMUP_TOKENS


def process_split(row: Mapping[str, Any], prompt_lengths: Sequence[int], new_tokens: int) -> dict[str, float]:
    """Seconds of one measuring process of ``row``, split as the module docstring says (medians of the rounds)."""
    per_process = row["sitting_s"] / row["rounds"]
    prefill = 2 * sum(row[f"prefill_ms_{n}"] for n in prompt_lengths) / 1000
    decode = (new_tokens + DECODE_WARMUP_TOKENS) / row["decode_tok_s"]
    ttft = row["ttft_ms"] / 1000
    return {"process_s": per_process, "load_s": row["load_s"], "prefill_s": prefill, "decode_s": decode,
            "ttft_s": ttft, "rest_s": per_process - row["load_s"] - prefill - decode - ttft}


def round_spread(row: Mapping[str, Any], figure: str) -> float:
    """The largest ``|round / median - 1|`` of ``figure`` over the row's rounds, percent."""
    values = [r[figure] for r in row["per_round"]]
    median = statistics.median(values)
    return max(abs(v / median - 1) for v in values) * 100


def table(path: str | Path) -> list[str]:
    """The Markdown lines of one sitting."""
    result = json.loads(Path(path).read_text(encoding="utf-8"))
    lengths = result["prompt_lengths"]
    figures = ["decode_tok_s", "ttft_ms", *(f"prefill_ms_{n}" for n in lengths)]
    names = {"decode_tok_s": "decode", "ttft_ms": "TTFT", **{f"prefill_ms_{n}": f"prefill {n}" for n in lengths}}
    lines = [f"{path}: {result.get('isa')}, {result['rounds']} rounds; seconds, then the largest |round / median - 1| "
             "of each figure, %", "",
             "| row | sitting s | a process s | load | prefills | decode | TTFT | rest | "
             + " | ".join(f"{names[f]} ±%" for f in figures) + " |",
             "|---" * (8 + len(figures)) + "|"]
    rows = [r for r in result["rows"] if not r.get("skipped") and r.get("per_round") and not r.get("timed_as")]
    for row in rows:
        split = process_split(row, lengths, result["new_tokens"])
        lines.append(f"| {row['peer']} | {row['sitting_s']:.0f} | "
                     + " | ".join(f"{split[k]:.1f}" for k in ("process_s", "load_s", "prefill_s", "decode_s", "ttft_s", "rest_s"))
                     + " | " + " | ".join(f"{round_spread(row, f):.1f}" for f in figures) + " |")
    total = sum(r["sitting_s"] for r in rows)
    lines += ["", f"Total: {total / 60:.1f} min over {len(rows)} timed rows.", ""]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sittings", nargs="+", help="peers.json files of finished sittings")
    args = parser.parse_args(argv)
    for path in args.sittings:
        print("\n".join(table(path)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
