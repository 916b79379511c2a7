"""The int4 variant's per-MatMul precision chosen by search: the fewest weight bytes read per token
that still pass the int4 gate with a margin on the calibration text.

Method, after Olive's ``SelectiveMixedPrecision`` (its ``snr`` selector ranks layers by the
signal-to-noise ratio of their quantized weights) and llama.cpp's Q4_K_M mix (wider types where
they matter), on the options MatMulNBits offers a CPU (:data:`OPTIONS`):

1. **Error of every option of every weight MatMul** (:func:`option_errors`): the weight quantized
   by the int4 stage's own k-quant search (:func:`qwen_onnx.quantize.kquant.quantize_blocks`, with
   the calibration text's activation importance), and its relative product error
   ``sum_k imp_k sum_n (w - ŵ)^2 / sum_k imp_k sum_n w^2`` (``imp_k`` the mean squared activation
   of input channel ``k``: the expected ``|X(W - Ŵ)|^2 / |XW|^2`` for independent channels; the
   inverse of Olive's SNR).
   The weight error says little about how much a layer kind matters downstream: on the 0.5B the
   lm_head's 4-bit error looked cheap per byte saved, yet moving it alone cost 3 points of top-1.
   So each layer kind is probed once (all its MatMuls at :data:`PROBE`, the rest 8-bit, built and
   scored end to end) and its errors are scaled so that they add up to that KL
   (:func:`calibrate_errors`): the price becomes the model's KL per byte saved, as Olive's
   ``kld_gradient`` selector estimates it with gradients.
2. **One path from all-8-bit to all-narrowest** (:func:`greedy_steps`): from every MatMul at the
   widest option, the next step is always the one move (one MatMul one option narrower) that adds
   the least error per byte saved.
3. **The edge of the gate along that path, aimed at** (:func:`predicted_prefix`): the calibrated errors add up
   to a predicted KL after every move (:func:`predicted_kl_path`), and the gate's load
   (:func:`qwen_onnx.settings.gates.gate_load`, 1 at the edge of the margin the report calls non-marginal) is
   taken to grow with it, at the ratio the probes measured. The first candidate is the most moves predicted
   to pass; each candidate is built as the shipped variant is, scored on calibration windows against the
   float graph (never on the evaluation windows the report scores), and its measured load corrects the
   ratio for the next (a secant, then regula falsi with bisection once the edge is bracketed). The search
   stops when the last pass and the first fail are adjacent moves (:data:`RESOLUTION`): a few candidates,
   where a binary search over the path takes ``log2(moves)``.

A weight a GGUF source stored on a grid ``MatMulNBits`` holds (:mod:`qwen_onnx.quantize.source_grid`) has one
more option, its exact carry-over (8-bit at block 32 for Q5_0 and Q8_0, at block 16 for Q6_K, 4-bit at block 16
for Q3_K), placed among the others by its bytes (:func:`matmul_options`); a 4-bit grid at block 32 (Q4_0, Q4_1,
Q4_K) is the 4/32 option itself. The path starts from every MatMul at its widest option, so a GGUF source's
path starts from its own weights, and each move off the exact option rounds that weight a second time.

Bytes (:func:`bytes_per_weight`): MatMulNBits stores ``bits / 8`` bytes a weight, a float32 scale
and a ``bits``-bit zero point per block; a decode step reads every weight MatMul once.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx

from qwen_onnx.quantize.blockwise import blockwise_int8_weight, cached_int8_weight
from qwen_onnx.quantize.gptq import Hessians
from qwen_onnx.quantize.kquant import BlockCache, quantize_weight
from qwen_onnx.quantize.matmuls import weight_matmuls
from qwen_onnx.quantize.source_grid import SourceGrid, cached_grid, grid_at

log = logging.getLogger(__name__)

#: (bits, block size) MatMulNBits options, widest first: 8-bit at the int4 stage's ``block_size_8bit``,
#: then 4-bit at blocks of 32 and 64 inputs (128 measured +11% perplexity on the 0.5B). Each step saves
#: bytes and decode time: 4-bit at block 16 is left out, since onnxruntime's kernel took 1.26x the time per
#: weight of 8-bit at block 128 on AVX-512 VNNI (``python -m lab.kernels``, docs/int4.md).
OPTIONS: tuple[tuple[int, int], ...] = ((8, 128), (4, 32), (4, 64))


def bytes_per_weight(bits: int, block: int) -> float:
    """Bytes MatMulNBits stores per weight: ``bits / 8``, plus a float32 scale and a ``bits``-bit
    zero point per ``block`` weights (onnxruntime contrib op ``MatMulNBits``)."""
    return bits / 8 + (4 + bits / 8) / block


def option_errors(model_dir: str | os.PathLike, importance: Mapping[str, np.ndarray],
                  options: Sequence[tuple[int, int]] = OPTIONS, threads: int = 1,
                  names: Sequence[str] | None = None, cache: BlockCache | None = None,
                  symmetric: bool = False, hessians: Hessians | None = None,
                  source_grid: bool = True) -> dict[str, dict[str, float]]:
    """The relative product error of every option for every weight MatMul of the float graph.

    Each option's weight is the one the int4 stage ships: 4-bit by :func:`qwen_onnx.quantize.kquant.quantize_weight`
    (k-quant with integer zero points and activation importance), 8-bit by onnxruntime's symmetric
    blockwise round to nearest (``quantize_matmul_8bits``, what :func:`qwen_onnx.quantize.blockwise.blockwise_int8`
    runs).

    Args:
        model_dir: a float variant folder (``model.onnx`` with external data).
        importance: ``{node name: float32 [in_features]}``, the mean squared input activation of each
            channel on calibration text (:func:`qwen_onnx.quantize.kquant.activation_importance`).
        options: (bits, block) pairs.
        threads: threads of the block search.
        names: the MatMuls to score (default every weight MatMul).
        cache: the 4-bit blocks, kept for the candidates built after (:data:`qwen_onnx.quantize.kquant.BlockCache`).
        symmetric: the 4-bit options without zero points.
        hessians: the 4-bit options with GPTQ's updates (:class:`qwen_onnx.quantize.gptq.Hessians`); their
            error is then the product's, ``trace((W - Ŵ)^T H (W - Ŵ))``, which GPTQ computes as it goes
            (the weight error alone would count its compensating updates as error).
        source_grid: a weight on a source grid is priced at that grid's option as the node that keeps it
            (:mod:`qwen_onnx.quantize.source_grid`), as the int4 stage builds it, and gets that option when
            ``options`` lack it (:func:`matmul_options`); its grid goes to ``cache``.

    Returns:
        ``{node name: {"bits/block": relative error}}``, dimensionless (0 is exact), each MatMul's options as
        :func:`matmul_options` gives them.
    """
    path = Path(model_dir) / "model.onnx"
    graph = onnx.load(str(path), load_external_data=False).graph
    out: dict[str, dict[str, float]] = {}
    for node, tensor in weight_matmuls(graph):
        if names is not None and node.name not in names:
            continue
        weight = onnx.numpy_helper.to_array(tensor, base_dir=str(path.parent)).astype(np.float32)  # [K, N]
        k = weight.shape[0]
        imp = np.asarray(importance[node.name], dtype=np.float64)
        signal = _weighted_squares(imp, weight)
        grid = cached_grid(node.name, lambda w=weight: w, cache) if source_grid else None
        out[node.name] = {}
        for key in matmul_options(grid, options):
            bits, block = parse_option(key)
            if (kept := grid_at(grid, bits, block, symmetric and bits == 4)) is not None:
                restored = kept.restored()
            elif bits == 8:
                # blockwise_int8_node's entry: the candidates reuse it
                packed, scales = cached_int8_weight(node.name, lambda w=weight: w, block, cache)
                restored = _int8_restored(packed, scales, k)
            else:
                q, scale, zero = quantize_weight(node.name, lambda w=weight: w, bits, block, importance, threads, symmetric,
                                                cache, hessians)
                product = None if hessians is None else hessians.errors.get((node.name, bits, block, symmetric))
                if product is not None:
                    out[node.name][key] = product / signal if signal > 0 else 0.0
                    continue
                restored = (scale * (q.astype(np.float32) - zero.astype(np.float32))).reshape(weight.shape[1], -1).T[:k]
            np.subtract(weight, restored, out=restored)
            out[node.name][key] = _weighted_squares(imp, restored) / signal if signal > 0 else 0.0
            del restored
        del weight
    return out


def matmul_options(grid: SourceGrid | None, options: Sequence[tuple[int, int]] = OPTIONS) -> tuple[str, ...]:
    """The option keys of one MatMul, widest first: ``options``, with the exact option of its source ``grid``
    among them by :func:`bytes_per_weight` when that is not one of them already."""
    found = {option_key(*o): bytes_per_weight(*o) for o in options}
    if grid is not None:
        found.setdefault(option_key(*grid.option), bytes_per_weight(*grid.option))
    return tuple(sorted(found, key=lambda key: -found[key]))


def _weighted_squares(importance: np.ndarray, matrix: np.ndarray) -> float:
    """``sum_k importance_k sum_n matrix_kn^2`` of float32 [K, N] with float64 [K] importance: each row's
    squares summed in float32, the rows weighted in float64."""
    return float(importance @ np.einsum("kn,kn->k", matrix, matrix).astype(np.float64))


def _blockwise_int8_restored(weight: np.ndarray, block: int) -> np.ndarray:
    """float32 [K, N]: ``weight`` after onnxruntime's symmetric 8-bit blockwise quantization
    (:func:`qwen_onnx.quantize.blockwise.blockwise_int8_weight`) and back."""
    return _int8_restored(*blockwise_int8_weight(weight, block), weight.shape[0])


def _int8_restored(packed: np.ndarray, scales: np.ndarray, k: int) -> np.ndarray:
    """float32 [K, N] from :func:`~qwen_onnx.quantize.blockwise.blockwise_int8_weight`'s ``(packed, scales)``."""
    n = packed.shape[0]
    restored = (packed.astype(np.float32) - 128.0) * scales[:, :, None]  # [N, k_blocks, block]
    return np.ascontiguousarray(restored.reshape(n, -1).T[:k])


