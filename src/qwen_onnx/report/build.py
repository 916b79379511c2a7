"""The combined report: one row per (model, variant), PyTorch fp32 as the variant ``pytorch``.

Outputs: ``metrics.csv`` and ``metrics.json`` (machines), ``report.md`` and a self-contained
``report.html`` with embedded matplotlib figures (people). Every column is described in
:data:`COLUMNS`; the same descriptions appear at the end of both human reports. The machine files
keep the column names; the human reports head each column with :func:`label` (words and units,
:data:`LABELS`) and list the mapping under "Columns". Both human reports open with the answer,
which variant to ship for which goal (:func:`recommend`).
"""

from __future__ import annotations

import base64
import csv
import html
import io
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from qwen_onnx.measure.humaneval import HUMANEVAL_SIZE
from qwen_onnx.report.model_card import write_model_cards
from qwen_onnx.report.peer_rows import peer_metric_rows, peer_tables
from qwen_onnx.report.pipeline import COLUMNS as PIPELINE_COLUMNS
from qwen_onnx.report.pipeline import pipeline_markdown, pipeline_table
from qwen_onnx.report.plots import (
    CAPTIONS,
    plot_accuracy_vs_speed,
    plot_decode_speed,
    plot_ppl_vs_size,
    plot_prefill,
)
from qwen_onnx.report.rows import (
    ANSWER,
    GRAPH_COLUMNS,
    SENSITIVITY_COLUMNS,
    SENSITIVITY_NOTE,
    built_variants,
    collect_rows,
    cross_model_rows,
    graph_rows,
    precision_lines,
    recommend,
    sensitivity_rows,
    variant_keys,
)
from qwen_onnx.report.styles import variant_styles
from qwen_onnx.report.tables import (
    ACCURACY,
    RATIOS,
    SUMMARY,
    TASK,
    columns,
    html_table,
    label,
    latency_columns,
    latency_detail_columns,
    markdown_table,
)
from qwen_onnx.store.artifacts import read_json, write_json, write_text


def _machine_lines(machine: Mapping) -> list[str]:
    versions = ", ".join(f"{k} {v}" for k, v in machine.get("library_versions", {}).items() if v)
    return [
        f"Instruction set: {machine.get('isa', 'not recorded')}; onnxruntime's INT8 kernel: "
        f"{machine.get('int8_kernel', 'not recorded')} (every accuracy and speed row names the ISA it ran on)",
        f"CPU: {machine.get('cpu_model')} ({machine.get('logical_cores')} logical cores, "
        f"flags {', '.join(machine.get('cpu_flags', [])) or 'none'}), {machine.get('memory_gib')} GiB RAM",
        f"Memory bandwidth (STREAM Copy convention, {machine.get('bandwidth_threads')} threads): "
        f"{machine.get('memory_bandwidth_gb_s')} GB/s",
        f"Libraries: {versions}",
    ]


