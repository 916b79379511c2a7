"""Accuracy gates: per variant kind, thresholds that mark a variant PASS or FAIL.

A gate is a mapping ``{figure: limit}``. Figures named in :data:`LOWER_IS_BETTER` fail when above
their limit, the others (``top1_pct``) when below. Whatever the thresholds, a variant fails when
its logits hold NaN/inf, its perplexity is not finite (a variant whose perplexity explodes is
never reported as fine), or its tokenizer differs from the source's added tokens
(``tokenizer_mismatch_count``, :mod:`qwen_onnx.measure.tokens`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

from qwen_onnx.errors import OptionError, QwenOnnxError
from qwen_onnx.settings.defaults import TFLITE
from qwen_onnx.settings.variants import VARIANTS
from qwen_onnx.store.artifacts import SIGNATURES_FILE

#: Figures where a larger value is worse.
LOWER_IS_BETTER = frozenset(
    {"ppl_delta_pct", "kl_mean", "kl_p99", "max_abs_logit_diff", "mean_abs_logit_diff",
     "padded_batch_max_abs_diff", "kv_cache_max_abs_diff"}
)
#: Figures where a smaller value is worse.
HIGHER_IS_BETTER = frozenset({"top1_pct", "generation_match_pct"})

#: Variant folder name -> gate kind in the config's ``gates`` section (from the variant registry).
VARIANT_KIND = {v.name: v.kind for v in VARIANTS}


#: Default limits per gate kind: the single home of the defaults. ``config.yaml``'s ``gates``
#: section states the same values (tests/test_robustness.py checks they agree); the workflow falls
#: back to these when a configuration leaves a kind out, and ``qwen-onnx accuracy`` applies them
#: unless given ``--gate``/``--no-gate``. Figures as in :func:`check_gate`; percent, nats, logits.
DEFAULT_GATES: dict[str, dict[str, float]] = {
    "float": {  # fp32, preprocessed, optimized: numerically the same model
        "ppl_delta_pct": 0.1,
        "top1_pct": 99.5,
        "max_abs_logit_diff": 0.05,
        "padded_batch_max_abs_diff": 0.05,
        "kv_cache_max_abs_diff": 0.05,
        "generation_match_pct": 90,
    },
    # fp16: float16 weights and activations, float32 at the edges (docs/fp16.md)
    "float16": {"ppl_delta_pct": 0.5, "top1_pct": 98},
    "int8_dynamic": {"ppl_delta_pct": 1.0, "top1_pct": 95, "kl_mean": 0.05},
    # the targets set for the fully static variant
    "int8_static": {"ppl_delta_pct": 2.0, "top1_pct": 93, "kl_mean": 0.03},
    "int8_mixed": {"ppl_delta_pct": 2.0, "top1_pct": 93, "kl_mean": 0.08},
    "int4": {"ppl_delta_pct": 3.0, "top1_pct": 90, "kl_mean": 0.1},
}


def default_gate(kind: str) -> dict[str, float]:
    """A copy of the default limits of gate ``kind`` (``float``, ``float16``, ``int8_dynamic``,
    ``int8_static``, ``int8_mixed``, ``int4``).

    Raises:
        KeyError: unknown kind.
    """
    if kind not in DEFAULT_GATES:
        raise KeyError(f"unknown gate kind {kind!r}; one of {', '.join(DEFAULT_GATES)}")
    return dict(DEFAULT_GATES[kind])


#: litert-torch quantization recipe (``tflite.quantize``) -> the gate kind whose limits the tflite
#: variant meets: int8 weights (with or without dynamic-range activations) as int8-dynamic, fp16
#: weights as fp16, none (fp32) as the float variants, int4 blocks as int4.
TFLITE_GATE_KINDS: dict[str, str] = {
    "dynamic_int8": "int8_dynamic",
    "weight_only_int8": "int8_dynamic",
    "fp16": "float16",
    "none": "float",
    "dynamic_int4_block32": "int4",
    "dynamic_int4_block128": "int4",
}


def tflite_gate_kind(quantize: str) -> str:
    """The gate kind of a tflite variant converted with litert-torch recipe ``quantize`` (:data:`TFLITE_GATE_KINDS`).

    Raises:
        OptionError: ``quantize`` is not one of :data:`qwen_onnx.settings.defaults.TFLITE_QUANTIZATIONS`.
    """
    if quantize not in TFLITE_GATE_KINDS:

        raise OptionError(f"tflite quantize {quantize!r} is unknown; give one of {', '.join(TFLITE_GATE_KINDS)}")
    return TFLITE_GATE_KINDS[quantize]


def variant_kind(variant: str, tflite_quantize: str = TFLITE["quantize"]) -> str:
    """Gate kind of a registered variant (:data:`qwen_onnx.settings.variants.VARIANTS`); the tflite variant's
    follows ``tflite_quantize``, its ``tflite.quantize`` (:func:`tflite_gate_kind`).

    Raises:
        KeyError: ``variant`` is not registered (a folder of another name: :func:`folder_gate_kind`).
    """
    if variant not in VARIANT_KIND:
        raise KeyError(f"unknown variant {variant!r}; known: {', '.join(VARIANT_KIND)}")
    kind = VARIANT_KIND[variant]
    return tflite_gate_kind(tflite_quantize) if kind == "tflite" else kind


#: The record each stage writes into the folder it builds, with its ``gate_kind``.
STAGE_RECORDS = ("quantize.json", "float16.json", "optimize.json", "preprocess.json", "export.json")


def folder_gate_kind(folder: str | os.PathLike) -> str:
    """Gate kind of a variant folder, as the stage that built it recorded: ``gate_kind`` in its
    ``quantize.json``, ``float16.json``, ``optimize.json``, ``preprocess.json`` or ``export.json``
    (:data:`STAGE_RECORDS`), a tflite folder's from the quantization in its ``tflite.json``; a folder
    written before stages recorded it, by its registered name (:func:`variant_kind`).

    Raises:
        QwenOnnxError: the folder records no kind and its name is not a registered variant (the
            message says to give the kind: ``--gate-kind`` on the command line).
    """
    path = Path(folder)
    if (path / SIGNATURES_FILE).is_file():
        return tflite_gate_kind(json.loads((path / SIGNATURES_FILE).read_text(encoding="utf-8"))["quantize"])
    for name in STAGE_RECORDS:
        record = path / name
        if record.is_file():
            kind = json.loads(record.read_text(encoding="utf-8")).get("gate_kind")
            if kind is not None:
                return kind
    name = os.path.basename(os.path.normpath(os.fspath(folder)))
    if name in VARIANT_KIND:
        return variant_kind(name)
    raise QwenOnnxError(f"{folder} records no gate kind (no gate_kind in {' or '.join(STAGE_RECORDS)}) and "
                        f"{name!r} is no registered variant; give the kind (--gate-kind, one of "
                        f"{', '.join(DEFAULT_GATES)}) or rebuild the folder")


#: A passing figure within this distance of its limit is "marginal": for the percentages in
#: :data:`HIGHER_IS_BETTER`, 1 point, or a tenth of the room between the limit and 100% where that
#: is less (a 99.5% float gate is marginal below 99.55%, not at 100%); a fraction of the limit for
#: the others. A verdict that close can flip with the CPU's integer kernels or with the text, so the
#: report says so.
MARGIN_POINTS = 1.0
MARGIN_FRACTION = 0.1


def gate_margins(metrics: Mapping[str, Any], limits: Mapping[str, float]) -> list[str]:
    """The figures that meet their limit by less than the margin (:data:`MARGIN_POINTS`,
    :data:`MARGIN_FRACTION`), each as ``"top1_pct 90.2 within 1 point of >= 90"``; empty when every
    figure has room (failing figures are :func:`check_gate`'s, not listed here)."""
    marginal = []
    for figure, limit in limits.items():
        if figure not in metrics or metrics[figure] is None:
            continue
        value = float(metrics[figure])
        if figure in HIGHER_IS_BETTER:
            margin = min(MARGIN_POINTS, MARGIN_FRACTION * (100.0 - limit))
            if limit <= value < limit + margin:
                marginal.append(f"{figure} {value:.4g} within {margin:.3g} point of >= {limit:g}")
        elif limit > 0 and limit - MARGIN_FRACTION * limit < value <= limit:
            marginal.append(f"{figure} {value:.4g} within {100 * MARGIN_FRACTION:g}% of <= {limit:g}")
    return marginal


def gate_load(metrics: Mapping[str, Any], limits: Mapping[str, float]) -> float:
    """How much of the room to its margin the closest figure of ``metrics`` uses: the largest, over ``limits``, of
    ``value / (limit - margin)`` for a figure that must stay low and ``(100 - value) / (100 - limit - margin)`` for
    a percentage that must stay high (:data:`HIGHER_IS_BETTER`), with :func:`gate_margins`' margins. 0 for the
    reference itself, 1 at the edge of the margin, above 1 marginal or failing; dimensionless.

    Raises:
        KeyError: a limit names a figure that ``metrics`` lacks.
    """
    load = 0.0
    for figure, limit in limits.items():
        value = float(metrics[figure])
        if figure in HIGHER_IS_BETTER:
            room = 100.0 - limit - min(MARGIN_POINTS, MARGIN_FRACTION * (100.0 - limit))
            used = (100.0 - value) / room if room > 0 else float("inf")
        else:
            room = limit * (1 - MARGIN_FRACTION)
            used = value / room if room > 0 else float("inf")
        load = max(load, used if math.isfinite(used) else float("inf"))
    return load


def check_gate(metrics: Mapping[str, Any], limits: Mapping[str, float]) -> tuple[str, list[str]]:
    """Compare ``metrics`` with ``limits``.

    Returns:
        ``("PASS", [])`` or ``("FAIL", failures)`` where each failure names the figure, its
        value and the limit, e.g. ``"ppl_delta_pct 593.1 > 2"``.

    Raises:
        KeyError: a limit names a figure that ``metrics`` lacks (a misconfigured gate must not
            pass silently).
    """
    failures = []
    nonfinite = int(metrics.get("nonfinite_logits", 0)) + int(metrics.get("padded_batch_nonfinite", 0))
    if nonfinite:
        failures.append(f"nonfinite logits {nonfinite} > 0")
    mismatched = int(metrics.get("tokenizer_mismatch_count", 0))
    if mismatched:
        shown = "; ".join(metrics.get("tokenizer_mismatches", [])[:2])
        failures.append(f"tokenizer differs from the source's added tokens in {mismatched} check(s): {shown}")
    ppl = metrics.get("ppl")
    if ppl is not None and not math.isfinite(float(ppl)):
        failures.append(f"ppl {ppl} is not finite")
    for figure, limit in limits.items():
        if figure not in metrics:
            raise KeyError(f"gate names {figure!r}, which the accuracy report does not have")
        value = float(metrics[figure])
        if figure in HIGHER_IS_BETTER:
            if not value >= limit:
                failures.append(f"{figure} {value:.4g} < {limit:g}")
        elif not value <= limit:  # also catches NaN
            failures.append(f"{figure} {value:.4g} > {limit:g}")
    return ("FAIL" if failures else "PASS"), failures


#: The task gate: HumanEval pass@1 of a variant against the reference (the fp32 ONNX variant) on the same
#: problems (:func:`check_task_gate`): a drop of more than ``pass_at_1_drop_points`` percentage points that is
#: also beyond chance, McNemar's exact p at most ``mcnemar_p`` (1: the point limit alone). ``config.yaml``'s
#: ``gates.task`` states it.
DEFAULT_TASK_GATE: dict[str, float] = {"pass_at_1_drop_points": 3.0, "mcnemar_p": 0.05}


def check_task_gate(drop_points: float, problems: int, mcnemar_p: float,
                    limits: Mapping[str, float]) -> tuple[str, list[str], list[str]]:
    """The task gate's verdict on a variant whose pass@1 is ``drop_points`` below the reference's on the same
    ``problems`` (negative: above it).

    A drop over the point limit fails only when the paired outcomes say it is no accident: on a subset one
    problem is many points (6.25 of 16), and a single lost problem would otherwise fail a variant whose answers
    differ from the reference's by chance. Such a drop passes with a marginal note, as the accuracy gates mark
    a verdict that may flip (:func:`gate_margins`): more problems settle it.

    Args:
        drop_points: reference pass@1 minus the variant's, percentage points (lost minus gained problems,
            over ``problems``, x 100).
        problems: problems both ran.
        mcnemar_p: McNemar's exact two-sided p of the paired outcomes.
        limits: ``pass_at_1_drop_points`` (none: PASS) and ``mcnemar_p`` (default 1: the point limit alone).

    Returns:
        ``(status, failures, marginal)``: ``PASS``/``FAIL``; a failure as
        ``"pass_at_1_drop_points 25 > 3 (McNemar p 0.0078 <= 0.05)"``; a marginal note for a drop over the limit
        within chance.

    Raises:
        KeyError: a limit the task gate does not have.
    """
    unknown = set(limits) - set(DEFAULT_TASK_GATE)
    if unknown:
        raise KeyError(f"task gate names {', '.join(sorted(unknown))}; the task gate has {', '.join(DEFAULT_TASK_GATE)}")
    if "pass_at_1_drop_points" not in limits or not drop_points > float(limits["pass_at_1_drop_points"]) + 1e-9:
        return "PASS", [], []
    limit, alpha = float(limits["pass_at_1_drop_points"]), float(limits.get("mcnemar_p", 1.0))
    if mcnemar_p <= alpha:
        return "FAIL", [f"pass_at_1_drop_points {drop_points:.3g} > {limit:g} (McNemar p {mcnemar_p:.2g} <= "
                        f"{alpha:g})"], []
    return "PASS", [], [f"pass@1 {drop_points:.3g} points below the reference, over {limit:g} but within chance "
                        f"(McNemar p {mcnemar_p:.2g} > {alpha:g} on {problems} problems): more problems settle it"]