#: The option every layer kind is probed at to scale its weight errors to the model's KL.
PROBE: tuple[int, int] = (4, 32)
#: ... unless most of the kind's weights are kept exactly at :data:`PROBE` (on their source's 4-bit grid,
#: :mod:`qwen_onnx.quantize.source_grid`): their KL there is the all-8-bit rest's, not theirs, and would
#: scale their tiny errors up to it; such a kind is probed at its first lossy option, this one.
LOSSY_PROBE: tuple[int, int] = (4, 64)


def probe_options(roles: Mapping[str, str], sizes: Mapping[str, int], exact: set[str] | frozenset[str] = frozenset()
                  ) -> dict[str, str]:
    """``{layer kind: option key}`` each kind is probed at: :data:`PROBE`, or :data:`LOSSY_PROBE` when more than
    half of the kind's weights (by count of weights, ``sizes``) belong to the MatMuls ``exact`` (kept exactly at
    :data:`PROBE`)."""
    total: dict[str, int] = {}
    kept: dict[str, int] = {}
    for name, role in roles.items():
        total[role] = total.get(role, 0) + sizes[name]
        kept[role] = kept.get(role, 0) + (sizes[name] if name in exact else 0)
    return {role: option_key(*(LOSSY_PROBE if 2 * kept[role] > total[role] else PROBE)) for role in total}


