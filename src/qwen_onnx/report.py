"""The combined report: one row per (model, variant), PyTorch fp32 as the variant ``pytorch``.

Outputs: ``metrics.csv`` and ``metrics.json`` (machines), ``report.md`` and a self-contained
``report.html`` with embedded matplotlib figures (people). Every column is described in
:data:`COLUMNS`; the same descriptions appear at the end of both human reports.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .artifacts import read_json, write_json, write_text
from .inspect_graph import FUSED_OPS

#: Column name -> description (units in the text). Order is the CSV's; the prefill columns
#: ``prefill_ms_p50_{n}`` / ``prefill_ms_p90_{n}`` for each configured prompt length ``n`` follow ``load_s``
#: (see :func:`columns`).
COLUMNS: dict[str, str] = {
    "model": "config short name of the model",
    "variant": "variant folder name; `pytorch` is PyTorch eager fp32, the reference",
    "gate": "PASS or FAIL against the gate of the variant's kind (config `gates`)",
    "gate_failures": "the failing figures with their limits, `;`-separated",
    "bytes_on_disk": "bytes of model.onnx + model.onnx_data (safetensors for pytorch)",
    "nodes": "ONNX graph node count",
    "quant_ops": "quantization ops in the graph (QuantizeLinear/DequantizeLinear, MatMulInteger, ...)",
    "eval_tokens": "predicted tokens in the accuracy evaluation",
    "ppl": "perplexity on the evaluation text: exp(mean negative log-likelihood)",
    "ppl_delta_pct": "(ppl - ppl of PyTorch) / ppl of PyTorch, percent",
    "kl_mean": "KL(PyTorch || variant) per token, nats, mean",
    "kl_median": "KL per token, nats, median",
    "kl_p99": "KL per token, nats, 99th percentile",
    "top1_pct": "positions whose argmax token equals PyTorch's, percent",
    "max_abs_logit_diff": "max |logit - PyTorch logit| over all positions and the vocabulary",
    "mean_abs_logit_diff": "mean |logit - PyTorch logit|",
    "padded_batch_max_abs_diff": "max |Δlogit| between left-padded batch and each prompt alone, non-pad positions",
    "padded_batch_nonfinite": "NaN/inf count in the padded batch's logits (pad rows included)",
    "kv_cache_max_abs_diff": "max |Δlogit| between prefill + single-token decode steps and one full pass",
    "generation_match_pct": "greedy tokens matched before the first difference from PyTorch, percent of PyTorch's output",
    "load_s": "session creation (from_pretrained for pytorch), seconds",
    "ttft_ms": "time to first token: prefill of the decode prompt plus argmax, median, ms",
    "decode_tok_s": "single-stream decode tokens/s with the KV cache, median",
    "peak_rss_mib": "peak RSS of the latency process, MiB",
    "weight_bytes_per_token": "bytes of weights read per decoded token (embedding table as one row)",
    "roofline_tok_s": "memory-bandwidth bound on decode: bandwidth / weight bytes per token, tokens/s",
    "roofline_pct": "decode_tok_s as a percentage of roofline_tok_s",
    "decode_speedup_vs_pytorch": "decode_tok_s / PyTorch's",
    "ttft_vs_pytorch": "ttft_ms / PyTorch's (below 1 is faster)",
    "prefill_vs_pytorch": "median prefill latency at the longest prompt length / PyTorch's",
    "load_vs_pytorch": "load_s / PyTorch's",
    "peak_rss_vs_pytorch": "peak_rss_mib / PyTorch's",
    "bytes_vs_pytorch": "bytes_on_disk / PyTorch's",
    "threads": "intra-op threads of the measured session",
    "provider": "ONNX Runtime execution provider (torch-eager-cpu for pytorch)",
    "top_op": "op type with the largest share of ONNX Runtime kernel time, with its percent",
    "measured_by": "stage that measured the speed figures: `latency` (each variant on its own) or `peers` "
                   "(llama.cpp, genai-builder-int4: interleaved rounds, their *_vs_pytorch against that run's "
                   "own PyTorch row)",
}



def columns(prompt_lengths: Sequence[int]) -> dict[str, str]:
    """:data:`COLUMNS` with the prefill columns of ``prompt_lengths`` inserted after ``load_s``."""
    out: dict[str, str] = {}
    for name, doc in COLUMNS.items():
        out[name] = doc
        if name == "load_s":
            for n in prompt_lengths:
                out[f"prefill_ms_p50_{n}"] = f"prefill latency of a {n}-token prompt, median, ms"
                out[f"prefill_ms_p90_{n}"] = f"prefill latency of a {n}-token prompt, 90th percentile, ms"
    return out


SUMMARY = ("model", "variant", "gate", "bytes_on_disk", "ppl", "ppl_delta_pct", "kl_mean", "top1_pct",
           "ttft_ms", "decode_tok_s", "decode_speedup_vs_pytorch", "roofline_pct", "peak_rss_mib")
ACCURACY = ("model", "variant", "gate", "eval_tokens", "ppl", "ppl_delta_pct", "kl_mean", "kl_median", "kl_p99",
            "top1_pct", "max_abs_logit_diff", "mean_abs_logit_diff", "padded_batch_max_abs_diff",
            "padded_batch_nonfinite", "kv_cache_max_abs_diff", "generation_match_pct")


def latency_columns(prompt_lengths: Sequence[int]) -> tuple[str, ...]:
    """Columns of the latency table for the configured prompt lengths."""
    prefill = [c for n in prompt_lengths for c in (f"prefill_ms_p50_{n}", f"prefill_ms_p90_{n}")]
    return ("model", "variant", "load_s", *prefill, "ttft_ms", "decode_tok_s", "weight_bytes_per_token",
            "roofline_tok_s", "roofline_pct", "peak_rss_mib", "bytes_on_disk", "threads", "provider", "top_op")



RATIOS = ("model", "variant", "decode_speedup_vs_pytorch", "ttft_vs_pytorch", "prefill_vs_pytorch",
          "load_vs_pytorch", "peak_rss_vs_pytorch", "bytes_vs_pytorch")

_ACCURACY_KEYS = ("ppl", "ppl_delta_pct", "kl_mean", "kl_median", "kl_p99", "top1_pct", "max_abs_logit_diff",
                  "mean_abs_logit_diff", "padded_batch_max_abs_diff", "padded_batch_nonfinite",
                  "kv_cache_max_abs_diff", "generation_match_pct")
_LATENCY_KEYS = ("load_s", "ttft_ms", "decode_tok_s", "peak_rss_mib", "bytes_on_disk", "weight_bytes_per_token",
                 "threads", "provider")
_RATIO_OF = {
    "decode_speedup_vs_pytorch": "decode_tok_s",
    "ttft_vs_pytorch": "ttft_ms",
    "load_vs_pytorch": "load_s",
    "peak_rss_vs_pytorch": "peak_rss_mib",
    "bytes_vs_pytorch": "bytes_on_disk",
}


def variant_row(model: str, variant: str, inspect: Mapping | None, accuracy: Mapping, latency: Mapping,
                bandwidth_gb_s: float | None) -> dict[str, Any]:
    """One report row from a variant's inspection, accuracy and latency JSON."""
    row: dict[str, Any] = {c: None for c in COLUMNS}
    row.update(model=model, variant=variant)
    row["gate"] = accuracy.get("gate")
    row["gate_failures"] = "; ".join(accuracy.get("gate_failures", []))
    row["measured_by"] = "latency"
    row["eval_tokens"] = accuracy.get("tokens")
    for key in _ACCURACY_KEYS:
        row[key] = accuracy.get(key)
    for key in _LATENCY_KEYS:
        row[key] = latency.get(key)
    for key, value in latency.items():
        if key.startswith(("prefill_ms_p50_", "prefill_ms_p90_")):
            row[key] = value
    if inspect is not None:
        row["nodes"] = inspect["nodes"]
        row["quant_ops"] = sum(inspect.get("quant_ops", {}).values())
    ops = latency.get("profile", {}).get("ops", [])
    if ops:
        row["top_op"] = f"{ops[0]['op_type']} {ops[0]['pct']:.0f}%"
    if bandwidth_gb_s and row["weight_bytes_per_token"]:
        row["roofline_tok_s"] = bandwidth_gb_s * 1e9 / row["weight_bytes_per_token"]
        row["roofline_pct"] = 100.0 * row["decode_tok_s"] / row["roofline_tok_s"]
    return row


