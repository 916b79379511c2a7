"""Report figures with matplotlib (Agg backend, PNG): perplexity change vs size, decode speed,
prefill latency vs prompt length, and KL divergence vs decode speed with the Pareto front.

Every figure has one panel per model (models in report order, left to right) and one legend
below the panels; a variant keeps its colour and marker (:func:`qwen_onnx.report.styles.variant_styles`)
in every figure. A variant that fails its gate is drawn hollow; the peers (llama.cpp, onnxruntime-genai's
builder, OpenVINO's quantizer and our variants run by OpenVINO: :func:`qwen_onnx.report.peer_rows.is_peer_row`)
are hatched, dashed or ringed; every row's speed comes from the same sitting. No point is
labelled on the plot: the legend names them, so labels never overlap; points that would hide
each other are set side by side (:func:`_dodge`).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import Formatter, FuncFormatter  # noqa: E402
from matplotlib.transforms import offset_copy  # noqa: E402

from qwen_onnx.report.styles import Style, variant_styles  # noqa: E402
from qwen_onnx.store.staging import owner_tag

#: Axis labels, with units.
SIZE_LABEL = "size on disk (MB)"
PPL_DELTA_LABEL = "perplexity Δ vs PyTorch (%)"
DECODE_LABEL = "decode (tokens/s)"
PREFILL_LABEL = "prefill latency, median (ms)"
PROMPT_LABEL = "prompt length (tokens)"
KL_LABEL = "KL divergence from PyTorch, mean (nats, log)"
#: The caption under each figure in report.html (Snakemake's report has its own, workflow/report/*.rst).
CAPTIONS = {
    "ppl_vs_size": "Perplexity change against PyTorch vs size on disk, one panel per model; lower left is better. "
                   "Hollow markers fail their gate; markers that would hide each other are set side by side.",
    "decode_tok_s": "Decode tokens/s with the KV cache, single stream, every row timed in the same sitting "
                    "(interleaved rounds). Hollow bars fail their gate; hatched bars are the peers (other tools, "
                    "and our variants run by OpenVINO).",
    "prefill_latency": "Median prefill latency vs prompt length, log-log. Hollow markers fail their gate; dashed "
                       "lines are the peers (other tools, and our variants run by OpenVINO).",
    "accuracy_vs_speed": "KL divergence from PyTorch (mean per token, log scale) vs decode tokens/s, our variants and "
                         "the peers on the same evaluation windows and in the same sitting; lower right is better. "
                         "The line joins the Pareto front: the rows no other row beats on both axes. Hollow markers "
                         "fail their gate; peers have a ring: black for another quantizer from the same float start "
                         "(llama.cpp's own quantizer, the builder's INT4, optimum-intel's INT4), grey for another "
                         "runtime (llama.cpp on the source GGUF, the reference's own weights; our variants run by "
                         "OpenVINO).",
}
_PANEL_W, _PANEL_H, _DPI = 5.0, 3.8, 110
_MARKER_S = 64  # scatter marker area, points²
_PER_ROW = 3  # panels per row
_PLAIN = FuncFormatter(lambda v, _: f"{v:g}")
_LEGEND_W = 2.3  # inches beside a single panel for the legend
_LEGEND_ENTRY_W = 1.9  # inches per legend column under the panels


class _MinorPlain(Formatter):
    """Labels of a log axis's minor ticks: 2, 3 and 5 × 10^k as plain numbers, only when the axis
    spans less than 1.5 decades (else the major ticks say enough)."""

    def __call__(self, x, pos=None):
        lo, hi = self.axis.get_view_interval()
        if x <= 0 or lo <= 0 or hi / lo > 10 ** 1.5:
            return ""
        mantissa = x / 10 ** math.floor(math.log10(x))
        return f"{x:g}" if round(mantissa) in (2, 3, 5) and abs(mantissa - round(mantissa)) < 1e-6 else ""


def _models(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["model"] for r in rows))


def _failed(row: Mapping[str, Any]) -> bool:
    return row.get("gate") == "FAIL"


def _is_peer(row: Mapping[str, Any]) -> bool:
    """A row of another tool or runtime (llama.cpp, the builder, OpenVINO), not one of our variants or PyTorch: every
    row is timed in the sitting now, so ``measured_by`` no longer tells them apart."""
    from qwen_onnx.measure.peers_table import is_peer_route, openvino_variant

    return is_peer_route(row["variant"]) or openvino_variant(row["variant"]) is not None


#: The ring of a peer's marker on the accuracy–speed plot, by what it compares
#: (:func:`qwen_onnx.measure.peers_table.compares`): black for another quantizer from our start, grey for
#: another runtime (llama.cpp on the source GGUF, our variants run by OpenVINO).
PEER_RING = {"quantizer": "black", "runtime": "#999999"}


def _ring(row: Mapping[str, Any]) -> str:
    from qwen_onnx.measure.peers_table import compares

    return PEER_RING.get(compares(row["variant"]) or "quantizer", "black")


def _gid(row: Mapping[str, Any]) -> str:
    """The id of a row's artists, ``model/variant`` (tests read the style back by it)."""
    return f"{row['model']}/{row['variant']}"