def calibrate_errors(errors: Mapping[str, Mapping[str, float]], roles: Mapping[str, str],
                     role_kl: Mapping[str, float], probe: str | Mapping[str, str]) -> dict[str, dict[str, float]]:
    """The weight errors scaled per layer kind to the model's KL divergence.

    For each ``role`` (layer kind), ``factor = role_kl[role] / sum(errors[n][probe] for n of that role)``:
    the role's MatMuls at ``probe`` then add up to the KL (nats) measured with that role alone at
    ``probe``; every option of those MatMuls is scaled by the same factor.

    Args:
        errors: from :func:`option_errors`.
        roles: ``{node name: layer kind}`` (:func:`qwen_onnx.quantize.matmuls.node_role`).
        role_kl: ``{layer kind: KL mean}`` measured end to end with that kind alone at ``probe``.
        probe: the option key the KL was measured at, one for all kinds or ``{layer kind: option key}``
            (:func:`probe_options`).

    Returns:
        ``{node name: {option key: estimated KL}}``.
    """
    probes = probe if isinstance(probe, Mapping) else dict.fromkeys(roles.values(), probe)
    totals: dict[str, float] = {}
    for name, role in roles.items():
        totals[role] = totals.get(role, 0.0) + errors[name][probes[role]]
    factor = {role: (role_kl[role] / totals[role]) if totals[role] > 0 else 0.0 for role in totals}
    return {name: {k: v * factor[roles[name]] for k, v in errors[name].items()} for name in errors}