def pytorch_accuracy(fp32_accuracy: Mapping) -> dict[str, Any]:
    """The reference's own accuracy row: its perplexity, zero divergence, full agreement."""
    return {
        "gate": "reference", "gate_failures": [], "tokens": fp32_accuracy["tokens"],
        "ppl": fp32_accuracy["ppl_reference"], "ppl_delta_pct": 0.0, "kl_mean": 0.0, "kl_median": 0.0,
        "kl_p99": 0.0, "top1_pct": 100.0, "max_abs_logit_diff": 0.0, "mean_abs_logit_diff": 0.0,
        "generation_match_pct": 100.0,
    }


def add_ratios(rows: list[dict[str, Any]], prompt_lengths: Sequence[int]) -> None:
    """Fill the ``*_vs_pytorch`` columns from each model's ``pytorch`` row."""
    baseline = {r["model"]: r for r in rows if r["variant"] == "pytorch"}
    ratio_of = {**_RATIO_OF, "prefill_vs_pytorch": f"prefill_ms_p50_{max(prompt_lengths)}"}
    for row in rows:
        base = baseline.get(row["model"])
        if base is None:
            continue
        for column, source in ratio_of.items():
            value, ref = row.get(source), base.get(source)
            if value is not None and ref:
                row[column] = value / ref


