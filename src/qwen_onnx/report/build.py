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
import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from qwen_onnx.store.artifacts import read_json, write_json, write_text
from qwen_onnx.settings.gates import gate_margins
from qwen_onnx.measure.inspect_graph import FUSED_OPS

#: Column name -> description (units in the text). Order is the CSV's; the prefill columns
#: ``prefill_ms_p50_{n}`` / ``prefill_ms_p90_{n}`` for each configured prompt length ``n`` follow ``load_s``
#: (see :func:`columns`).
COLUMNS: dict[str, str] = {
    "model": "config short name of the model",
    "variant": "variant folder name; `pytorch` is PyTorch eager fp32, the reference",
    "gate": "PASS or FAIL against the gate of the variant's kind (config `gates`)",
    "gate_failures": "the failing figures with their limits, `;`-separated",
    "gate_marginal": "passing figures within the gate's margin of their limit (1 point of top-1, 10% of the "
                     "other limits), `;`-separated: a verdict that may flip on another CPU or text",
    "accuracy_isa": "instruction set of the CPU the accuracy figures were computed on (qwen_onnx.run.machine.isa_name)",
    "int8_kernel": "onnxruntime MLAS U8S8 integer GEMM path on that CPU: VPDPBUSD/AMX sum exactly, VPMADDUBSW "
                   "(AVX2, AVX-512BW without VNNI) saturates int16 pair sums",
    "bytes_on_disk": "bytes of model.onnx + model.onnx_data (model.tflite for tflite, safetensors for pytorch)",
    "nodes": "ONNX graph node count (tflite: operators of the prefill signature)",
    "quant_ops": "quantization ops in the graph (QuantizeLinear/DequantizeLinear, MatMulInteger, ...; tflite: "
                 "weight tensors stored int8, int4 or float16)",
    "eval_tokens": "predicted tokens in the accuracy evaluation",
    "ppl": "perplexity on the evaluation text: exp(mean negative log-likelihood)",
    "ppl_delta_pct": "(ppl - ppl of PyTorch) / ppl of PyTorch, percent",
    "kl_mean": "KL(PyTorch || variant) per token, nats, mean",
    "kl_median": "KL per token, nats, median",
    "kl_p99": "KL per token, nats, 99th percentile",
    "top1_pct": "positions whose argmax token equals PyTorch's, percent",
    "max_abs_logit_diff": "max |logit - PyTorch logit| over all positions and the vocabulary",
    "mean_abs_logit_diff": "mean |logit - PyTorch logit|",
    "padded_batch_max_abs_diff": "max |Δlogit| between left-padded batch and each prompt alone, non-pad positions "
                                 "(n/a for tflite: its signatures are batch 1)",
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
    "speed_isa": "instruction set of the CPU the speed figures were measured on",
    "timing_load": "`idle`, or which rounds of the timing sitting ran beside other load (their figures are left "
                   "out of the medians unless every round was busy: `BUSY`)",
    "measured_by": "what timed the speed figures: `peers` (the model's timing sitting: every variant, PyTorch "
                   "and the peers in the same interleaved rounds, one process per measurement) or `latency` (a "
                   "variant timed on its own by `qwen-onnx latency`)",
}



