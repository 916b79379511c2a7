"""The combined report: one row per (model, variant) in ``metrics.csv`` and a Markdown table.

Columns (units in the name or below):

=====================  ==========================================================================
model, variant         config short name and variant folder name
bytes_on_disk          bytes of ``model.onnx`` plus ``model.onnx_data``
nodes                  graph node count
quant_ops              quantization ops in the graph (QDQ pairs or dynamic MatMulInteger etc.)
ppl                    perplexity of the variant on the evaluation text
ppl_reference          perplexity of PyTorch fp32 on the same tokens
ppl_delta_pct          (ppl - ppl_reference) / ppl_reference, percent
kl_mean, kl_p99        KL(PyTorch || variant) per token, nats: mean and 99th percentile
top1_pct               top-1 agreement with PyTorch, percent of positions
max_abs_logit_diff     max |logit_variant - logit_pytorch| over all positions and vocabulary
eval_tokens            predicted tokens evaluated
load_s                 ONNX Runtime session creation, seconds
ttft_ms                time to first token (prefill of the latency prompt), ms
decode_tok_s           tokens/s of single-token decode steps with the KV cache
peak_rss_mb            peak RSS of the latency process, MiB
=====================  ==========================================================================
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any, Iterable

from .artifacts import read_json, write_json

COLUMNS = (
    "model", "variant", "bytes_on_disk", "nodes", "quant_ops",
    "ppl", "ppl_reference", "ppl_delta_pct", "kl_mean", "kl_p99", "top1_pct", "max_abs_logit_diff", "eval_tokens",
    "load_s", "ttft_ms", "decode_tok_s", "peak_rss_mb",
)


def variant_row(model: str, variant: str, inspect: dict, accuracy: dict, latency: dict) -> dict[str, Any]:
    """Merge one variant's inspection, accuracy and latency JSON into a report row."""
    return {
        "model": model,
        "variant": variant,
        "bytes_on_disk": inspect["bytes_on_disk"],
        "nodes": inspect["nodes"],
        "quant_ops": sum(inspect.get("quant_ops", {}).values()),
        "ppl": accuracy["ppl"],
        "ppl_reference": accuracy["ppl_reference"],
        "ppl_delta_pct": accuracy["ppl_delta_pct"],
        "kl_mean": accuracy["kl_mean"],
        "kl_p99": accuracy["kl_p99"],
        "top1_pct": accuracy["top1_pct"],
        "max_abs_logit_diff": accuracy["max_abs_logit_diff"],
        "eval_tokens": accuracy["tokens"],
        "load_s": latency["load_s"],
        "ttft_ms": latency["ttft_ms"],
        "decode_tok_s": latency["decode_tok_s"],
        "peak_rss_mb": latency["peak_rss_mb"],
    }


def collect_rows(entries: Iterable[tuple[str, str, str, str, str]]) -> list[dict[str, Any]]:
    """Rows from ``(model, variant, inspect.json, accuracy.json, latency.json)`` paths."""
    return [
        variant_row(model, variant, read_json(i), read_json(a), read_json(lat))
        for model, variant, i, a, lat in entries
    ]


def _fmt(value: Any, column: str) -> str:
    if isinstance(value, float):
        if column == "ppl_delta_pct":
            return f"{value:+.2f}"
        if column in ("kl_mean", "kl_p99", "max_abs_logit_diff"):
            return f"{value:.4g}"
        return f"{value:.2f}"
    if column == "bytes_on_disk":
        return f"{value / 1e6:.1f} MB"
    return str(value)


def markdown_table(rows: list[dict[str, Any]], columns: Iterable[str] = COLUMNS) -> str:
    """A GitHub-flavoured Markdown table of ``rows``."""
    columns = list(columns)
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(_fmt(r[c], c) for c in columns) + " |" for r in rows]
    return "\n".join(out) + "\n"


def write_report(rows: list[dict[str, Any]], markdown: str | os.PathLike, csv_path: str | os.PathLike,
                 json_path: str | os.PathLike | None = None) -> None:
    """Write ``report.md`` and ``metrics.csv`` (and ``metrics.json`` when asked) for ``rows``."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    Path(csv_path).parent.mkdir(parents=True, exist_ok=True)
    Path(csv_path).write_text(buffer.getvalue(), encoding="utf-8")
    if json_path is not None:
        write_json(json_path, rows)
    models = sorted({r["model"] for r in rows})
    text = [
        "# qwen-onnx report",
        "",
        f"Models: {', '.join(models)}. Accuracy is against PyTorch fp32 on the shipped evaluation text; "
        "latency is ONNX Runtime on the CPU with the configured thread count.",
        "",
        markdown_table(rows),
        "Column meanings: see `qwen_onnx.report` (units: MB = 10^6 bytes, ms, tokens/s, MiB, KL in nats).",
        "",
    ]
    Path(markdown).write_text("\n".join(text), encoding="utf-8")
