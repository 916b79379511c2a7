"""Build the int4 variant with its per-MatMul precision searched (:mod:`qwen_onnx.quantize.precision_search`):
the fewest weight bytes read per decode step that pass the int4 gate with margin on calibration text.

Every candidate is built by :func:`qwen_onnx.quantize.int4.quantize_int4_variant` exactly as the shipped
variant is, and scored against the float graph it starts from on calibration windows that the
activation importance did not see; the evaluation windows the report scores are never used.
"""

from __future__ import annotations

import collections
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import onnx

from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.measure.metrics import AccuracyAccumulator
from qwen_onnx.quantize.gptq import Hessians
from qwen_onnx.quantize.int4 import Int4Settings, quantize_int4_variant
from qwen_onnx.quantize.kquant import BlockCache, activation_importance
from qwen_onnx.quantize.matmuls import node_role, precision_by_role, weight_matmuls
from qwen_onnx.quantize.precision_search import (
    OPTIONS,
    PROBE,
    RESOLUTION,
    calibrate_errors,
    greedy_steps,
    matmul_options,
    option_errors,
    option_key,
    precision_after,
    predicted_kl,
    predicted_kl_path,
    predicted_prefix,
    probe_options,
    weight_bytes,
)
from qwen_onnx.run.runtime import OnnxCausalLM
from qwen_onnx.settings.gates import check_gate, gate_load, gate_margins
from qwen_onnx.source.text import CALIBRATION_TEXT, evenly_spaced, load_token_encoder, shipped_text, token_windows
from qwen_onnx.store.artifacts import model_path

log = logging.getLogger(__name__)


def _logits(model: OnnxCausalLM, window: np.ndarray) -> np.ndarray:
    """float32 [sequence, vocab] of one int64 [sequence] window, one prefill."""
    return model.forward(window[None, :])[0][0]


def score_on_windows(folder: str | os.PathLike, windows: np.ndarray, reference: np.ndarray,
                     threads: int | None = None) -> dict[str, float]:
    """Perplexity change, KL and top-1 agreement of the variant at ``folder`` against ``reference``.

    Args:
        windows: int64 [windows, sequence] token ids.
        reference: float32 [windows, sequence, vocab], the float graph's logits on them.

    Returns:
        :meth:`qwen_onnx.measure.metrics.AccuracyAccumulator.summary` over the ``sequence - 1``
        predicted positions of each window.
    """
    model = OnnxCausalLM(folder, threads=threads)
    acc = AccuracyAccumulator()
    for window, ref in zip(windows, reference):
        acc.add(ref[:-1], _logits(model, window)[:-1], window[1:])
    return acc.summary()


