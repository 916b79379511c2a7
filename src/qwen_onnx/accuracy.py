"""Accuracy of an ONNX variant against the PyTorch fp32 model on held-out text, with gates.

PyTorch's side is computed once per model by :func:`qwen_onnx.reference.write_reference` (the
workflow's ``reference`` stage): logits of every evaluation window (memory-mapped ``.npy``), the
window and prompt token ids and PyTorch's greedy outputs. :func:`accuracy_from_reference` reads
that folder and runs only ONNX Runtime, so an accuracy job never loads PyTorch.
:func:`evaluate_accuracy` (``qwen-onnx accuracy --reference HF_DIR``) writes the reference into a
temporary folder first and then takes the same path.

Token-level figures: the evaluation text is split into consecutive windows of ``window`` tokens;
each window runs as one prefill through both models and every position except the last predicts
the next token (perplexity, KL divergence, top-1 agreement, |Δlogit|; definitions in
:mod:`qwen_onnx.metrics`). Behavioural checks (:mod:`qwen_onnx.parity`): padded-batch parity,
KV-cache parity, and greedy generation against PyTorch on fixed chat prompts. Gates
(:mod:`qwen_onnx.gates`) mark the variant PASS or FAIL.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from typing import Any, Mapping, Sequence

import numpy as np

from . import defaults
from .artifacts import library_versions, model_path, write_json
from .errors import GateError
from .gates import check_gate
from .metrics import AccuracyAccumulator
from .options import check_options
from .parity import generation_parity, kv_cache_parity, padded_batch_parity
from .reference import load_torch_model, read_reference, torch_logits, write_reference  # noqa: F401 (re-exported)
from .runtime import SHARED_CORES_SETTINGS, OnnxCausalLM

log = logging.getLogger(__name__)


def accuracy_from_reference(
    variant_dir: str | os.PathLike,
    reference_dir: str | os.PathLike,
    *,
    threads: int | None = None,
    kv_decode_steps: int = defaults.EVALUATION["kv_decode_steps"],
    gate_limits: Mapping[str, float] | None = None,
    gate_kind: str | None = None,
    fail_on_gate: bool = False,
    output: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Compare a variant with PyTorch fp32's stored outputs and apply its gate (no PyTorch loaded).

    Args:
        variant_dir: ONNX variant folder.
        reference_dir: folder written by :func:`qwen_onnx.reference.write_reference` (window,
            windows, text, prompts and generation length are its own).
        threads: ONNX Runtime CPU threads.
        kv_decode_steps: decode steps of the KV-cache check (on the first window).
        gate_limits: ``{figure: limit}`` (see :func:`qwen_onnx.gates.check_gate`); None: no limits,
            only the NaN and exploded-perplexity checks.
        gate_kind: the gate kind the limits belong to (``float``, ``int8_dynamic``,
            ``int8_static``, ``int4``), recorded in the report.
        fail_on_gate: raise :class:`GateError` on FAIL (after writing ``output``).
        output: JSON file to write, if given.

    Returns:
        :meth:`qwen_onnx.metrics.AccuracyAccumulator.summary`, ``window``, ``windows``, the parity
        figures, ``generation`` details, ``gate`` (``PASS``/``FAIL``), ``gate_failures`` and the
        settings.

    Raises:
        OptionError: a number out of its range (:data:`qwen_onnx.options.RANGES`).
        ArtifactError: the reference folder is incomplete, or the variant's model or external data
            is missing.
        GateError: the gate failed and ``fail_on_gate`` is set.
    """
    from tqdm import tqdm

    check_options(threads=threads, kv_decode_steps=kv_decode_steps)
    started = time.time()
    name = os.path.basename(os.path.normpath(os.fspath(variant_dir)))
    reference = read_reference(reference_dir)
    meta = reference.meta
    windows, window = reference.windows, int(meta["window"])
    eos = list(meta["eos_token_ids"])

    # accuracy jobs share the cores with other jobs: spinning threads would slow them (runtime.session_options)
    variant = OnnxCausalLM(variant_dir, threads=threads, settings=SHARED_CORES_SETTINGS)
    acc = AccuracyAccumulator()
    for i, ids in enumerate(tqdm(windows, desc=f"accuracy {name}", unit="window")):
        got, _ = variant.forward(ids.reshape(1, -1))
        acc.add(np.asarray(reference.logits[i], dtype=np.float32), got[0, :-1], ids[1:])
    result: dict[str, Any] = {**acc.summary(), "window": window, "windows": int(len(windows))}
    result.update(padded_batch_parity(variant, reference.prompt_ids, int(meta["pad_token_id"])))
    result.update(kv_cache_parity(variant, windows[0], min(kv_decode_steps, window - 1)))
    result.update(generation_parity(variant, reference.decoder(), reference.prompts, reference.prompt_ids,
                                    reference.generations, int(meta["generation_tokens"]), eos))
    result["eos_token_ids"] = eos

    status, failures = check_gate(result, dict(gate_limits or {}))
    result.update({
        "gate": status,
        "gate_failures": failures,
        "gate_limits": dict(gate_limits or {}),
        "gate_kind": gate_kind,
        "text": meta["text"],
        "threads": threads,
        "seconds": round(time.time() - started, 1),
        "library_versions": library_versions(),
    })
    return _finish(name, result, output, fail_on_gate)


