"""The report's rows: one per model and variant from its inspect, accuracy and latency files, the ratios to
PyTorch, the graph and sensitivity tables, and the recommendation per goal (the peers': :mod:`qwen_onnx.report.peer_rows`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from qwen_onnx.convert.tflite import tflite_skip_reason
from qwen_onnx.measure.inspect_graph import FUSED_OPS
from qwen_onnx.measure.task_accuracy import unresolved_note
from qwen_onnx.report.tables import COLUMNS, NOT_APPLICABLE, format_cell, label
from qwen_onnx.settings.gates import DEFAULT_TASK_GATE, gate_margins
from qwen_onnx.settings.variants import BY_NAME
from qwen_onnx.store.artifacts import read_json

#: The goals of "Which variant to ship": (name, column, ``min`` or ``max``).
GOALS: tuple[tuple[str, str, Any], ...] = (
    ("smallest that passes", "bytes_on_disk", min),
    ("fastest decode that passes", "decode_tok_s", max),
    ("fastest first token that passes", "ttft_ms", min),
)


ACCURACY_KEYS = ("ppl", "ppl_delta_pct", "kl_mean", "kl_median", "kl_p99", "top1_pct", "max_abs_logit_diff",
                  "mean_abs_logit_diff", "padded_batch_max_abs_diff", "padded_batch_nonfinite",
                  "kv_cache_max_abs_diff", "generation_match_pct")

_LATENCY_KEYS = ("load_s", "ttft_ms", "decode_tok_s", "peak_rss_mib", "bytes_on_disk", "weight_bytes_per_token",
                 "threads", "provider")

RATIO_OF = {
    "decode_speedup_vs_pytorch": "decode_tok_s",
    "ttft_vs_pytorch": "ttft_ms",
    "load_vs_pytorch": "load_s",
    "peak_rss_vs_pytorch": "peak_rss_mib",
    "bytes_vs_pytorch": "bytes_on_disk",
}


def task_files(paths: Sequence[str | os.PathLike]) -> dict[tuple[str, str], Path]:
    """``{(model, name): path}`` of task results ``results/{model}/reports/{name}.task.json`` (a variant or a peer)."""
    out = {}
    for path in map(Path, paths):
        out[(path.parents[1].name, path.name.removesuffix(".task.json"))] = path
    return out


def task_columns(task: Mapping[str, Any]) -> dict[str, Any]:
    """A row's task accuracy columns from its ``task.json`` (:func:`qwen_onnx.measure.task_accuracy.task_accuracy`):
    pass@1 with its interval, the paired comparison with fp32, the task gate, tokens and time. A set of problems
    too small to tell a loss from chance (:func:`qwen_onnx.measure.task_accuracy.unresolved_note`) gives no pass@1
    or paired figure, only its size, the gate and the note why."""
    if task.get("skipped"):
        return {"task_gate_note": f"task accuracy not measured: {task['skipped']}"}
    p_limit = (task.get("gate_limits") or {}).get("mcnemar_p", DEFAULT_TASK_GATE["mcnemar_p"])
    unresolved = unresolved_note(int(task["problems"]), p_limit)
    if unresolved:  # a subset that cannot tell a loss from chance gives no figure, only its size and why
        return {"task_problems": task["problems"], "task_gate": task.get("gate"), "task_gate_note": unresolved,
                "task_tokens": task.get("tokens"), "task_s": task.get("seconds")}
    paired = task.get("paired") or {}
    return {
        "task_problems": task["problems"], "pass_at_1_pct": task["pass_at_1_pct"],
        "pass_at_1_low_pct": task["pass_at_1_low_pct"], "pass_at_1_high_pct": task["pass_at_1_high_pct"],
        "task_gained": paired.get("gained"), "task_lost": paired.get("lost"), "task_mcnemar_p": paired.get("mcnemar_p"),
        "task_gate": task.get("gate"),
        "task_gate_note": "; ".join([*task.get("gate_failures", []), *task.get("gate_marginal", [])]) or None,
        "task_tokens": task.get("tokens"), "task_s": task.get("seconds"),
    }


def variant_keys(models: Sequence[str], variants: Sequence[str] | Mapping[str, Sequence[str]]) -> list[tuple[str, str]]:
    """(model, variant) in report order: ``variants`` is one list for every model, or a list per model."""
    return [(m, v) for m in models for v in (variants[m] if isinstance(variants, Mapping) else variants)]


def _diffed(variant: str) -> bool:
    """Whether the diff stage compares ``variant`` with fp32 (every ONNX variant but fp32: :data:`qwen_onnx.settings.variants.DIFFED`)."""

    return variant != "fp32" and (variant not in BY_NAME or BY_NAME[variant].format == "onnx")


def built_variants(models: Sequence[str], variants: Sequence[str] | Mapping[str, Sequence[str]],
                   tflite: Mapping[str, Mapping[str, Any]] | None = None) -> tuple[dict[str, list[str]], list[str]]:
    """Per model the variants the workflow built, and one line per variant it left out.

    Args:
        variants: the variants asked for (the config's ``variants.built``), in report order: one list
            for every model (e.g. :data:`qwen_onnx.settings.variants.NAMES`) or a list per model.
        tflite: per model its ``params_billion`` and ``tflite`` settings; the tflite variant is left
            out where :func:`qwen_onnx.convert.tflite.tflite_skip_reason` (the workflow's own decision) gives a
            reason. None: every variant of ``variants`` for every model.

    Returns:
        ``({model: [variant, ...]}, [reason, ...])``.
    """
    built, skipped = {}, []
    for model in models:
        reason = None
        asked = variants[model] if isinstance(variants, Mapping) else variants
        if tflite is not None and "tflite" in asked:
            settings = dict(tflite[model])
            reason = tflite_skip_reason(model, settings.pop("params_billion"), settings)
        built[model] = [v for v in asked if not (v == "tflite" and reason)]
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
    row["measured_by"] = ("peers" if latency.get("measured_in") == "peers.json"
                          else "not timed" if latency.get("timed") is False else "latency")
    row["eval_tokens"] = accuracy.get("tokens")
    for key in ACCURACY_KEYS:
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
    ratio_of = {**RATIO_OF, "prefill_vs_pytorch": f"prefill_ms_p50_{max(prompt_lengths)}"}
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
            ``pytorch``: one latency JSON per model; ``task`` (optional): the task results of the variants that
            have one (:func:`task_files`), in any order.
    """
    rows = []
    tasks = task_files(files.get("task", []))
    bandwidth = machine.get("memory_bandwidth_gb_s")
    keys = variant_keys(models, variants)
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
            if key in tasks:
                rows[-1].update(task_columns(read_json(tasks[key])))
    add_ratios(rows, prompt_lengths)
    return rows


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
            note = ", ".join(f"{r['variant']} ({format_cell(r[column], column)} {unit})" for r in better)
            if best.get("gate_marginal"):
                note = "; ".join(x for x in (note, f"{best['variant']} passes by a thin margin on "
                                                   f"{best.get('accuracy_isa') or 'this CPU'}: {best['gate_marginal']}") if x)
            if best.get("task_gate") == "FAIL":
                note = "; ".join(x for x in (note, f"{best['variant']} fails the task gate: {best['task_gate_note']}") if x)
            if best.get("timing_load") not in (None, "idle") and column in ("decode_tok_s", "ttft_ms"):
                note = "; ".join(x for x in (note, f"timed beside other load: {best['timing_load']}") if x)
            out.append({**{c: best.get(c) for c in ANSWER}, "goal": goal, "bold": column, "note": note})
    return out


GRAPH_COLUMNS = ("model", "variant", "nodes", "initializers", "bytes_on_disk", "opset", "quant_ops", "fused_ops",
                 "nodes_vs_fp32", "fusions_vs_fp32", "quantization_ops_vs_fp32", "architecture")


def graph_rows(models: Sequence[str], variants: Sequence[str] | Mapping[str, Sequence[str]],
               files: Mapping[str, Sequence]) -> list[dict[str, Any]]:
    """The inspection table: per (model, variant) its graph figures and its diff against fp32.

    ``files["diff"]`` holds the diff JSON of every ONNX variant except fp32 (:data:`qwen_onnx.settings.variants.DIFFED`;
    a tflite file is not diffed), in (model, variant) order.
    """
    keys = variant_keys(models, variants)
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


def precision_lines(models: Sequence[str], variants: Sequence[str] | Mapping[str, Sequence[str]],
                    files: Mapping[str, Sequence]) -> list[str]:
    """One line per int4 variant and per layer kind: its ``MatMulNBits`` options (bits/block, from the
    inspection's ``matmul_precision``); for a searched one (``quantize_int4.search``;
    :mod:`qwen_onnx.quantize.precision_search`) the options the search chose, the weight bytes read per
    token against all 8-bit, and the chosen map's figures on calibration text against the gate; for a variant
    with weights on a source grid, where its weights come from (:func:`weight_origin_line`)."""
    lines = []
    for (model, variant), path in zip(variant_keys(models, variants), files["inspect"]):
        info = read_json(path)
        origin = info.get("weight_origin") or {}
        # a float source's weights are all rounded from float: said only where a source grid was found
        origin_line = [weight_origin_line(f"{model}/{variant}", origin)] if origin.get("by_grid") else []
        search = info.get("precision_search")
        if not search:
            if variant == "int4":
                lines += [f"{model}/{variant} {role}: " + ", ".join(f"{n} × {k}" for k, n in options.items())
                          for role, options in (info.get("matmul_precision") or {}).items()]
            lines += origin_line
            continue
        chosen, gate = search.get("chosen") or {}, search["gate"]
        lines.append(f"{model}/{variant}: {search['weight_bytes_per_token'] / 1e6:.0f} MB of weights read per token "
                     f"(all 8-bit: {search['weight_bytes_per_token_all_8bit'] / 1e6:.0f} MB), {search['moves']} of "
                     f"{search['of_moves']} moves; on calibration text: perplexity "
                     f"{chosen.get('ppl_delta_pct', float('nan')):+.2f}% (gate {gate.get('ppl_delta_pct')}), KL "
                     f"{chosen.get('kl_mean', float('nan')):.4f} ({gate.get('kl_mean')}), top-1 "
                     f"{chosen.get('top1_pct', float('nan')):.1f}% ({gate.get('top1_pct')})")
        lines += [f"{model}/{variant} {role}: " + ", ".join(f"{n} × {k}" for k, n in options.items())
                  for role, options in search["by_role"].items()]
        lines += origin_line
    return lines


def weight_origin_line(name: str, origin: Mapping[str, Any]) -> str:
    """One line of where a variant's weight-MatMul weights come from
    (:func:`qwen_onnx.quantize.source_grid.weight_origins`), in millions of weights."""
    grids = ", ".join(f"{n / 1e6:.1f} M on {option}" for option, n in origin.get("by_grid", {}).items())
    return (f"{name}: weights {origin['carried_over'] / 1e6:.1f} M carried over from the source's grid exactly, "
            f"{origin['rounded_again'] / 1e6:.1f} M rounded a second time, {origin['rounded_from_float'] / 1e6:.1f} M "
            f"rounded from float" + (f", {origin['float'] / 1e6:.1f} M kept float" if origin.get("float") else "")
            + (f" (source grids: {grids})" if grids else ""))


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