#: Column name -> the header people read, with its unit: the one mapping from the machine names of
#: metrics.csv/json to the tables of report.md/html. Prefill columns, ``*_vs_peer`` ratios and
#: ``"<model> <column>"`` headers are derived by :func:`label`.
LABELS: dict[str, str] = {
    "gate_failures": "gate failures",
    "gate_marginal": "marginal pass",
    "accuracy_isa": "accuracy ISA",
    "int8_kernel": "INT8 kernel",
    "speed_isa": "speed ISA",
    "timing_load": "machine load while timed",
    "load_note": "machine load while timed",
    "bytes_on_disk": "size (MB)",
    "nodes": "graph nodes",
    "quant_ops": "quantization ops",
    "eval_tokens": "evaluated tokens",
    "ppl": "perplexity",
    "ppl_delta_pct": "perplexity Δ vs PyTorch (%)",
    "kl_mean": "KL mean (nats)",
    "kl_median": "KL median (nats)",
    "kl_p99": "KL p99 (nats)",
    "top1_pct": "top-1 agreement (%)",
    "max_abs_logit_diff": "max |Δlogit|",
    "mean_abs_logit_diff": "mean |Δlogit|",
    "padded_batch_max_abs_diff": "padded batch max |Δlogit|",
    "padded_batch_nonfinite": "padded batch NaN/inf (count)",
    "kv_cache_max_abs_diff": "KV cache max |Δlogit|",
    "generation_match_pct": "greedy tokens matched (%)",
    "load_s": "load (s)",
    "ttft_ms": "TTFT (ms)",
    "decode_tok_s": "decode (tokens/s)",
    "peak_rss_mib": "peak RSS (MiB)",
    "weight_bytes_per_token": "weights read per token (MB)",
    "roofline_tok_s": "decode roofline (tokens/s)",
    "roofline_pct": "decode / roofline (%)",
    "decode_speedup_vs_pytorch": "decode vs PyTorch (×)",
    "ttft_vs_pytorch": "TTFT vs PyTorch (×)",
    "prefill_vs_pytorch": "prefill, longest prompt, vs PyTorch (×)",
    "load_vs_pytorch": "load vs PyTorch (×)",
    "peak_rss_vs_pytorch": "peak RSS vs PyTorch (×)",
    "bytes_vs_pytorch": "size vs PyTorch (×)",
    "top_op": "top op (% of kernel time)",
    "measured_by": "measured by",
    "goal": "goal",
    "note": "note (better but failing variants; a thin-margin pass; a figure timed beside other load)",
    # the graph, sensitivity, peers and profile tables
    "initializers": "initializers",
    "fused_ops": "fused ops",
    "nodes_vs_fp32": "nodes vs fp32",
    "fusions_vs_fp32": "fusions vs fp32",
    "quantization_ops_vs_fp32": "quantization ops vs fp32",
    "role": "MatMul role",
    "sqnr_dynamic_db": "SQNR dynamic (dB)",
    "sqnr_static_db": "SQNR static (dB)",
    "sqnr_blockwise_db": "SQNR blockwise (dB)",
    "sqnr_weight_only_db": "SQNR weight-only (dB)",
    "worst_node": "worst MatMul",
    "worst_sqnr_dynamic_db": "worst SQNR dynamic (dB)",
    "skipped": "skipped because",
    "pct": "share of kernel time (%)",
    "ms": "kernel time (ms)",
    "wall_s": "wall time (s)",
    "cpu_s": "CPU time (s)",
    "critical": "on the critical path",
}


def label(column: str) -> str:
    """The header of ``column`` in report.md/html: :data:`LABELS`, or derived for
    ``prefill_ms_p50_{n}``/``prefill_ms_p90_{n}``/``prefill_ms_{n}`` (ms), ``{figure}_vs_peer`` and
    ``"{model} {column}"``; other names with their underscores as spaces."""
    if column in LABELS:
        return LABELS[column]
    for prefix, what in (("prefill_ms_p50_", "median"), ("prefill_ms_p90_", "p90"), ("prefill_ms_", "")):
        if column.startswith(prefix) and column[len(prefix):].isdigit():
            return f"prefill {column[len(prefix):]} tok{', ' + what if what else ''} (ms)"
    if column.endswith("_vs_peer"):
        base = label(column[: -len("_vs_peer")])
        return f"{base.rsplit(' (', 1)[0]} vs fastest peer (×)"
    if " " in column:
        head, _, tail = column.rpartition(" ")
        return f"{head}: {label(tail)}"
    return column.replace("_", " ")



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
    """Columns of the latency table for the configured prompt lengths: the medians people compare."""
    prefill = [f"prefill_ms_p50_{n}" for n in prompt_lengths]
    return ("model", "variant", "load_s", *prefill, "ttft_ms", "decode_tok_s", "peak_rss_mib", "bytes_on_disk")


def latency_detail_columns(prompt_lengths: Sequence[int]) -> tuple[str, ...]:
    """Columns of the second latency table: the 90th percentiles, the decode roofline and the session."""
    prefill = [f"prefill_ms_p90_{n}" for n in prompt_lengths]
    return ("model", "variant", *prefill, "weight_bytes_per_token", "roofline_tok_s", "roofline_pct", "threads",
            "provider", "top_op")


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


#: The cell of a figure a variant cannot have (the tflite variant's padded-batch parity: batch-1 signatures).
NOT_APPLICABLE = "n/a"