def _panels(n: int, height: float = _PANEL_H):
    """A figure with ``n`` panels, at most :data:`_PER_ROW` to a row (unused places hidden); the
    legend's room is added by :func:`_legend`."""
    cols, rows = min(n, _PER_ROW), -(-n // _PER_ROW)
    fig, axes = plt.subplots(rows, cols, figsize=(_PANEL_W * cols, height * rows), dpi=_DPI, squeeze=False)
    axes = [ax for row in axes for ax in row]
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def _legend(fig, rows: Sequence[Mapping[str, Any]], styles: Mapping[str, Style], extra: Sequence = ()) -> None:
    """One legend for all panels: each variant drawn (colour + marker), then the key to the fills.

    Beside a single column of panels (the figure widened by :data:`_LEGEND_W`), else under the
    panels in as many columns as fit (the figure heightened to hold its rows).
    """
    names = list(dict.fromkeys(r["variant"] for r in rows))
    handles = [Line2D([], [], color=styles[n].colour, marker=styles[n].marker, linestyle="", markersize=8, label=n)
               for n in names]
    handles += list(extra)
    width, height = fig.get_figwidth(), fig.get_figheight()
    if width <= _PANEL_W:
        fig.set_figwidth(width + _LEGEND_W)
        fig.legend(handles=handles, loc="center right", ncol=1, fontsize=8, frameon=False)
        fig.tight_layout(rect=(0, 0, width / (width + _LEGEND_W), 1))
        return
    ncol = max(1, min(len(handles), 6, int(width // _LEGEND_ENTRY_W)))
    need = 0.24 * -(-len(handles) // ncol) + 0.27  # inches: the rows of entries, and a margin
    fig.set_figheight(height + need)
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, need / (height + need), 1, 1))


def _fail_key(rows) -> list:
    if not any(_failed(r) for r in rows):
        return []
    return [Line2D([], [], color="#444444", marker="o", markerfacecolor="none", linestyle="",
                   label="hollow: fails its gate")]


def _dodge(ax, fig, points: Sequence[tuple[float, float]], step_pt: float = 9.0) -> list[float]:
    """Horizontal offsets (points) that set side by side the points closer than a marker on screen.

    ``ax``'s limits must be final. Points are grouped greedily in order; a group of ``k`` points
    is spread over ``k`` positions ``step_pt`` apart, centred on the group.
    """
    ax.get_xlim(), ax.get_ylim()  # settle the autoscaled limits before measuring
    pixels = ax.transData.transform(points) if points else []
    near = step_pt * fig.dpi / 72
    groups: list[list[int]] = []
    for i, (x, y) in enumerate(pixels):
        for g in groups:
            gx, gy = pixels[g[0]]
            if abs(x - gx) < near and abs(y - gy) < near:
                g.append(i)
                break
        else:
            groups.append([i])
    offsets = [0.0] * len(points)
    for g in groups:
        for k, i in enumerate(g):
            offsets[i] = (k - (len(g) - 1) / 2) * step_pt
    return offsets


def figure_ppl_vs_size(rows: Sequence[Mapping[str, Any]], styles: Mapping[str, Style] | None = None):
    """Perplexity change against PyTorch (%) vs size on disk (MB), one panel per model.

    Rows without ``ppl_delta_pct`` or ``bytes_on_disk`` (the peers) are left out. Returns the figure.
    """
    rows = [r for r in rows if r.get("ppl_delta_pct") is not None and r.get("bytes_on_disk") is not None]
    styles = styles or variant_styles(r["variant"] for r in rows)
    models = _models(rows)
    fig, axes = _panels(max(1, len(models)))
    for ax, model in zip(axes, models):
        mine = [r for r in rows if r["model"] == model]
        points = [(r["bytes_on_disk"] / 1e6, r["ppl_delta_pct"]) for r in mine]
        ax.plot(*zip(*points), alpha=0)  # sets the limits the dodging measures in
        ax.margins(0.12)
        ax.axhline(0, color="#999999", linewidth=0.8, zorder=0)
        offsets = _dodge(ax, fig, points)
        for r, (x, y), dx in zip(mine, points, offsets):
            s = styles[r["variant"]]
            ax.scatter([x], [y], s=_MARKER_S, marker=s.marker, linewidths=1.4, edgecolors=s.colour,
                       facecolors="none" if _failed(r) else s.colour, zorder=3, gid=_gid(r),
                       transform=offset_copy(ax.transData, fig=fig, x=dx, y=0, units="points"))
        ppl = next((r.get("ppl") for r in mine if r["variant"] == "pytorch"), None)
        ax.set_title(f"{model}" + (f" (PyTorch perplexity {ppl:.2f})" if ppl else ""), fontsize=10)
        ax.set_xlabel(SIZE_LABEL)
        ax.set_ylabel(PPL_DELTA_LABEL)
        ax.grid(alpha=0.3)
    fig.suptitle("Perplexity change vs size (lower left is better)", fontsize=11)
    _legend(fig, rows, styles, _fail_key(rows))
    return fig


def figure_decode_speed(rows: Sequence[Mapping[str, Any]], styles: Mapping[str, Style] | None = None):
    """Decode tokens/s (KV cache, single stream) as horizontal bars, one panel per model, the
    variant's marker at the bar's end and its value beside it. Returns the figure."""
    rows = [r for r in rows if r.get("decode_tok_s") is not None]
    styles = styles or variant_styles(r["variant"] for r in rows)
    models = _models(rows)
    most = max((sum(r["model"] == m for r in rows) for m in models), default=1)
    fig, axes = _panels(max(1, len(models)), height=max(_PANEL_H, 0.32 * most + 1.8))
    for ax, model in zip(axes, models):
        mine = [r for r in rows if r["model"] == model]
        ys = list(range(len(mine)))[::-1]  # first row on top
        for y, r in zip(ys, mine):
            s, v = styles[r["variant"]], r["decode_tok_s"]
            ax.barh(y, v, height=0.7, color="white" if _failed(r) else s.colour, edgecolor=s.colour,
                    linewidth=1.4, hatch="///" if _is_peer(r) else None, alpha=0.55 if _is_peer(r) else 0.85,
                    gid=_gid(r))
            ax.scatter([v], [y], s=_MARKER_S, marker=s.marker, color=s.colour, edgecolors="black",
                       linewidths=0.5, zorder=3, gid=_gid(r))
            ax.annotate(f"{v:.1f}", (v, y), textcoords="offset points", xytext=(7, 0), va="center", fontsize=8)
        ax.set_yticks(ys, [r["variant"] for r in mine], fontsize=8)
        ax.set_xlim(0, max(r["decode_tok_s"] for r in mine) * 1.2)  # room for the value labels
        ax.set_xlabel(DECODE_LABEL)
        ax.set_title(model, fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle("Decode speed (KV cache, single stream; longer is better)", fontsize=11)
    extra = _fail_key(rows)
    if any(_is_peer(r) for r in rows):
        extra.append(Patch(facecolor="white", edgecolor="#444444", hatch="///", label="hatched: peer"))
    _legend(fig, rows, styles, extra)
    return fig


def figure_prefill(rows: Sequence[Mapping[str, Any]], lengths: Sequence[int],
                   styles: Mapping[str, Style] | None = None):
    """Median prefill latency (ms) vs prompt length (tokens), log-log, one panel per model and one
    line per variant (peers dashed). Returns the figure."""
    lines = []
    for r in rows:
        points = [(n, r.get(f"prefill_ms_p50_{n}")) for n in lengths]
        points = [(n, v) for n, v in points if v is not None]
        if points:
            lines.append((r, points))
    drawn = [r for r, _ in lines]
    styles = styles or variant_styles(r["variant"] for r in drawn)
    models = _models(drawn)
    fig, axes = _panels(max(1, len(models)))
    for ax, model in zip(axes, models):
        for r, points in lines:
            if r["model"] != model:
                continue
            s = styles[r["variant"]]
            ax.plot(*zip(*points), color=s.colour, marker=s.marker, markersize=7, linewidth=1.3,
                    linestyle="--" if _is_peer(r) else "-", markerfacecolor="none" if _failed(r) else s.colour,
                    gid=_gid(r))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(_PLAIN)  # 100, not 10²; and 6, not 6×10⁰, within a decade
        ax.yaxis.set_minor_formatter(_MinorPlain())
        ax.set_xticks(list(lengths), [str(n) for n in lengths])
        ax.set_xlabel(PROMPT_LABEL)
        ax.set_ylabel(PREFILL_LABEL)
        ax.set_title(model, fontsize=10)
        ax.grid(alpha=0.3, which="both")
    fig.suptitle("Prefill latency vs prompt length (log-log; lower is better)", fontsize=11)
    extra = _fail_key(drawn)
    if any(_is_peer(r) for r in drawn):
        extra.append(Line2D([], [], color="#444444", linestyle="--", label="dashed: peer"))
    _legend(fig, drawn, styles, extra)
    return fig


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """The indices of the points on the accuracy–speed Pareto front, fastest first.

    A point ``(decode tokens/s, divergence)`` is on the front when no other point decodes at least as
    fast with at most the same divergence and is strictly better in one of the two (the usual
    definition of Pareto dominance, maximising speed and minimising divergence). Equal points are
    both on the front.

    Args:
        points: ``(x, y)`` pairs: x higher is better, y lower is better.
    """
    front = []
    for i, (x, y) in enumerate(points):
        if not any((xo >= x and yo <= y) and (xo > x or yo < y) for xo, yo in points):
            front.append(i)
    return sorted(front, key=lambda i: (-points[i][0], points[i][1]))


def figure_accuracy_vs_speed(rows: Sequence[Mapping[str, Any]], styles: Mapping[str, Style] | None = None):
    """KL divergence from PyTorch (nats per token, mean; log axis) vs decode tokens/s, one panel per
    model, our variants and the peers (a black ring), the Pareto front (:func:`pareto_front`) drawn
    as a step line. Rows without both figures (PyTorch, the reference, has KL 0; untimed variants)
    are left out. Returns the figure."""
    rows = [r for r in rows if r.get("decode_tok_s") is not None and (r.get("kl_mean") or 0) > 0]
    styles = styles or variant_styles(r["variant"] for r in rows)
    models = _models(rows)
    fig, axes = _panels(max(1, len(models)))
    for ax, model in zip(axes, models):
        mine = [r for r in rows if r["model"] == model]
        points = [(r["decode_tok_s"], r["kl_mean"]) for r in mine]
        front = [points[i] for i in pareto_front(points)]
        ax.step([x for x, _ in front], [y for _, y in front], where="post", color="#888888", linewidth=1.0,
                zorder=1)
        for r, (x, y) in zip(mine, points):
            s = styles[r["variant"]]
            ax.scatter([x], [y], s=_MARKER_S, marker=s.marker, linewidths=1.6 if _is_peer(r) else 1.4,
                       edgecolors=_ring(r) if _is_peer(r) else s.colour,
                       facecolors="none" if _failed(r) else s.colour, zorder=3, gid=_gid(r))
        ax.set_yscale("log")
        ax.margins(0.1)
        ax.set_xlabel(DECODE_LABEL)
        ax.set_ylabel(KL_LABEL)
        ax.set_title(model, fontsize=10)
        ax.grid(alpha=0.3, which="both")
    fig.suptitle("Accuracy vs decode speed (lower right is better; the line is the Pareto front)", fontsize=11)
    extra = _fail_key(rows)
    if any(_is_peer(r) for r in rows):
        extra.append(Line2D([], [], color="#444444", marker="o", markeredgecolor=PEER_RING["quantizer"],
                            markerfacecolor="#dddddd", linestyle="", label="black ring: peer quantizer, same start"))
        extra.append(Line2D([], [], color="#444444", marker="o", markeredgecolor=PEER_RING["runtime"],
                            markerfacecolor="#dddddd", linestyle="", label="grey ring: peer runtime"))
    _legend(fig, rows, styles, extra)
    return fig


def plot_accuracy_vs_speed(rows: Sequence[dict[str, Any]], path: str | os.PathLike,
                           styles: Mapping[str, Style] | None = None) -> None:
    """:func:`figure_accuracy_vs_speed` as a PNG at ``path``."""
    _save(figure_accuracy_vs_speed(rows, styles), path)


def plot_ppl_vs_size(rows: Sequence[dict[str, Any]], path: str | os.PathLike,
                     styles: Mapping[str, Style] | None = None) -> None:
    """:func:`figure_ppl_vs_size` as a PNG at ``path``."""
    _save(figure_ppl_vs_size(rows, styles), path)


def plot_decode_speed(rows: Sequence[dict[str, Any]], path: str | os.PathLike,
                      styles: Mapping[str, Style] | None = None) -> None:
    """:func:`figure_decode_speed` as a PNG at ``path``."""
    _save(figure_decode_speed(rows, styles), path)


def plot_prefill(rows: Sequence[dict[str, Any]], lengths: Sequence[int], path: str | os.PathLike,
                 styles: Mapping[str, Style] | None = None) -> None:
    """:func:`figure_prefill` as a PNG at ``path``."""
    _save(figure_prefill(rows, lengths, styles), path)


def _save(fig, path: str | os.PathLike) -> None:
    """Save ``fig`` as PNG at ``path`` through ``<path>.partial-PID@HOST~`` and a rename (never a
    half-written image; see :func:`qwen_onnx.store.staging.sweep_tree`)."""

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.partial-{owner_tag()}")
    fig.savefig(tmp, format="png")
    plt.close(fig)
    os.replace(tmp, path)