def option_key(bits: int, block: int) -> str:
    """``"4/32"`` for 4-bit at block 32: the precision map's spelling of an option."""
    return f"{bits}/{block}"


def parse_option(key: str) -> tuple[int, int]:
    """``"4/32"`` -> ``(4, 32)``."""
    bits, block = key.split("/")
    return int(bits), int(block)


def option_weights(name: str, key: str, weights: Mapping[str, int],
                   widened: Mapping[str, tuple[str, float]] | None) -> float:
    """Weights MatMul ``name`` stores at option ``key``: ``weights[name]`` (K x N), times the factor ``(K + rows) / K``
    of ``widened[name] = (option key, factor)`` at that option, for a MatMul kept on its source grid with its
    block-sum rows (:mod:`qwen_onnx.quantize.source_grid`)."""
    if widened and name in widened and key == widened[name][0]:
        return weights[name] * widened[name][1]
    return float(weights[name])


def greedy_steps(errors: Mapping[str, Mapping[str, float]], weights: Mapping[str, int],
                 options: Sequence[tuple[int, int]] | Mapping[str, Sequence[str]] = OPTIONS,
                 widened: Mapping[str, tuple[str, float]] | None = None) -> list[tuple[str, str]]:
    """The path from every MatMul at its widest option to every one at its narrowest, one move at a time.

    Each move takes one MatMul one option narrower; the next move is always the one with the least
    added error per byte saved (error from ``errors``, bytes ``weights[name] x`` the drop in
    :func:`bytes_per_weight`). A move that saves no bytes, or one whose error goes down, comes first.

    Args:
        errors: from :func:`option_errors`.
        weights: ``{node name: number of weights (K x N)}``.
        options: ``(bits, block)`` pairs widest first, the same for every MatMul, or ``{node name: option keys
            widest first}`` (:func:`matmul_options`).
        widened: ``{node name: (option key, (K + rows) / K)}`` of the MatMuls kept on their source grid with block
            sums (:func:`option_weights`).

    Returns:
        ``[(node name, option key after the move), ...]``, one move per option past each MatMul's first.
    """
    keys = ({name: list(options[name]) for name in errors} if isinstance(options, Mapping)
            else dict.fromkeys(errors, [option_key(*o) for o in options]))
    level = dict.fromkeys(errors, 0)
    steps = []

    def price(name: str) -> float:
        i, ladder = level[name], keys[name]
        saved = (option_weights(name, ladder[i], weights, widened) * bytes_per_weight(*parse_option(ladder[i]))
                 - option_weights(name, ladder[i + 1], weights, widened) * bytes_per_weight(*parse_option(ladder[i + 1])))
        added = errors[name][ladder[i + 1]] - errors[name][ladder[i]]
        return added / saved if saved > 0 else float("-inf")

    while True:
        movable = [n for n in errors if level[n] + 1 < len(keys[n])]
        if not movable:
            return steps
        name = min(movable, key=lambda n: (price(n), n))
        level[name] += 1
        steps.append((name, keys[name][level[name]]))