def _keys(models: Sequence[str], variants: Sequence[str] | Mapping[str, Sequence[str]]) -> list[tuple[str, str]]:
    """(model, variant) in report order: ``variants`` is one list for every model, or a list per model."""
    return [(m, v) for m in models for v in (variants[m] if isinstance(variants, Mapping) else variants)]


def _diffed(variant: str) -> bool:
    """Whether the diff stage compares ``variant`` with fp32 (every ONNX variant but fp32: :data:`qwen_onnx.settings.variants.DIFFED`)."""
    from qwen_onnx.settings.variants import BY_NAME

    return variant != "fp32" and (variant not in BY_NAME or BY_NAME[variant].format == "onnx")


def built_variants(models: Sequence[str], variants: Sequence[str],
                   tflite: Mapping[str, Mapping[str, Any]] | None = None) -> tuple[dict[str, list[str]], list[str]]:
    """Per model the variants the workflow built, and one line per variant it left out.

    Args:
        variants: the registry's variants (:data:`qwen_onnx.settings.variants.NAMES`), in report order.
        tflite: per model its ``params_billion`` and ``tflite`` settings; the tflite variant is left
            out where :func:`qwen_onnx.convert.tflite.tflite_skip_reason` (the workflow's own decision) gives a
            reason. None: every variant of ``variants`` for every model.

    Returns:
        ``({model: [variant, ...]}, [reason, ...])``.
    """
    from qwen_onnx.convert.tflite import tflite_skip_reason

    built, skipped = {}, []
    for model in models:
        reason = None
        if tflite is not None and "tflite" in variants:
            settings = dict(tflite[model])
            reason = tflite_skip_reason(model, settings.pop("params_billion"), settings)
        built[model] = [v for v in variants if not (v == "tflite" and reason)]
        if reason:
            skipped.append(reason)
    return built, skipped