def collect_rows(
    models: Sequence[str],
    variants: Sequence[str],
    files: Mapping[str, Sequence[str | os.PathLike]],
    machine: Mapping,
    prompt_lengths: Sequence[int],
) -> list[dict]:
    """Rows for every (model, variant), each model's ``pytorch`` row first.

    Args:
        files: ``inspect``, ``accuracy``, ``latency``: JSON paths in (model, variant) product
            order; ``pytorch``: one latency JSON per model.
    """
    rows = []
    bandwidth = machine.get("memory_bandwidth_gb_s")
    keys = [(m, v) for m in models for v in variants]
    by_key = {kind: dict(zip(keys, files[kind])) for kind in ("inspect", "accuracy", "latency")}
    for model, torch_latency in zip(models, files["pytorch"]):
        fp32_accuracy = read_json(by_key["accuracy"][(model, variants[0])])
        rows.append(variant_row(model, "pytorch", None, pytorch_accuracy(fp32_accuracy), read_json(torch_latency),
                                bandwidth))
        for variant in variants:
            key = (model, variant)
            rows.append(variant_row(model, variant, read_json(by_key["inspect"][key]),
                                    read_json(by_key["accuracy"][key]), read_json(by_key["latency"][key]), bandwidth))
    add_ratios(rows, prompt_lengths)
    return rows


#: Peers of the peers stage that become rows of metrics.csv/json (our variants and PyTorch have theirs).
PEER_VARIANTS = ("llama.cpp", "genai-builder-int4", "genai-builder-int4-ort")
_PEER_PROVIDER = {"llama.cpp": "llama.cpp CPU", "genai-builder-int4": "onnxruntime-genai CPU",
                  "genai-builder-int4-ort": "CPUExecutionProvider"}