def task_intro(task_rows: Sequence[Mapping[str, Any]], every: Sequence[Mapping[str, Any]] = ()) -> str:
    """The sentence of the task accuracy section: with ``task_rows`` (rows with a pass@1 figure), how many problems,
    how they were scored, what the interval buys; without them, why there are none: the task stage ran on too few
    problems to tell a loss from chance (a row of ``every`` with ``task_problems`` and no figure), or it did not run
    (it is the ``task`` target, not part of the default run)."""
    sizes = sorted({int(r["task_problems"]) for r in task_rows})
    if not sizes:
        unresolved = list(dict.fromkeys(r["task_gate_note"] for r in every
                                        if r.get("task_problems") and r.get("task_gate_note")))
        if unresolved:
            return "; ".join(unresolved) + "."
        return (f"HumanEval pass@1 not measured in this run: `snakemake --cores 4 task` scores all {HUMANEVAL_SIZE} "
                "problems for `task_accuracy.variants`, each paired against fp32 with McNemar's test "
                "(its cost: docs/evaluation.md, \"Task accuracy\").")
    n = "/".join(map(str, sizes))
    half = max((r["pass_at_1_high_pct"] - r["pass_at_1_low_pct"]) / 2 for r in task_rows)
    full = sizes == [HUMANEVAL_SIZE]
    subset = ("all 164 HumanEval problems" if full else
              f"{n} of the 164 HumanEval problems, spread evenly over the set (`task_accuracy.problems`)")
    return (f"pass@1 on {subset}: one chat turn per problem, greedy decoding, the answer's code and the problem's "
            f"tests run in a sandboxed process. The 95% interval is Wilson's, here up to ±{half:.0f} points wide, so "
            "compare variants by the paired columns: problems gained and lost against fp32 on the same problems, "
            "and McNemar's exact p. The task gate fails a variant more than `gates.task.pass_at_1_drop_points` below "
            "fp32 when McNemar's p is at most `gates.task.mcnemar_p` (docs/evaluation.md, \"Task accuracy\").")


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
    precision: Sequence[str] | None = None,
    peers: Sequence[Mapping[str, Any]] | None = None,
    peer_rows: Sequence[Mapping[str, Any]] | None = None,
    pipeline: Mapping[str, Any] | None = None,
    skipped: Sequence[str] | None = None,
    task_notes: Sequence[str] = (),
) -> None:
    """Write the CSV, JSON, Markdown and HTML reports and the three plots.

    Both human reports open with "Which variant to ship" (:func:`recommend`), then the gate
    verdict and the machine; every table is headed by :func:`label` and, in HTML, scrolls
    sideways when wider than the page; every variant has one colour and marker
    (:mod:`qwen_onnx.report.styles`) in the plots and the HTML tables' swatches.

    Args:
        rows: from :func:`collect_rows`.
        machine: from :func:`qwen_onnx.run.machine.describe_machine`.
        plots: paths for ``ppl_vs_size``, ``decode_tok_s``, ``prefill_latency`` and (optional)
            ``accuracy_vs_speed`` PNGs.
        profiles: per (model, variant), the ``profile`` of its latency JSON.
        generations: per (model, variant), the ``generation`` details of its accuracy JSON.
        graphs: from :func:`graph_rows`.
        sensitivity: from :func:`sensitivity_rows`.
        precision: from :func:`precision_lines` (the searched int4 variants' precision per layer kind).
        peers: from :func:`peer_tables` (the "Against peers" section).
        peer_rows: from :func:`peer_metric_rows`, appended to metrics.csv/json and drawn, hatched or
            dashed, in the decode and prefill plots (not in the tables, nor in "Which variant to ship").
        pipeline: from :func:`qwen_onnx.report.pipeline.pipeline_table` (the "Pipeline" section).
        skipped: one line per variant the workflow did not build, and why (:func:`built_variants`),
            listed under the gate verdict.
        task_notes: task results on disk left out, and why (:func:`qwen_onnx.store.task_results.current_task_files`),
            after the task section's sentence.
    """
    buffer = io.StringIO()
    docs = columns(prompt_lengths)
    writer = csv.DictWriter(buffer, fieldnames=list(docs), lineterminator="\n")
    writer.writeheader()
    writer.writerows([*rows, *(peer_rows or [])])
    write_text(csv_path, buffer.getvalue())  # every file through a rename: a killed report leaves none half-written
    write_json(json_path, [*rows, *(peer_rows or [])])

    # one style per name for every figure and table: our variants, then the peers
    styles = variant_styles([*(r["variant"] for r in rows), *(r["variant"] for r in peer_rows or []),
                             *(r.get("peer") for t in peers or [] for r in t["rows"] if r.get("peer"))])
    plot_ppl_vs_size(rows, plots["ppl_vs_size"], styles)
    plot_decode_speed([*rows, *(peer_rows or [])], plots["decode_tok_s"], styles)
    plot_prefill([*rows, *(peer_rows or [])], prompt_lengths, plots["prefill_latency"], styles)
    if "accuracy_vs_speed" in plots:
        plot_accuracy_vs_speed([*rows, *(peer_rows or [])], plots["accuracy_vs_speed"], styles)

    failing = [r for r in rows if r.get("gate") == "FAIL"]
    verdict = (f"{len(failing)} variant(s) FAIL their gate: "
               + "; ".join(f"{r['model']}/{r['variant']}: {r['gate_failures']}" for r in failing)) if failing \
        else "Every variant passes its gate."
    task_rows = [r for r in [*rows, *(peer_rows or [])] if r.get("pass_at_1_pct") is not None]
    task_failing = [r for r in task_rows if r.get("task_gate") == "FAIL"]
    if task_failing:
        verdict += (f" {len(task_failing)} FAIL the task gate (HumanEval pass@1 against fp32): "
                    + "; ".join(f"{r['model']}/{r['variant']}: {r['task_gate_note']}" for r in task_failing))
    task_note = " ".join([task_intro(task_rows, [*rows, *(peer_rows or [])]), *(f"{n}." for n in task_notes)])
    models = list(dict.fromkeys(r["model"] for r in rows))
    intro = (f"Models: {', '.join(models)}. Accuracy is against PyTorch fp32 (`pytorch`) on the evaluation text; "
             "latency is single-stream on the CPU, same thread count for every variant.")
    answer = recommend(rows)
    answer_rows = [r for r in answer if r["variant"] is not None]
    answer_notes = [r["note"] for r in answer if r["variant"] is None]
    answer_intro = ("Per model, among the variants that PASS their gate (PyTorch is the reference; the peers "
                    "have no gate): the smallest on disk, the fastest decoder and the shortest time to first "
                    "token. The deciding figure is bold.")
    across, across_columns = cross_model_rows(rows)
    latency, latency_details = latency_columns(prompt_lengths), latency_detail_columns(prompt_lengths)

    md = ["# qwen-onnx report", "", intro, "", "## Which variant to ship", "", answer_intro, ""]
    if answer_rows:
        md += [markdown_table(answer_rows, ANSWER)]
    md += [*[f"**{n}**\n" for n in answer_notes],
           f"**{verdict}**", "", *[f"- {line}" for line in skipped or []], *([""] if skipped else []),
           *[f"- {line}" for line in _machine_lines(machine)], "",
           "## Summary", "", markdown_table(rows, SUMMARY), "## Accuracy", "",
           markdown_table(rows, ACCURACY),
           "## Task accuracy (HumanEval pass@1)", "", task_note, "",
           *([markdown_table(task_rows, TASK)] if task_rows else []),
           "## Latency", "", markdown_table(rows, latency),
           "## Latency details and the decode roofline", "", markdown_table(rows, latency_details),
           "## Ratios to PyTorch", "", markdown_table(rows, RATIOS)]
    if len(models) > 1:
        md += ["## Across models", "", markdown_table(across, across_columns)]
    for table in peers or []:
        md += [f"## Against peers: {table['model']}", "", *[f"- {line}" for line in table["notes"]], "",
               markdown_table(table["rows"], table["columns"])]
    if graphs:
        md += ["## Graphs (inspection, and the change from fp32)", "", markdown_table(graphs, GRAPH_COLUMNS)]
    if precision:
        md += ["## int4 precision (bits/block per layer kind)", "", *[f"- {x}" for x in precision], ""]
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
    md += ["## Columns", "", "Header in the tables, `name` in metrics.csv/json: description.", "",
           *[f"- {label(c)}, `{c}`: {d}" for c, d in docs.items()], ""]
    write_text(markdown, "\n".join(md))

    images = {name: base64.b64encode(Path(p).read_bytes()).decode() for name, p in plots.items()}
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>qwen-onnx report</title><style>",
        "body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;font-size:13px}",
        ".scroll{overflow-x:auto;max-width:100%;margin:1em 0}",
        "td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}th{background:#f3f3f3;vertical-align:bottom}",
        "td{white-space:nowrap}.t{text-align:left}tr.grp td{border-top:3px solid #888}",
        ".fail{background:#f8c9c4;font-weight:bold}.pass{background:#cdeccd}.sw{margin-right:4px}",
        "figure{margin:1em 0}img{max-width:100%}figcaption{font-size:13px;color:#444}",
        ".answer table{font-size:15px}.note{font-weight:bold}",
        "pre{white-space:pre-wrap;background:#f7f7f7;padding:4px;font-size:12px}",
        "</style></head><body><h1>qwen-onnx report</h1>",
        f"<p>{html.escape(intro)}</p>",
        f"<h2>Which variant to ship</h2><div class='answer'><p>{html.escape(answer_intro)}</p>",
        html_table(answer_rows, ANSWER, styles) if answer_rows else "",
        *[f"<p class='note'>{html.escape(n)}</p>" for n in answer_notes],
        f"</div><p><b>{html.escape(verdict)}</b></p>",
        *([f"<ul class='skipped'>{''.join(f'<li>{html.escape(x)}</li>' for x in skipped)}</ul>"] if skipped else []),
        "<ul>",
        *[f"<li>{html.escape(x)}</li>" for x in _machine_lines(machine)], "</ul>",
        "<h2>Summary</h2>", html_table(rows, SUMMARY, styles),
        "<h2>Figures</h2>",
        *[f"<figure><img alt='{name}' src='data:image/png;base64,{data}'>"
          f"<figcaption>{html.escape(CAPTIONS.get(name, ''))}</figcaption></figure>" for name, data in images.items()],
        "<h2>Accuracy</h2>", html_table(rows, ACCURACY, styles),
        f"<h2>Task accuracy (HumanEval pass@1)</h2><p>{html.escape(task_note)}</p>",
        *([html_table(task_rows, TASK, styles)] if task_rows else []),
        "<h2>Latency</h2>", html_table(rows, latency, styles),
        "<h2>Latency details and the decode roofline</h2>", html_table(rows, latency_details, styles),
        "<h2>Ratios to PyTorch</h2>", html_table(rows, RATIOS, styles),
    ]
    if len(models) > 1:
        parts += ["<h2>Across models</h2>", html_table(across, across_columns, styles)]
    for table in peers or []:
        parts += [f"<h2>Against peers: {html.escape(table['model'])}</h2><ul>",
                  *[f"<li>{html.escape(line)}</li>" for line in table["notes"]], "</ul>",
                  html_table(table["rows"], table["columns"], styles)]
    if graphs:
        parts += ["<h2>Graphs (inspection, and the change from fp32)</h2>", html_table(graphs, GRAPH_COLUMNS, styles)]
    if precision:
        parts += ["<h2>int4 precision (bits/block per layer kind)</h2><ul>",
                  *[f"<li>{html.escape(x)}</li>" for x in precision], "</ul>"]
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
                  *([f"<li>core bound on {pipeline['cores']} cores: {pipeline['core_bound_s'] / 60:.1f} min</li>"]
                    if pipeline.get("core_bound_s") is not None else []),
                  *[f"<li>{html.escape(m['model'])} alone: at least {m['alone_at_least_s'] / 60:.1f} min (its own "
                    f"jobs' critical path {m['critical_path_s'] / 60:.1f} min)</li>" for m in pipeline.get("models", [])],
                  f"<li>largest job peak RSS: {pipeline['peak_rss_mib']:.0f} MiB</li></ul>",
                  html_table(sorted(pipeline["rows"], key=lambda r: -r["wall_s"]), PIPELINE_COLUMNS)]
    parts += ["<h2>Columns</h2><p>Header in the tables, <code>name</code> in metrics.csv/json: description.</p><ul>",
              *[f"<li>{html.escape(label(c))}, <code>{c}</code>: {html.escape(d)}</li>" for c, d in docs.items()],
              "</ul></body></html>"]
    write_text(html_path, "\n".join(parts))