def search_int4_variant(
    input_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    settings: Int4Settings,
    gate: Mapping[str, float],
    *,
    calibration_text: str | os.PathLike | None = None,
    source_info: str | os.PathLike | Mapping[str, Any] | None = None,
    score_windows: int = 8,
    threads: int | None = None,
) -> dict[str, Any]:
    """The int4 variant of the float graph at ``input_dir`` with the precision map that reads the
    fewest weight bytes per token and still passes ``gate`` with margin on calibration text.

    Calibration text (default the shipped ``calibration.txt``) cut into windows of
    ``settings.calibration_sequence_length`` tokens: ``score_windows`` spread evenly over the whole text score
    the candidates (the float graph's logits on them are the reference); the first
    ``settings.importance_samples`` of the others give the activation importance and, with
    ``settings.gptq_updates``, GPTQ's Hessians. The search
    (module docstring of :mod:`qwen_onnx.quantize.precision_search`) builds one candidate per layer kind to calibrate the
    weight errors, then a few along the path, aimed at the gate's edge by the predicted KL.

    Args:
        gate: the int4 gate's limits (``ppl_delta_pct``, ``top1_pct``, ``kl_mean``); a candidate
            passes when :func:`~qwen_onnx.settings.gates.check_gate` passes and
            :func:`~qwen_onnx.settings.gates.gate_margins` finds no figure within the margin.
        score_windows: calibration windows that score each candidate.

    Returns:
        The variant's ``quantize.json`` record, whose ``precision_search`` holds the precision per
        layer kind, the weight bytes read per token (all 8-bit, chosen), each candidate's figures
        and the chosen one's margin to the gate.

    Raises:
        QwenOnnxError: the calibration text is too short for the importance and score windows, or
            a bad setting (:func:`~qwen_onnx.quantize.int4.quantize_int4_variant`).
    """
    settings.check()
    if settings.algorithm != "k_quant_int":
        raise QwenOnnxError("the precision search builds k_quant_int candidates; set quantize_int4.algorithm: "
                            "k_quant_int or search: false")
    started = time.time()
    input_dir = Path(input_dir).resolve()
    text = shipped_text(CALIBRATION_TEXT) if calibration_text is None else calibration_text
    windows = token_windows(load_token_encoder(input_dir), text, settings.calibration_sequence_length)
    needed = settings.importance_samples + score_windows
    if len(windows) < needed:
        raise QwenOnnxError(f"the calibration text gives {len(windows)} windows of "
                            f"{settings.calibration_sequence_length} tokens; the precision search needs {needed} "
                            f"({settings.importance_samples} for importance, {score_windows} to score): use a "
                            "longer text or fewer importance_samples")
    # both sets spread over the whole text, which is sections of code, English and Chinese: the last windows
    # are one section (Chinese prose in the shipped calibration.txt, where the default int4 moved perplexity
    # +7.1% against +4.7% on spread windows), and GPTQ's Hessians want most of the windows
    scored_at = evenly_spaced(score_windows, len(windows))
    calibrated_at = [i for i in range(len(windows)) if i not in set(scored_at)][:settings.importance_samples]
    scored, calibration = windows[scored_at], windows[calibrated_at]
    graph = onnx.load(str(model_path(input_dir)), load_external_data=False).graph
    matmuls = weight_matmuls(graph)
    hessians = (Hessians(input_dir, calibration, matmuls, threads, roles=settings.gptq_roles) if settings.gptq_active
                else None)
    importance = (activation_importance(input_dir, calibration, [n for n, _ in matmuls], threads) if hessians is None
                  else hessians.importance())
    sizes = {node.name: int(np.prod(tensor.dims)) for node, tensor in matmuls}
    reference_model = OnnxCausalLM(input_dir, threads=threads)
    reference = np.stack([_logits(reference_model, w) for w in scored])
    del reference_model
    # every candidate draws its 4-bit weights from here: each weight's k-quant search runs once per option
    cache: BlockCache = {}
    # the 8-bit option at the stage's block_size_8bit (OPTIONS' 128 by default)
    ladder = ((8, settings.block_size_8bit), *(o for o in OPTIONS if o[0] != 8))
    errors = option_errors(input_dir, importance, ladder, threads=threads or len(os.sched_getaffinity(0)),
                           cache=cache, symmetric=settings.symmetric_weights, hessians=hessians,
                           source_grid=settings.source_grid)
    if hessians is not None:
        hessians.release()  # every option of every weight is in the cache now
    log.info("precision search: %d MatMuls priced at %s in %.0f s since the start%s", len(errors),
             ", ".join(option_key(*o) for o in ladder), time.time() - started,
             " (GPTQ's updates on the 4-bit options)" if hessians is not None else "")
    names = list(sizes)
    scratch_root = Path(output_dir).resolve().parent

    def build_and_score(precision: Mapping[str, str]) -> dict[str, float]:
        with tempfile.TemporaryDirectory(prefix=".qwen-onnx-search-", dir=scratch_root) as scratch:
            folder = Path(scratch) / "candidate"
            quantize_int4_variant(input_dir, folder, settings, calibration_text=calibration_text,
                                  source_info=source_info, threads=threads, precision=precision, importance=importance,
                                  block_cache=cache, hessians=hessians)
            return score_on_windows(folder, scored, reference, threads)

    # the weights' error to the model's: per layer kind, the KL of that kind alone at the probe option
    roles = {name: node_role(name)[1] for name in names}
    grids = {name: cache.get((name, "source_grid")) for name in names}
    options = {name: matmul_options(grids[name], ladder) for name in names}
    widened = {name: (option_key(*grid.option), 1 + grid.sum_rows / grid.shape[0]) for name, grid in grids.items()
               if grid is not None and grid.sum_rows}
    # a kind mostly kept exactly at the probe option is probed at its first lossy one
    probes = probe_options(roles, sizes, {n for n, g in grids.items() if g is not None and g.option == PROBE})
    widest = option_key(*ladder[0])
    role_kl, probe_maps, probe_figures = {}, {}, []
    for role in sorted(set(roles.values())):
        probe_maps[role] = {n: probes[role] if roles[n] == role else widest for n in names}
        figures = build_and_score(probe_maps[role])
        role_kl[role] = figures["kl_mean"]
        probe_figures.append({"role": role, "gate_load": gate_load(figures, gate),
                              **{k: figures[k] for k in ("ppl_delta_pct", "kl_mean", "top1_pct")}})
        log.info("precision search: %s alone at %s: KL %.4f, top-1 %.2f%%", role, probes[role], figures["kl_mean"],
                 figures["top1_pct"])
    scaled = calibrate_errors(errors, roles, role_kl, probes)
    for figures in probe_figures:
        figures["predicted_kl"] = predicted_kl(probe_maps[figures["role"]], scaled)
    start = {name: options[name][0] for name in names}  # a GGUF source's own weights where MatMulNBits holds them
    steps = greedy_steps(scaled, sizes, options, widened)
    candidates: list[dict[str, Any]] = []
    predicted = predicted_kl_path(steps, scaled, start)
    path_bytes = np.asarray([weight_bytes(precision_after(steps, names, t, start), sizes, widened)
                             for t in range(len(steps) + 1)])

    def try_at(taken: int) -> tuple[bool, float]:
        precision = precision_after(steps, names, taken, start)
        figures = build_and_score(precision)
        verdict, failures = check_gate(figures, gate)
        marginal = gate_margins(figures, gate) if verdict == "PASS" else []
        load = gate_load(figures, gate)
        candidates.append({"moves": taken, "weight_bytes_per_token": float(path_bytes[taken]),
                           **{k: figures[k] for k in ("ppl_delta_pct", "kl_mean", "top1_pct")},
                           "predicted_kl": float(predicted[taken]), "gate_load": load,
                           "gate": verdict, "failures": failures, "marginal": marginal})
        log.info("precision search: %d of %d moves, %.1f MB a token, predicted KL %.4f: %s (gate load %.2f)", taken,
                 len(steps), path_bytes[taken] / 1e6, predicted[taken], verdict if not marginal else "marginal", load)
        return verdict == "PASS" and not marginal, load

    # the probes' loads against their predicted KL: where the first candidate aims
    known = [(p["predicted_kl"], p["gate_load"]) for p in probe_figures]
    taken = predicted_prefix(predicted, try_at, known, path_bytes, RESOLUTION)
    precision = precision_after(steps, names, taken, start)
    # the search only moves past a candidate that passed: the last one to pass is the map chosen
    chosen = next((c for c in reversed(candidates) if c["moves"] == taken and c["gate"] == "PASS"
                   and not c["marginal"]), None)
    all_8bit = dict.fromkeys(names, widest)
    record = {
        "method": "greedy error-per-byte path from all 8-bit; the most moves passing the int4 gate with margin on "
                  "calibration text, aimed at by the predicted KL (qwen_onnx.quantize.precision_search)",
        "options": [option_key(*o) for o in ladder],
        "exact_options": dict(collections.Counter(options[n][0] for n in names if options[n][0] not in
                                                  {option_key(*o) for o in ladder})),
        "role_kl_at_probe": {"probe": option_key(*PROBE), **role_kl},
        "probe_by_role": probes,
        "source_grid_matmuls": sum(g is not None for g in grids.values()),
        "weight_bytes_per_token_start": weight_bytes(start, sizes, widened),
        "moves": taken,
        "of_moves": len(steps),
        "probes": probe_figures,
        "weight_bytes_per_token": weight_bytes(precision, sizes, widened),
        "weight_bytes_per_token_all_8bit": weight_bytes(all_8bit, sizes, widened),
        "by_role": precision_by_role(precision),
        "gate": dict(gate),
        "chosen": chosen,
        "candidates": candidates,
        "score_windows": score_windows,
        "score_window_indices": scored_at,
        "importance_window_indices": calibrated_at,
        "importance_samples": settings.importance_samples,
        "gptq_updates": settings.gptq_active,
        "hessian_captures": None if hessians is None else hessians.captures,
        "sequence_length": settings.calibration_sequence_length,
        "seconds": round(time.time() - started, 1),  # the run time of the whole search
    }
    info = quantize_int4_variant(input_dir, output_dir, settings, calibration_text=calibration_text,
                                 source_info=source_info, threads=threads, precision=precision, importance=importance,
                                 record={"precision_search": record}, block_cache=cache, hessians=hessians)
    return info