def peer_metric_rows(models: Sequence[str], paths: Sequence[str | os.PathLike],
                     prompt_lengths: Sequence[int]) -> list[dict[str, Any]]:
    """metrics.csv/json rows of the measured peers (:data:`PEER_VARIANTS`) of each model's peers JSON
    (:func:`qwen_onnx.peers.run_peers`), ``variant`` = the peer's name, ``measured_by`` = ``peers``.

    Their ``*_vs_pytorch`` ratios divide by the ``pytorch`` row of the same peers run (the same
    interleaved rounds), not by the latency stage's PyTorch figures. Prefill columns are filled
    for the prompt lengths both stages measure.
    """
    out = []
    for model, path in zip(models, paths):
        result = read_json(path)
        base = next((r for r in result["rows"] if r["peer"] == "pytorch" and not r.get("skipped")), None)
        for peer in result["rows"]:
            if peer["peer"] not in PEER_VARIANTS or peer.get("skipped"):
                continue
            row: dict[str, Any] = {c: None for c in COLUMNS}
            row.update(model=model, variant=peer["peer"], measured_by="peers", threads=result["threads"],
                       provider=_PEER_PROVIDER[peer["peer"]])
            for key in ("load_s", "ttft_ms", "decode_tok_s", "peak_rss_mib", "bytes_on_disk"):
                row[key] = peer.get(key)
            for n in prompt_lengths:
                if f"prefill_ms_{n}" in peer:
                    row[f"prefill_ms_p50_{n}"] = peer[f"prefill_ms_{n}"]
            if base is not None:
                for column, source in _RATIO_OF.items():
                    if row.get(source) is not None and base.get(source):
                        row[column] = row[source] / base[source]
                longest = f"prefill_ms_{max(prompt_lengths)}"
                if peer.get(longest) is not None and base.get(longest):
                    row["prefill_vs_pytorch"] = peer[longest] / base[longest]
            out.append(row)
    return out


def peer_tables(models: Sequence[str], paths: Sequence[str | os.PathLike]) -> list[dict[str, Any]]:
    """Per model the "Against peers" table: ``model``, ``notes`` (lines), ``columns`` and ``rows``."""
    from .peers import peer_columns, peers_notes

    out = []
    for model, path in zip(models, paths):
        result = read_json(path)
        rows = [{"model": model, **r} for r in result["rows"]]
        out.append({"model": model, "notes": peers_notes(result), "rows": rows,
                    "columns": ["model", *peer_columns(result["prompt_lengths"])]})
    return out


def _fmt(value: Any, column: str) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        if column == "ppl_delta_pct":
            return f"{value:+.2f}"
        if column.startswith(("kl_", "max_abs", "mean_abs", "padded_batch_max", "kv_cache")):
            return f"{value:.3g}"
        if column.endswith("ppl_delta_pct"):
            return f"{value:+.2f}"
        if column.endswith(("_vs_pytorch", "_vs_peer")):
            return f"{value:.2f}×"
        return f"{value:.2f}" if abs(value) < 1000 else f"{value:.0f}"
    if column in ("bytes_on_disk", "weight_bytes_per_token", "bytes_pytorch") and isinstance(value, int):
        return f"{value / 1e6:.1f} MB"
    return str(value)


def markdown_table(rows: Sequence[Mapping], columns: Iterable[str]) -> str:
    """A GitHub-flavoured Markdown table of ``rows``."""
    columns = list(columns)
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(_fmt(r.get(c), c) for c in columns) + " |" for r in rows]
    return "\n".join(out) + "\n"