def build_report(
    models: Sequence[str],
    variants: Sequence[str] | Mapping[str, Sequence[str]],
    files: Mapping[str, Sequence[str | os.PathLike]],
    machine_json: str | os.PathLike,
    *,
    prompt_lengths: Sequence[int] = (32, 128, 512),
    results_dir: str | os.PathLike | None = None,
    pipeline_csv: str | os.PathLike | None = None,
    tflite: Mapping[str, Mapping[str, Any]] | None = None,
    task_notes: Sequence[str] = (),
    **outputs: Any,
) -> list[dict[str, Any]]:
    """Read every report JSON (see :func:`collect_rows` for ``files``) and write the combined report.

    ``outputs`` are :func:`write_report`'s ``markdown``, ``html_path``, ``csv_path``, ``json_path``
    and ``plots``. With ``results_dir``, every variant folder gets its model card
    (:func:`qwen_onnx.report.model_card.write_model_cards`) and the report the pipeline table of the jobs' benchmark
    files and logs there (:mod:`qwen_onnx.report.pipeline`), also written to ``pipeline_csv``. With
    ``tflite`` (per model ``params_billion`` and its ``tflite`` settings), the models whose tflite
    variant the workflow did not build have no tflite files and get one line each
    (:func:`built_variants`). ``task_notes``: task results an earlier ``task`` run left that are no longer current
    (:func:`qwen_onnx.store.task_results.current_task_files`), one line each in the task section.
    """
    machine = read_json(machine_json)
    variants, skipped = built_variants(models, variants, tflite)
    rows = collect_rows(models, variants, files, machine, prompt_lengths)
    if results_dir is not None:
        write_model_cards(results_dir, rows, machine)
    keys = variant_keys(models, variants)
    profiles, generations = {}, {}
    for key, latency_path, accuracy_path in zip(keys, files["latency"], files["accuracy"]):
        latency = read_json(latency_path)
        if latency.get("profile"):  # a tflite variant has none
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
    peer_rows = peer_metric_rows(models, peer_paths, prompt_lengths, files.get("task", []))
    write_report(rows, machine, profiles=profiles, generations=generations, prompt_lengths=prompt_lengths,
                 graphs=graphs, sensitivity=sensitivity, precision=precision_lines(models, variants, files),
                 peers=peer_tables(models, peer_paths, [*rows, *peer_rows]),
                 peer_rows=peer_rows, pipeline=pipeline, skipped=skipped, task_notes=task_notes,
                 **outputs)
    return rows