def precision_after(steps: Sequence[tuple[str, str]], names: Sequence[str], taken: int,
                    widest: tuple[int, int] | Mapping[str, str] = OPTIONS[0]) -> dict[str, str]:
    """The precision map after the first ``taken`` moves of ``steps``: ``{node name: option key}``, from ``widest``
    (one option for every MatMul, or ``{node name: option key}``)."""
    precision = (dict(widest) if isinstance(widest, Mapping) else dict.fromkeys(names, option_key(*widest)))
    for name, key in steps[:taken]:
        precision[name] = key
    return precision


def weight_bytes(precision: Mapping[str, str], weights: Mapping[str, int],
                 widened: Mapping[str, tuple[str, float]] | None = None) -> float:
    """Bytes of the weight MatMuls under ``precision``: what one decode step reads of them (``widened`` as
    :func:`option_weights`)."""
    return float(sum(option_weights(n, k, weights, widened) * bytes_per_weight(*parse_option(k))
                     for n, k in precision.items()))


#: The search along the path stops once the moves between the last candidate that passed and the first that
#: failed would save at most this fraction of the bytes (:func:`predicted_prefix`); 0: only when they are adjacent
#: (a move saves a fraction of a percent, as much as any stop would keep; docs/int4.md).
RESOLUTION = 0.0


def predicted_kl(precision: Mapping[str, str], scaled: Mapping[str, Mapping[str, float]]) -> float:
    """The predicted KL divergence (nats) of a precision map ``{node name: option key}``: the sum of its MatMuls'
    calibrated errors (:func:`calibrate_errors`), taken to add up as independent noise does."""
    return float(sum(scaled[name][key] for name, key in precision.items()))


def predicted_kl_path(steps: Sequence[tuple[str, str]], scaled: Mapping[str, Mapping[str, float]],
                      start: Mapping[str, str]) -> np.ndarray:
    """The predicted KL divergence after each prefix of ``steps``: float64 [moves + 1], nats, entry ``t`` the sum of
    the calibrated errors (:func:`calibrate_errors`' ``scaled``) of every MatMul at its option after ``t`` moves from
    ``start``, made nondecreasing (a move whose error goes down comes first on the path and is never the edge)."""
    kl = [predicted_kl(start, scaled)]
    level = dict(start)
    for name, key in steps:
        kl.append(kl[-1] + scaled[name][key] - scaled[name][level[name]])
        level[name] = key
    return np.maximum.accumulate(np.asarray(kl, dtype=np.float64))