def html_table(rows: Sequence[Mapping], columns: Iterable[str]) -> str:
    """An HTML table of ``rows``; FAIL cells are marked."""
    columns = list(columns)
    head = "".join(f"<th title='{html.escape(COLUMNS.get(c, ''))}'>{html.escape(c)}</th>" for c in columns)
    body = []
    for r in rows:
        cells = []
        for c in columns:
            text = html.escape(_fmt(r.get(c), c))
            css = " class='fail'" if c == "gate" and r.get(c) == "FAIL" else " class='pass'" if c == "gate" and r.get(c) == "PASS" else ""
            cells.append(f"<td{css}>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def cross_model_rows(rows: Sequence[Mapping]) -> tuple[list[dict[str, Any]], list[str]]:
    """One row per model comparing sizes: PyTorch perplexity, then per variant its perplexity
    change (%) and decode tokens/s. Returns the rows and their columns."""
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = {r["variant"]: r for r in rows if r["model"] == model}
        row: dict[str, Any] = {"model": model, "ppl_pytorch": mine.get("pytorch", {}).get("ppl"),
                               "bytes_pytorch": mine.get("pytorch", {}).get("bytes_on_disk")}
        for variant in variants:
            r = mine.get(variant, {})
            if variant != "pytorch":
                row[f"{variant} ppl_delta_pct"] = r.get("ppl_delta_pct")
            row[f"{variant} decode_tok_s"] = r.get("decode_tok_s")
        out.append(row)
    columns = list(out[0]) if out else []
    return out, columns


def _machine_lines(machine: Mapping) -> list[str]:
    versions = ", ".join(f"{k} {v}" for k, v in machine.get("library_versions", {}).items() if v)
    return [
        f"CPU: {machine.get('cpu_model')} ({machine.get('logical_cores')} logical cores, "
        f"flags {', '.join(machine.get('cpu_flags', [])) or 'none'}), {machine.get('memory_gib')} GiB RAM",
        f"Memory bandwidth (STREAM Copy convention, {machine.get('bandwidth_threads')} threads): "
        f"{machine.get('memory_bandwidth_gb_s')} GB/s",
        f"Libraries: {versions}",
    ]


def write_report(
    rows: list[dict[str, Any]],
    machine: Mapping,
    *,
    markdown: str | os.PathLike,
    html_path: str | os.PathLike,
    csv_path: str | os.PathLike,
    json_path: str | os.PathLike,
    plots: Mapping[str, str | os.PathLike],
    profiles: Mapping[tuple[str, str], Mapping] | None = None,
    generations: Mapping[tuple[str, str], list] | None = None,
    prompt_lengths: Sequence[int] = (32, 128, 512),
    graphs: Sequence[Mapping[str, Any]] | None = None,
    sensitivity: Sequence[Mapping[str, Any]] | None = None,
    peers: Sequence[Mapping[str, Any]] | None = None,
    peer_rows: Sequence[Mapping[str, Any]] | None = None,
    pipeline: Mapping[str, Any] | None = None,
) -> None:
    """Write the CSV, JSON, Markdown and HTML reports and the three plots.

    Args:
        rows: from :func:`collect_rows`.
        machine: from :func:`qwen_onnx.machine.describe_machine`.
        plots: paths for ``ppl_vs_size``, ``decode_tok_s`` and ``prefill_latency`` PNGs.
        profiles: per (model, variant), the ``profile`` of its latency JSON.
        generations: per (model, variant), the ``generation`` details of its accuracy JSON.
        graphs: from :func:`graph_rows`.
        sensitivity: from :func:`sensitivity_rows`.
        peers: from :func:`peer_tables` (the "Against peers" section).
        peer_rows: from :func:`peer_metric_rows`, appended to metrics.csv/json (not to the plots).
        pipeline: from :func:`qwen_onnx.pipeline.pipeline_table` (the "Pipeline" section).
    """
    from .pipeline import COLUMNS as PIPELINE_COLUMNS, pipeline_markdown
    from .plots import plot_decode_speed, plot_ppl_vs_size, plot_prefill

    buffer = io.StringIO()
    docs = columns(prompt_lengths)
    writer = csv.DictWriter(buffer, fieldnames=list(docs), lineterminator="\n")
    writer.writeheader()
    writer.writerows([*rows, *(peer_rows or [])])
    write_text(csv_path, buffer.getvalue())  # every file through a rename: a killed report leaves none half-written
    write_json(json_path, [*rows, *(peer_rows or [])])

    plot_ppl_vs_size(rows, plots["ppl_vs_size"])
    plot_decode_speed(rows, plots["decode_tok_s"])
    plot_prefill(rows, prompt_lengths, plots["prefill_latency"])

    failing = [r for r in rows if r.get("gate") == "FAIL"]
    verdict = (f"{len(failing)} variant(s) FAIL their gate: "
               + "; ".join(f"{r['model']}/{r['variant']}: {r['gate_failures']}" for r in failing)) if failing \
        else "Every variant passes its gate."
    models = sorted({r["model"] for r in rows})
    intro = (f"Models: {', '.join(models)}. Accuracy is against PyTorch fp32 (`pytorch`) on the evaluation text; "
             "latency is single-stream on the CPU, same thread count for every variant.")

    md = ["# qwen-onnx report", "", intro, "", *[f"- {line}" for line in _machine_lines(machine)], "",
          f"**{verdict}**", "", "## Summary", "", markdown_table(rows, SUMMARY), "## Accuracy", "",
          markdown_table(rows, ACCURACY), "## Latency", "", markdown_table(rows, latency_columns(prompt_lengths)),
          "## Ratios to PyTorch", "", markdown_table(rows, RATIOS)]
    across, across_columns = cross_model_rows(rows)
    if len(across) > 1:
        md += ["## Across models", "", markdown_table(across, across_columns)]
    for table in peers or []:
        md += [f"## Against peers: {table['model']}", "", *[f"- {line}" for line in table["notes"]], "",
               markdown_table(table["rows"], table["columns"])]
    if graphs:
        md += ["## Graphs (inspection, and the change from fp32)", "", markdown_table(graphs, GRAPH_COLUMNS)]
    if sensitivity:
        md += [f"## INT8 sensitivity per MatMul role ({SENSITIVITY_NOTE})", "",
               markdown_table(sensitivity, SENSITIVITY_COLUMNS)]
    if profiles:
        md += ["## Where the time goes (ONNX Runtime profiling, share of kernel time)", ""]
        for (model, variant), prof in profiles.items():
            ops = ", ".join(f"{o['op_type']} {o['pct']:.1f}%" for o in prof.get("ops", [])[:8])
            md.append(f"- {model}/{variant}: {ops}")
        md.append("")
    if pipeline:
        md += [pipeline_markdown(pipeline)]
    md += ["## Columns", "", *[f"- `{c}`: {d}" for c, d in docs.items()], ""]
    write_text(markdown, "\n".join(md))

    images = {name: base64.b64encode(Path(p).read_bytes()).decode() for name, p in plots.items()}
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>qwen-onnx report</title><style>",
        "body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;margin:1em 0;font-size:13px}",
        "td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}th{background:#f3f3f3}td:nth-child(-n+2){text-align:left}",
        ".fail{background:#f8c9c4;font-weight:bold}.pass{background:#cdeccd}img{max-width:100%;margin:0.5em}",
        "pre{white-space:pre-wrap;background:#f7f7f7;padding:4px;font-size:12px}",
        "</style></head><body><h1>qwen-onnx report</h1>",
        f"<p>{html.escape(intro)}</p><ul>", *[f"<li>{html.escape(x)}</li>" for x in _machine_lines(machine)],
        f"</ul><p><b>{html.escape(verdict)}</b></p>",
        "<h2>Summary</h2>", html_table(rows, SUMMARY),
        "<h2>Figures</h2><div>",
        *[f"<img alt='{name}' src='data:image/png;base64,{data}'>" for name, data in images.items()],
        "</div><h2>Accuracy</h2>", html_table(rows, ACCURACY),
        "<h2>Latency</h2>", html_table(rows, latency_columns(prompt_lengths)),
        "<h2>Ratios to PyTorch</h2>", html_table(rows, RATIOS),
    ]
    if len(across) > 1:
        parts += ["<h2>Across models</h2>", html_table(across, across_columns)]
    for table in peers or []:
        parts += [f"<h2>Against peers: {html.escape(table['model'])}</h2><ul>",
                  *[f"<li>{html.escape(line)}</li>" for line in table["notes"]], "</ul>",
                  html_table(table["rows"], table["columns"])]
    if graphs:
        parts += ["<h2>Graphs (inspection, and the change from fp32)</h2>", html_table(graphs, GRAPH_COLUMNS)]
    if sensitivity:
        parts += [f"<h2>INT8 sensitivity per MatMul role</h2><p>{html.escape(SENSITIVITY_NOTE)}</p>",
                  html_table(sensitivity, SENSITIVITY_COLUMNS)]
    if profiles:
        parts.append("<h2>Where the time goes (ONNX Runtime profiling)</h2>")
        for (model, variant), prof in profiles.items():
            parts.append(f"<h3>{html.escape(model)}/{html.escape(variant)}: {prof.get('total_ms', 0):.0f} ms kernel time</h3>")
            parts.append(html_table([{"op": o["op_type"], "pct": o["pct"], "ms": o["ms"], "calls": o["calls"]}
                                     for o in prof.get("ops", [])], ("op", "pct", "ms", "calls")))
    if generations:
        parts.append("<h2>Greedy generation against PyTorch (first prompt)</h2>")
        for (model, variant), details in generations.items():
            if details:
                d = details[0]
                parts.append(f"<h3>{html.escape(model)}/{html.escape(variant)}: {d['matched_tokens']}/"
                             f"{d['pytorch_tokens']} tokens matched</h3><p>{html.escape(d['prompt'])}</p>"
                             f"<pre>PyTorch: {html.escape(d['pytorch'])}</pre><pre>ONNX:    {html.escape(d['onnx'])}</pre>")
    if pipeline:
        parts += ["<h2>Pipeline: where the time goes</h2><ul>",
                  f"<li>total of job wall times: {pipeline['total_job_s'] / 60:.1f} min</li>",
                  f"<li>critical path: {pipeline['critical_path_s'] / 60:.1f} min: "
                  f"{html.escape(' → '.join(pipeline['critical_path']))}</li>",
                  f"<li>largest job peak RSS: {pipeline['peak_rss_mib']:.0f} MiB</li></ul>",
                  html_table(sorted(pipeline["rows"], key=lambda r: -r["wall_s"]), PIPELINE_COLUMNS)]
    parts += ["<h2>Columns</h2><ul>", *[f"<li><code>{c}</code>: {html.escape(d)}</li>" for c, d in docs.items()],
              "</ul></body></html>"]
    write_text(html_path, "\n".join(parts))


