"""Report figures with matplotlib (Agg backend, PNG): size vs perplexity, decode speed, prefill latency."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _label(row: dict[str, Any], models: set[str]) -> str:
    return row["variant"] if len(models) == 1 else f"{row['model']}/{row['variant']}"


def plot_ppl_vs_size(rows: Sequence[dict[str, Any]], path: str | os.PathLike) -> None:
    """Scatter of perplexity against bytes on disk (MB), one point per (model, variant)."""
    models = {r["model"] for r in rows}
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    for row in rows:
        if row.get("ppl") is None or row.get("bytes_on_disk") is None:
            continue
        x, y = row["bytes_on_disk"] / 1e6, row["ppl"]
        ax.scatter([x], [y], s=36)
        ax.annotate(_label(row, models), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("bytes on disk (MB)")
    ax.set_ylabel("perplexity on the evaluation text")
    ax.set_title("Perplexity vs size")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    _save(fig, path)


def plot_decode_speed(rows: Sequence[dict[str, Any]], path: str | os.PathLike) -> None:
    """Bar chart of decode tokens/s with the KV cache per (model, variant)."""
    models = {r["model"] for r in rows}
    labels = [_label(r, models) for r in rows]
    values = [r.get("decode_tok_s") or 0.0 for r in rows]
    fig, ax = plt.subplots(figsize=(max(6.4, 0.8 * len(rows)), 4.2), dpi=110)
    bars = ax.bar(range(len(rows)), values, color="tab:blue")
    ax.bar_label(bars, fmt="%.1f", fontsize=8)
    ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("decode tokens/s")
    ax.set_title("Decode speed (KV cache, single stream)")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    _save(fig, path)


def plot_prefill(rows: Sequence[dict[str, Any]], lengths: Sequence[int], path: str | os.PathLike) -> None:
    """Median prefill latency (ms) against prompt length (tokens), one line per (model, variant)."""
    models = {r["model"] for r in rows}
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    for row in rows:
        points = [(n, row.get(f"prefill_ms_p50_{n}")) for n in lengths]
        points = [(n, v) for n, v in points if v is not None]
        if points:
            ax.plot(*zip(*points), marker="o", label=_label(row, models))
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("prefill latency, median (ms)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(lengths), [str(n) for n in lengths])
    ax.set_title("Prefill latency vs prompt length")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, path)


def _save(fig, path: str | os.PathLike) -> None:
    """Save ``fig`` as PNG at ``path`` through ``<path>.partial-PID@HOST~`` and a rename (never a
    half-written image; see :func:`qwen_onnx.artifacts.sweep_tree`)."""
    from .artifacts import owner_tag

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.partial-{owner_tag()}")
    fig.savefig(tmp, format="png")
    plt.close(fig)
    os.replace(tmp, path)