def _finish(name: str, result: dict[str, Any], output: str | os.PathLike | None, fail_on_gate: bool) -> dict[str, Any]:
    log.info(
        "%s: %s; ppl %.3f (PyTorch %.3f, %+.2f%%), KL %.4f, top-1 %.1f%%, max |Δlogit| %.4f over %d tokens; "
        "generation %.0f%% matched",
        name, result["gate"], result["ppl"], result["ppl_reference"], result["ppl_delta_pct"], result["kl_mean"],
        result["top1_pct"], result["max_abs_logit_diff"], result["tokens"], result["generation_match_pct"],
    )
    if output is not None:
        write_json(output, result)
    if result["gate"] == "FAIL" and fail_on_gate:
        raise GateError(f"{name} gate FAIL: {'; '.join(result['gate_failures'])}")
    return result


def evaluate_accuracy(
    variant_dir: str | os.PathLike,
    hf_dir: str | os.PathLike,
    text_path: str | os.PathLike,
    *,
    window: int = defaults.EVALUATION["window"],
    max_windows: int | None = defaults.EVALUATION["max_windows"],
    threads: int | None = None,
    prompts: Sequence[str] | None = None,
    kv_decode_steps: int = defaults.EVALUATION["kv_decode_steps"],
    generation_tokens: int = defaults.EVALUATION["generation_tokens"],
    gate_limits: Mapping[str, float] | None = None,
    gate_kind: str | None = None,
    fail_on_gate: bool = False,
    output: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Compare a variant with PyTorch fp32 computed now, and apply its gate.

    The reference is written to a temporary folder by :func:`qwen_onnx.reference.write_reference`
    (PyTorch is released before ONNX Runtime loads the variant, so one model is held at a time),
    then read by :func:`accuracy_from_reference`: the same code path as the workflow's.

    Args:
        variant_dir: ONNX variant folder.
        hf_dir: the fp32 Hugging Face folder the variants came from.
        text_path: UTF-8 evaluation text (not the calibration text).
        window: tokens per evaluation window.
        max_windows: windows evaluated at most; None for the whole text.
        threads: CPU threads for both runtimes.
        prompts: user prompts for the padded-batch and generation checks (default: the shipped
            ``prompts.json``).
        kv_decode_steps: decode steps of the KV-cache check (on the first window).
        generation_tokens: maximum new tokens per greedy generation.
        gate_limits, gate_kind, fail_on_gate, output: as :func:`accuracy_from_reference`.

    Returns:
        As :func:`accuracy_from_reference`; ``seconds`` counts the reference too.

    Raises:
        OptionError: a number out of its range (:data:`qwen_onnx.options.RANGES`).
        TextError: the text holds no full window.
        ArtifactError: the variant's model or external data is missing.
        GateError: the gate failed and ``fail_on_gate`` is set.
    """
    check_options(window=window, max_windows=max_windows, threads=threads, kv_decode_steps=kv_decode_steps,
                  generation_tokens=generation_tokens)
    started = time.time()
    model_path(variant_dir)  # a missing, truncated or damaged variant is named before the reference pass
    with tempfile.TemporaryDirectory(prefix="qwen-onnx-accuracy-") as scratch:
        reference_dir = os.path.join(scratch, "reference")
        write_reference(hf_dir, text_path, reference_dir, window=window, max_windows=max_windows,
                        generation_tokens=generation_tokens, prompts=prompts, threads=threads)
        result = accuracy_from_reference(variant_dir, reference_dir, threads=threads, kv_decode_steps=kv_decode_steps,
                                         gate_limits=gate_limits, gate_kind=gate_kind)
    result["seconds"] = round(time.time() - started, 1)
    if output is not None:
        write_json(output, result)
    if result["gate"] == "FAIL" and fail_on_gate:
        name = os.path.basename(os.path.normpath(os.fspath(variant_dir)))
        raise GateError(f"{name} gate FAIL: {'; '.join(result['gate_failures'])}")
    return result