def build_report(
    models: Sequence[str],
    variants: Sequence[str],
    files: Mapping[str, Sequence[str | os.PathLike]],
    machine_json: str | os.PathLike,
    *,
    prompt_lengths: Sequence[int] = (32, 128, 512),
    results_dir: str | os.PathLike | None = None,
    pipeline_csv: str | os.PathLike | None = None,
    **outputs: Any,
) -> list[dict[str, Any]]:
    """Read every report JSON (see :func:`collect_rows` for ``files``) and write the combined report.

    ``outputs`` are :func:`write_report`'s ``markdown``, ``html_path``, ``csv_path``, ``json_path``
    and ``plots``. With ``results_dir``, the report gets the pipeline table of the jobs' benchmark
    files and logs there (:mod:`qwen_onnx.pipeline`), also written to ``pipeline_csv``.
    """
    from .pipeline import COLUMNS as PIPELINE_COLUMNS, pipeline_table

    machine = read_json(machine_json)
    rows = collect_rows(models, variants, files, machine, prompt_lengths)
    keys = [(m, v) for m in models for v in variants]
    profiles, generations = {}, {}
    for key, latency_path, accuracy_path in zip(keys, files["latency"], files["accuracy"]):
        latency = read_json(latency_path)
        if "profile" in latency:
            profiles[key] = latency["profile"]
        generations[key] = read_json(accuracy_path).get("generation", [])
    graphs = graph_rows(models, variants, files)
    sensitivity = sensitivity_rows(models, files.get("sensitivity", []))
    peer_paths = files.get("peers", [])
    pipeline = pipeline_table(results_dir, models) if results_dir is not None else None
    if pipeline is not None and pipeline_csv is not None:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(PIPELINE_COLUMNS), lineterminator="\n")
        writer.writeheader()
        writer.writerows(pipeline["rows"])
        write_text(pipeline_csv, buffer.getvalue())
    write_report(rows, machine, profiles=profiles, generations=generations, prompt_lengths=prompt_lengths,
                 graphs=graphs, sensitivity=sensitivity, peers=peer_tables(models, peer_paths),
                 peer_rows=peer_metric_rows(models, peer_paths, prompt_lengths), pipeline=pipeline, **outputs)
    return rows