def _line(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """``(slope, intercept)`` of the least-squares line through ``points``, None when it does not rise."""
    xs = np.asarray([x for x, _ in points], dtype=np.float64)
    if len(points) < 2 or np.ptp(xs) <= 0:
        return None
    slope, intercept = np.polyfit(xs, np.asarray([y for _, y in points], dtype=np.float64), 1)
    return (float(slope), float(intercept)) if slope > 0 else None


def load_line_target(known: Sequence[tuple[float, float]], tried: Sequence[tuple[float, float]] = ()) -> float | None:
    """The predicted KL (nats) at which the gate's load is expected to reach 1, from ``(predicted KL, load)`` pairs:
    ``tried`` measured on the path, ``known`` off it (the layer kinds' probes, whose maps are not on the path, so
    that their loads may sit off its line).

    The least-squares line through the path's own points once there are two that rise; with one, the probes'
    slope through it; before any, the probes' line. Where a line does not rise (noise), the one through the origin
    and the latest point. None without a point of positive load.
    A path line far flatter than the probes' (under half their slope) through points that all fail is not trusted:
    two noisy loads a move apart fix no slope, and aimed back from above 1 such a line lands near the path's start
    (the 0.5B's 135 and 136 moves, both at load 1.006, sent the next try to 1 move). The probes' slope through the
    path's points is taken instead, as for a single point. Through passing points a flat line stays: the load can
    stall along a stretch of the path (the 1.5B's 140 to 149 moves all near 0.9), and the probes' steeper slope
    would then creep one move a try.
    """
    probes = _line(known)
    line = _line(tried)
    if line is not None and probes is not None and line[0] < probes[0] / 2 and all(y > 1 for _, y in tried):
        line = None
    if line is None and tried and probes is not None:
        line = (probes[0], float(np.mean([y - probes[0] * x for x, y in tried])))
    if line is None and not tried:
        line = probes
    if line is not None:
        return (1.0 - line[1]) / line[0]
    last = next(((x, y) for x, y in reversed([*known, *tried]) if y > 0 and x > 0), None)
    return None if last is None else last[0] / last[1]


def predicted_prefix(predicted: np.ndarray, try_at: Callable[[int], tuple[bool, float]],
                     known: Sequence[tuple[float, float]] = (), path_bytes: np.ndarray | None = None,
                     resolution: float = 0.0, max_tries: int = 8) -> int:
    """The most moves along the path that pass, found by aiming at the gate's edge with the predicted KL.

    The gate's load (:func:`qwen_onnx.settings.gates.gate_load`: 1 at the edge of the margin) is taken to grow with
    the predicted KL. Until a pass and a fail bracket the edge, the load is taken as a line in the predicted KL,
    fitted to the loads measured along the path and, before two are, to the probes' (``known``;
    :func:`load_line_target`): each try aims at the most moves predicted to stay at load 1. The line, not a ratio through the origin, since the load does not start at 0: the
    all-widest map already uses some of the room to the margin. Once a candidate has passed and one has failed,
    they bracket the edge, and each try aims where the load interpolated linearly in predicted KL between the two
    reaches 1: regula falsi, with the Illinois algorithm's halving of the end kept twice (Dowell and Jarratt, BIT
    11, 1971), so that a curved load does not make it creep.

    Args:
        predicted: float [moves + 1] nondecreasing, :func:`predicted_kl_path`.
        try_at: builds and scores the candidate with ``t`` moves: ``(passes with margin, gate load)``.
        known: ``(predicted KL, load)`` measured before the search (the layer kinds' probes).
        path_bytes: float [moves + 1], the weight bytes after ``t`` moves (:func:`weight_bytes`), for
        resolution: stop once the moves left between the last pass and the first fail save at most this fraction
            of the last pass's bytes.
        max_tries: the most candidates built.

    Returns:
        ``t``, 0 when no try passed (0 moves, every MatMul at its widest option, is taken to pass and never tried).
    """
    end = len(predicted)
    known = [(float(x), float(y)) for x, y in known if math.isfinite(y)]
    tried: list[tuple[float, float]] = []
    low, high = 0, end  # passes(low) holds; high: the fewest moves known to fail (none: past the end)
    low_load, high_load = -1.0, None  # their loads less 1, as regula falsi uses them
    kept = 0  # +n: the low end kept n tries running, -n: the high end
    for _ in range(max_tries):
        if high - low <= 1:
            break
        if path_bytes is not None and high < end and path_bytes[low] - path_bytes[high - 1] <= resolution * path_bytes[low]:
            break
        if high < end and low > 0:
            x_low, x_high = predicted[low], predicted[high]
            target = x_low + (x_high - x_low) * -low_load / (high_load - low_load) if high_load > low_load else x_low
        else:
            target = load_line_target(known, tried)
            target = predicted[high - 1] if target is None else target
        aim = min(max(int(np.searchsorted(predicted, target, side="right")) - 1, low + 1), high - 1)
        passed, load = try_at(aim)
        shifted = (load - 1.0) if math.isfinite(load) else 1.0
        if passed:
            low, low_load, kept = aim, min(shifted, 0.0), max(kept, 0) + 1
            if kept >= 2 and high_load is not None:
                high_load /= 2
        else:
            high, high_load, kept = aim, max(shifted, 1e-9), min(kept, 0) - 1
            if kept <= -2:
                low_load /= 2
        if math.isfinite(load):
            tried.append((float(predicted[aim]), float(load)))
    return low