def variant_row(model: str, variant: str, inspect: Mapping | None, accuracy: Mapping, latency: Mapping,
                bandwidth_gb_s: float | None) -> dict[str, Any]:
    """One report row from a variant's inspection, accuracy and latency JSON (a figure the accuracy
    JSON marks not applicable, such as a tflite variant's ``padded_batch``, is :data:`NOT_APPLICABLE`)."""
    row: dict[str, Any] = {c: None for c in COLUMNS}
    row.update(model=model, variant=variant)
    row["gate"] = accuracy.get("gate")
    row["gate_failures"] = "; ".join(accuracy.get("gate_failures", []))
    row["gate_marginal"] = "; ".join(gate_margins(accuracy, accuracy.get("gate_limits") or {})
                                     if accuracy.get("gate") == "PASS" else [])
    row["accuracy_isa"] = accuracy.get("isa")
    row["int8_kernel"] = accuracy.get("int8_kernel")
    row["speed_isa"] = latency.get("isa")
    row["timing_load"] = (latency.get("load_note") or "idle") if "busy" in latency else None
    row["measured_by"] = "peers" if latency.get("measured_in") == "peers.json" else "latency"
    row["eval_tokens"] = accuracy.get("tokens")
    for key in _ACCURACY_KEYS:
        row[key] = accuracy.get(key)
    if isinstance(accuracy.get("padded_batch"), str):  # "not applicable: ..." (qwen_onnx.measure.accuracy)
        row["padded_batch_max_abs_diff"] = row["padded_batch_nonfinite"] = NOT_APPLICABLE
    for key in _LATENCY_KEYS:
        row[key] = latency.get(key)
    for key, value in latency.items():
        if key.startswith(("prefill_ms_p50_", "prefill_ms_p90_")):
            row[key] = value
    if inspect is not None:
        row["nodes"] = inspect["nodes"]
        row["quant_ops"] = sum(inspect.get("quant_ops", {}).values())
    ops = (latency.get("profile") or {}).get("ops", [])
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
    variants: Sequence[str] | Mapping[str, Sequence[str]],
    files: Mapping[str, Sequence[str | os.PathLike]],
    machine: Mapping,
    prompt_lengths: Sequence[int],
) -> list[dict]:
    """Rows for every (model, variant), each model's ``pytorch`` row first.

    Args:
        variants: the variants of every model, or per model its own (:func:`built_variants`).
        files: ``inspect``, ``accuracy``, ``latency``: JSON paths in (model, variant) order;
            ``pytorch``: one latency JSON per model.
    """
    rows = []
    bandwidth = machine.get("memory_bandwidth_gb_s")
    keys = _keys(models, variants)
    by_key = {kind: dict(zip(keys, files[kind])) for kind in ("inspect", "accuracy", "latency")}
    for model, torch_latency in zip(models, files["pytorch"]):
        mine = [v for m, v in keys if m == model]
        fp32_accuracy = read_json(by_key["accuracy"][(model, mine[0])])
        rows.append(variant_row(model, "pytorch", None, pytorch_accuracy(fp32_accuracy), read_json(torch_latency),
                                bandwidth))
        for variant in mine:
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
    (:func:`qwen_onnx.measure.peers.run_peers`), ``variant`` = the peer's name, ``measured_by`` = ``peers``.

    Their ``*_vs_pytorch`` ratios divide by the ``pytorch`` row of the same sitting (the same
    interleaved rounds that time our variants).
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
                       provider=_PEER_PROVIDER[peer["peer"]], speed_isa=result.get("isa"),
                       timing_load=(peer.get("load_note") or "idle") if "busy" in peer else None)
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
    from qwen_onnx.measure.peers import peer_columns, peers_notes

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
    if column.rpartition(" ")[2] in ("bytes_on_disk", "weight_bytes_per_token") and isinstance(value, (int, float)):
        return f"{value / 1e6:.1f}"  # the header says MB
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        if column.endswith("ppl_delta_pct"):
            return f"{value:+.2f}" if round(value, 2) != 0 else "+0.00"  # never "-0.00"
        if column.startswith(("kl_", "max_abs", "mean_abs", "padded_batch_max", "kv_cache")):
            return f"{value:.3g}"
        if column.endswith(("_vs_pytorch", "_vs_peer")):
            return f"{value:.2f}×"
        return f"{value:.2f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def markdown_table(rows: Sequence[Mapping], columns: Iterable[str]) -> str:
    """A GitHub-flavoured Markdown table of ``rows``, headed by :func:`label`. A row's cell in the
    column named by its ``bold`` key is bold."""
    columns = list(columns)
    out = ["| " + " | ".join(label(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = [_fmt(r.get(c), c) for c in columns]
        cells = [f"**{t}**" if c == r.get("bold") and t != "–" else t for c, t in zip(columns, cells)]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


_LEFT = " class='t'"  # text columns left-aligned, numbers right


def html_table(rows: Sequence[Mapping], columns: Iterable[str], styles: Mapping[str, Any] | None = None) -> str:
    """An HTML table of ``rows`` in a horizontally scrolling ``div.scroll``, headed by
    :func:`label` (the machine name and its description in the tooltip).

    FAIL/PASS gate cells are marked; a row whose ``model`` differs from the row above starts a
    group (``tr.grp``, a heavier rule); with ``styles`` (:func:`qwen_onnx.report.styles.variant_styles`)
    each ``variant`` and ``peer`` cell starts with its plot marker in its colour; a row's cell in
    the column named by its ``bold`` key is bold.
    """
    from qwen_onnx.report.styles import swatch_html

    columns = list(columns)
    text = {c for c in columns if isinstance(next((r[c] for r in rows if r.get(c) is not None), None), str)}
    head = "".join(f"<th{_LEFT if c in text else ''} title='{html.escape(c)}: {html.escape(COLUMNS.get(c, ''))}'>"
                   f"{html.escape(label(c))}</th>" for c in columns)
    body = []
    previous = None
    for r in rows:
        cells = []
        for c in columns:
            value = r.get(c)
            text = html.escape(_fmt(value, c))
            if styles and c in ("variant", "peer") and value in styles:
                text = swatch_html(value, styles[value])
            if c == r.get("bold") and value is not None:
                text = f"<b>{text}</b>"
            css = (" class='fail'" if c == "gate" and value == "FAIL" else " class='pass'" if c == "gate" and value == "PASS"
                   else _LEFT if isinstance(value, str) else "")
            cells.append(f"<td{css}>{text}</td>")
        group = " class='grp'" if "model" in columns and previous is not None and r.get("model") != previous else ""
        previous = r.get("model")
        body.append(f"<tr{group}>" + "".join(cells) + "</tr>")
    return f"<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"


def cross_model_rows(rows: Sequence[Mapping]) -> tuple[list[dict[str, Any]], list[str]]:
    """The models side by side: one row per variant (``pytorch`` first), per model its size (MB),
    perplexity change (%) and decode tokens/s, in columns ``"<model> <column>"``. Returns the rows
    and their columns."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    by_key = {(r["model"], r["variant"]): r for r in rows}
    figures = ("bytes_on_disk", "ppl_delta_pct", "decode_tok_s")
    columns = ["variant", *[f"{m} {f}" for m in models for f in figures]]
    out = []
    for variant in dict.fromkeys(r["variant"] for r in rows):
        row: dict[str, Any] = {"variant": variant}
        for m in models:
            for f in figures:
                row[f"{m} {f}"] = by_key.get((m, variant), {}).get(f)
        out.append(row)
    return out, columns


#: The goals of "Which variant to ship": (name, column, ``min`` or ``max``).
GOALS: tuple[tuple[str, str, Any], ...] = (
    ("smallest that passes", "bytes_on_disk", min),
    ("fastest decode that passes", "decode_tok_s", max),
    ("fastest first token that passes", "ttft_ms", min),
)
#: The columns of the "Which variant to ship" table.
ANSWER = ("model", "goal", "variant", "bytes_on_disk", "ppl_delta_pct", "top1_pct", "decode_tok_s", "ttft_ms",
          "note")


def recommend(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Which variant to ship, per model and goal (:data:`GOALS`), from the report's rows.

    Candidates are a model's rows whose ``gate`` is ``PASS`` (``pytorch``, the reference, and the
    peers, which have no gate, never are). For each goal the candidate with the smallest size
    (``bytes_on_disk``), the most decode tokens/s or the shortest TTFT (ms) wins; a tie goes to
    the earlier row (registry order). Candidates without the goal's figure are skipped.

    Returns:
        Rows of :data:`ANSWER` columns plus ``bold`` (the goal's column); ``note`` names the
        variants that would have won the goal but FAIL their gate, with their figure (the report's
        verdict line below gives their failures). A model
        without a passing variant has one row, ``goal`` ``"none passes"``, ``variant`` None and
        a ``note`` naming its failing variants.
    """
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        passing = [r for r in mine if r.get("gate") == "PASS"]
        if not passing:
            failing = [r["variant"] for r in mine if r.get("gate") == "FAIL"]
            out.append({"model": model, "goal": "none passes", "variant": None, "bold": None,
                        "note": f"No variant of {model} passes its gate"
                                + (f" ({', '.join(failing)} fail)" if failing else "") + ": nothing to ship."})
            continue
        for goal, column, pick in GOALS:
            have = [r for r in passing if r.get(column) is not None]
            if not have:
                out.append({"model": model, "goal": goal, "variant": None, "bold": None,
                            "note": f"No passing variant of {model} has {label(column)}."})
                continue
            best = pick(have, key=lambda r: r[column])
            better = [r for r in mine if r.get("gate") == "FAIL" and r.get(column) is not None
                      and pick(r[column], best[column]) == r[column] != best[column]]
            unit = label(column).rpartition("(")[2].rstrip(")")
            note = ", ".join(f"{r['variant']} ({_fmt(r[column], column)} {unit})" for r in better)
            if best.get("gate_marginal"):
                note = "; ".join(x for x in (note, f"{best['variant']} passes by a thin margin on "
                                                   f"{best.get('accuracy_isa') or 'this CPU'}: {best['gate_marginal']}") if x)
            if best.get("timing_load") not in (None, "idle") and column in ("decode_tok_s", "ttft_ms"):
                note = "; ".join(x for x in (note, f"timed beside other load: {best['timing_load']}") if x)
            out.append({**{c: best.get(c) for c in ANSWER}, "goal": goal, "bold": column, "note": note})
    return out


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
    skipped: Sequence[str] | None = None,
) -> None:
    """Write the CSV, JSON, Markdown and HTML reports and the three plots.

    Both human reports open with "Which variant to ship" (:func:`recommend`), then the gate
    verdict and the machine; every table is headed by :func:`label` and, in HTML, scrolls
    sideways when wider than the page; every variant has one colour and marker
    (:mod:`qwen_onnx.report.styles`) in the plots and the HTML tables' swatches.

    Args:
        rows: from :func:`collect_rows`.
        machine: from :func:`qwen_onnx.run.machine.describe_machine`.
        plots: paths for ``ppl_vs_size``, ``decode_tok_s`` and ``prefill_latency`` PNGs.
        profiles: per (model, variant), the ``profile`` of its latency JSON.
        generations: per (model, variant), the ``generation`` details of its accuracy JSON.
        graphs: from :func:`graph_rows`.
        sensitivity: from :func:`sensitivity_rows`.
        peers: from :func:`peer_tables` (the "Against peers" section).
        peer_rows: from :func:`peer_metric_rows`, appended to metrics.csv/json and drawn, hatched or
            dashed, in the decode and prefill plots (not in the tables, nor in "Which variant to ship").
        pipeline: from :func:`qwen_onnx.report.pipeline.pipeline_table` (the "Pipeline" section).
        skipped: one line per variant the workflow did not build, and why (:func:`built_variants`),
            listed under the gate verdict.
    """
    from qwen_onnx.report.pipeline import COLUMNS as PIPELINE_COLUMNS, pipeline_markdown
    from qwen_onnx.report.plots import CAPTIONS, plot_decode_speed, plot_ppl_vs_size, plot_prefill
    from qwen_onnx.report.styles import variant_styles

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

    failing = [r for r in rows if r.get("gate") == "FAIL"]
    verdict = (f"{len(failing)} variant(s) FAIL their gate: "
               + "; ".join(f"{r['model']}/{r['variant']}: {r['gate_failures']}" for r in failing)) if failing \
        else "Every variant passes its gate."
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
           markdown_table(rows, ACCURACY), "## Latency", "", markdown_table(rows, latency),
           "## Latency details and the decode roofline", "", markdown_table(rows, latency_details),
           "## Ratios to PyTorch", "", markdown_table(rows, RATIOS)]
    if len(models) > 1:
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
    parts += ["<h2>Columns</h2><p>Header in the tables, <code>name</code> in metrics.csv/json: description.</p><ul>",
              *[f"<li>{html.escape(label(c))}, <code>{c}</code>: {html.escape(d)}</li>" for c, d in docs.items()],
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
    tflite: Mapping[str, Mapping[str, Any]] | None = None,
    **outputs: Any,
) -> list[dict[str, Any]]:
    """Read every report JSON (see :func:`collect_rows` for ``files``) and write the combined report.

    ``outputs`` are :func:`write_report`'s ``markdown``, ``html_path``, ``csv_path``, ``json_path``
    and ``plots``. With ``results_dir``, the report gets the pipeline table of the jobs' benchmark
    files and logs there (:mod:`qwen_onnx.report.pipeline`), also written to ``pipeline_csv``. With
    ``tflite`` (per model ``params_billion`` and its ``tflite`` settings), the models whose tflite
    variant the workflow did not build have no tflite files and get one line each
    (:func:`built_variants`).
    """
    from qwen_onnx.report.pipeline import COLUMNS as PIPELINE_COLUMNS, pipeline_table

    machine = read_json(machine_json)
    variants, skipped = built_variants(models, variants, tflite)
    rows = collect_rows(models, variants, files, machine, prompt_lengths)
    keys = _keys(models, variants)
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
    write_report(rows, machine, profiles=profiles, generations=generations, prompt_lengths=prompt_lengths,
                 graphs=graphs, sensitivity=sensitivity, peers=peer_tables(models, peer_paths),
                 peer_rows=peer_metric_rows(models, peer_paths, prompt_lengths), pipeline=pipeline, skipped=skipped,
                 **outputs)
    return rows


GRAPH_COLUMNS = ("model", "variant", "nodes", "initializers", "bytes_on_disk", "opset", "quant_ops", "fused_ops",
                 "nodes_vs_fp32", "fusions_vs_fp32", "quantization_ops_vs_fp32", "architecture")


def graph_rows(models: Sequence[str], variants: Sequence[str] | Mapping[str, Sequence[str]],
               files: Mapping[str, Sequence]) -> list[dict[str, Any]]:
    """The inspection table: per (model, variant) its graph figures and its diff against fp32.

    ``files["diff"]`` holds the diff JSON of every ONNX variant except fp32 (:data:`qwen_onnx.settings.variants.DIFFED`;
    a tflite file is not diffed), in (model, variant) order.
    """
    keys = _keys(models, variants)
    inspect = dict(zip(keys, files["inspect"]))
    diffs = dict(zip([k for k in keys if _diffed(k[1])], files.get("diff", [])))
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
            "opset": info["opsets"].get("ai.onnx") if info.get("format") != "tflite" else "TFLite",
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

    ``paths`` are the models' sensitivity JSON files (:func:`qwen_onnx.quantize.sensitivity.analyse_sensitivity`),
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