GRAPH_COLUMNS = ("model", "variant", "nodes", "initializers", "bytes_on_disk", "opset", "quant_ops", "fused_ops",
                 "nodes_vs_fp32", "fusions_vs_fp32", "quantization_ops_vs_fp32", "architecture")


def graph_rows(models: Sequence[str], variants: Sequence[str], files: Mapping[str, Sequence]) -> list[dict[str, Any]]:
    """The inspection table: per (model, variant) its graph figures and its diff against fp32.

    ``files["diff"]`` holds the diff JSON of every variant except fp32, in (model, variant) order.
    """
    keys = [(m, v) for m in models for v in variants]
    inspect = dict(zip(keys, files["inspect"]))
    diffs = dict(zip([(m, v) for m in models for v in variants if v != "fp32"], files.get("diff", [])))
    out = []
    for key in keys:
        info = read_json(inspect[key])
        diff = read_json(diffs[key]) if key in diffs else None
        arch = info.get("architecture", {})
        out.append({
            "model": key[0],
            "variant": key[1],
            "nodes": info["nodes"],
            "initializers": info["initializers"]["count"],
            "bytes_on_disk": info["bytes_on_disk"],
            "opset": info["opsets"].get("ai.onnx"),
            "quant_ops": ", ".join(f"{k} {v}" for k, v in info.get("quant_ops", {}).items()) or "–",
            "fused_ops": ", ".join(f"{k} {v}" for k, v in info.get("op_types", {}).items() if k in FUSED_OPS) or "–",
            "nodes_vs_fp32": f"{diff['nodes']['change']:+d}" if diff else "–",
            "fusions_vs_fp32": ", ".join(f"{k} {v}" for k, v in diff["fusions"].items()) if diff and diff["fusions"] else "–",
            "quantization_ops_vs_fp32": ", ".join(f"{k} {v}" for k, v in diff["quantization_ops"].items())
            if diff and diff["quantization_ops"] else "–",
            "architecture": (f"{arch.get('layers')} layers, hidden {arch.get('hidden_size')}, "
                             f"{arch.get('attention_heads')} heads / {arch.get('kv_heads')} KV heads, "
                             f"head {arch.get('head_dim')}, vocab {arch.get('vocab_size')}, "
                             f"{'tied' if arch.get('tied_embeddings') else 'untied'}"
                             f"{', q/k norm' if arch.get('qk_norm') else ''}") if arch else "–",
        })
    return out


