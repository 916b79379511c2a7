"""Accuracy gates: per variant kind, thresholds that mark a variant PASS or FAIL.

A gate is a mapping ``{figure: limit}``. Figures named in :data:`LOWER_IS_BETTER` fail when above
their limit, the others (``top1_pct``) when below. Whatever the thresholds, a variant fails when
its logits hold NaN/inf or its perplexity is not finite: a variant whose perplexity explodes is
never reported as fine.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

#: Figures where a larger value is worse.
LOWER_IS_BETTER = frozenset(
    {"ppl_delta_pct", "kl_mean", "kl_p99", "max_abs_logit_diff", "mean_abs_logit_diff",
     "padded_batch_max_abs_diff", "kv_cache_max_abs_diff"}
)
#: Figures where a smaller value is worse.
HIGHER_IS_BETTER = frozenset({"top1_pct", "generation_match_pct"})

#: Variant folder name -> gate kind in the config's ``gates`` section.
VARIANT_KIND = {
    "fp32": "float",
    "preprocessed": "float",
    "optimized": "float",
    "int8-dynamic": "int8_dynamic",
    "int8-static": "int8_static",
    "int4": "int4",
}


def variant_kind(variant: str) -> str:
    """Gate kind of a variant folder name (``float`` for unknown float variants)."""
    if variant in VARIANT_KIND:
        return VARIANT_KIND[variant]
    if "int4" in variant:
        return "int4"
    return "int8_static" if "static" in variant else "int8_dynamic" if "int8" in variant else "float"


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
