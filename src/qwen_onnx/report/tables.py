"""The report's columns, their labels and units, and the Markdown and HTML tables."""

from __future__ import annotations

import html
import math
from typing import Any, Iterable, Mapping, Sequence

from qwen_onnx.report.styles import swatch_html

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
    "pass_at_1_pct": "HumanEval pass@1, percent: greedy decoding, one answer per problem, the share whose tests pass "
                     "(task_accuracy stage; problems as `task_problems`)",
    "pass_at_1_low_pct": "low end of pass@1's 95% Wilson score interval, percent",
    "pass_at_1_high_pct": "high end of pass@1's 95% Wilson score interval, percent",
    "task_problems": "HumanEval problems the task accuracy ran (the same for every row of a model)",
    "task_gained": "problems this row passes and fp32 fails (paired, same problems)",
    "task_lost": "problems this row fails and fp32 passes",
    "task_mcnemar_p": "McNemar's exact two-sided p of the paired outcomes against fp32: below 0.05, a difference "
                      "beyond chance",
    "task_gate": "PASS or FAIL of the task gate (config `gates.task`): FAIL when pass@1 is more than "
                 "pass_at_1_drop_points below fp32's on the same problems and McNemar's p is at most mcnemar_p; "
                 "`reference` for fp32",
    "task_gate_note": "the task gate's failure, or a marginal pass: a drop over the limit within chance, which more "
                      "problems would settle",
    "task_tokens": "tokens generated over the HumanEval problems",
    "task_s": "wall time of the task accuracy job (generation and the sandboxed tests), seconds",
    "load_s": "session creation (from_pretrained for pytorch), seconds",
    "ttft_ms": "time to first token: prefill of the decode prompt plus argmax, median, ms",
    "decode_tok_s": "single-stream decode tokens/s with the KV cache, median",
    "peak_rss_mib": "peak RSS of the latency process, MiB",
    "weight_bytes_per_token": "bytes of weights read per decoded token (embedding and rotary tables as one row)",
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
    "pass_at_1_pct": "HumanEval pass@1 (%)",
    "pass_at_1_low_pct": "pass@1 95% low (%)",
    "pass_at_1_high_pct": "pass@1 95% high (%)",
    "task_problems": "HumanEval problems",
    "task_gained": "gained vs fp32",
    "task_lost": "lost vs fp32",
    "task_mcnemar_p": "McNemar p",
    "task_gate": "task gate",
    "task_gate_note": "task gate note",
    "task_tokens": "tokens generated",
    "task_s": "task time (s)",
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


TASK = ("model", "variant", "task_problems", "pass_at_1_pct", "pass_at_1_low_pct", "pass_at_1_high_pct", "task_gained",
        "task_lost", "task_mcnemar_p", "task_gate", "task_gate_note", "task_tokens", "task_s")


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

#: The cell of a figure a variant cannot have (the tflite variant's padded-batch parity: batch-1 signatures).
NOT_APPLICABLE = "n/a"


def format_cell(value: Any, column: str) -> str:
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
        if column == "task_mcnemar_p":
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
        cells = [format_cell(r.get(c), c) for c in columns]
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
            text = html.escape(format_cell(value, c))
            if styles and c in ("variant", "peer") and value in styles:
                text = swatch_html(value, styles[value])
            if c == r.get("bold") and value is not None:
                text = f"<b>{text}</b>"
            gate = c in ("gate", "task_gate")
            css = (" class='fail'" if gate and value == "FAIL" else " class='pass'" if gate and value == "PASS"
                   else _LEFT if isinstance(value, str) else "")
            cells.append(f"<td{css}>{text}</td>")
        group = " class='grp'" if "model" in columns and previous is not None and r.get("model") != previous else ""
        previous = r.get("model")
        body.append(f"<tr{group}>" + "".join(cells) + "</tr>")
    return f"<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