SENSITIVITY_COLUMNS = ("model", "role", "nodes", "sqnr_dynamic_db", "sqnr_static_db", "sqnr_blockwise_db",
                       "sqnr_weight_only_db", "worst_node", "worst_sqnr_dynamic_db")
SENSITIVITY_NOTE = ("median SQNR in dB of the INT8 product against the float one on calibration text, higher is "
                    "better; per node in results/MODEL/reports/sensitivity.md")


def sensitivity_rows(models: Sequence[str], paths: Sequence[str | os.PathLike]) -> list[dict[str, Any]]:
    """Per model and MatMul role: the median simulated SQNR of each INT8 scheme and the worst node.

    ``paths`` are the models' sensitivity JSON files (:func:`qwen_onnx.sensitivity.analyse_sensitivity`),
    in ``models`` order.
    """
    out = []
    for model, path in zip(models, paths):
        nodes = read_json(path)["nodes"]
        for role in dict.fromkeys(r["role"] for r in nodes):
            group = [r for r in nodes if r["role"] == role]
            worst = min(group, key=lambda r: r["sqnr_dynamic_db"])
            row: dict[str, Any] = {"model": model, "role": role, "nodes": len(group)}
            for key in ("sqnr_dynamic_db", "sqnr_static_db", "sqnr_blockwise_db", "sqnr_weight_only_db"):
                row[key] = round(float(np.median([r[key] for r in group])), 1) if key in group[0] else None
            row["worst_node"] = worst["name"]
            row["worst_sqnr_dynamic_db"] = round(worst["sqnr_dynamic_db"], 1)
            out.append(row)
    return out
