"""Accuracy of an ONNX variant against the PyTorch fp32 model on held-out text, with gates.

PyTorch's side is computed once per model by :func:`qwen_onnx.measure.reference.write_reference` (the
workflow's ``reference`` stage): logits of every evaluation window (memory-mapped ``.npy``), the
window and prompt token ids and PyTorch's greedy outputs. :func:`accuracy_from_reference` reads
that folder and runs only ONNX Runtime, so an accuracy job never loads PyTorch.
:func:`evaluate_accuracy` (``qwen-onnx accuracy --reference HF_DIR``) writes the reference into a
temporary folder first and then takes the same path.

Token-level figures: the evaluation text is split into consecutive windows of ``window`` tokens;
each window runs as one prefill through both models and every position except the last predicts
the next token (perplexity, KL divergence, top-1 agreement, |Δlogit|; definitions in
:mod:`qwen_onnx.measure.metrics`). Behavioural checks (:mod:`qwen_onnx.measure.parity`): padded-batch parity,
KV-cache parity, and greedy generation against PyTorch on fixed chat prompts. The variant's tokenizer is
checked against the source's added tokens (:mod:`qwen_onnx.measure.tokens`: FIM, tool-call and thinking
tokens, which no scored text contains). Gates
(:mod:`qwen_onnx.settings.gates`) mark the variant PASS or FAIL.

A GGUF file (a peer: llama.cpp on the source checkpoint) takes the same path through
:class:`qwen_onnx.run.llama_cpp.LlamaCppCausalLM`, batch 1 like LiteRT, on the reference's own token ids.

A tflite folder (:mod:`qwen_onnx.convert.tflite`, detected by its ``tflite.json``) takes the same path
through :class:`TfliteVariant`, which gives :class:`qwen_onnx.run.tflite.TfliteCausalLM` the two calls
the loop and the parity checks make: each window is one prefill (in chunks when the window is
longer than the prefill signature), the KV-cache check prefills ``window[:-k]`` and decodes ``k``
steps, generation is the runner's greedy loop. Padded-batch parity is not applicable (LiteRT's
signatures are batch 1): the report records why instead of a figure, and a gate limit on it is
set aside (``gate_limits_not_applicable``).
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from typing import Any, Mapping, Sequence

import numpy as np

from qwen_onnx.errors import GateError, OptionError
from qwen_onnx.measure.metrics import AccuracyAccumulator
from qwen_onnx.measure.parity import generation_parity, kv_cache_parity, padded_batch_parity
from qwen_onnx.measure.reference import load_torch_model, read_reference, torch_logits, write_reference  # noqa: F401 (re-exported)
from qwen_onnx.measure.tokens import check_variant_tokenizer
from qwen_onnx.run.llama_cpp import LlamaCppCausalLM, is_gguf
from qwen_onnx.run.machine import machine_isa
from qwen_onnx.run.openvino import BATCH_ONE, OpenVinoCausalLM
from qwen_onnx.run.openvino_ir import IR_BATCH_ONE, OpenVinoIrCausalLM, is_openvino_ir
from qwen_onnx.run.runtime import OnnxCausalLM
from qwen_onnx.run.session import SHARED_CORES_SETTINGS
from qwen_onnx.run.tflite import TfliteCausalLM, is_tflite_folder
from qwen_onnx.run.tflite_env import call_with_litert, litert_here
from qwen_onnx.settings import defaults
from qwen_onnx.settings.gates import check_gate, gate_margins
from qwen_onnx.settings.options import check_options
from qwen_onnx.store.artifacts import model_path, write_json
from qwen_onnx.store.provenance import library_versions, package_version

log = logging.getLogger(__name__)

#: Why the padded-batch figures of a tflite variant are absent (the report prints "n/a").
PADDED_BATCH_NOT_APPLICABLE = "not applicable: LiteRT signatures are batch 1"
#: Why the padded-batch figures of a llama.cpp peer are absent.
LLAMA_PADDED_BATCH_NOT_APPLICABLE = "not applicable: llama.cpp runs batch 1 here"
#: The runtimes an ONNX variant folder can be scored with.
RUNTIMES = ("onnxruntime", "openvino")
#: The figures a tflite variant (or a llama.cpp peer) does not have, and so the gate limits set aside for it.
TFLITE_NOT_APPLICABLE = ("padded_batch_max_abs_diff", "padded_batch_top1_pct", "padded_batch_nonfinite")


class TfliteVariant:
    """A :class:`~qwen_onnx.run.tflite.TfliteCausalLM` behind the two calls of
    :class:`~qwen_onnx.run.runtime.OnnxCausalLM` that the accuracy loop and
    :func:`qwen_onnx.measure.parity.kv_cache_parity` / :func:`~qwen_onnx.measure.parity.generation_parity` make.

    The KV cache lives in the interpreter; the ``past`` handed back and forth is the next position.

    Args:
        runner: the tflite runner (batch 1).
    """

    def __init__(self, runner: TfliteCausalLM):
        self.runner = runner

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray | None = None,
                past: int | None = None) -> tuple[np.ndarray, int]:
        """Without ``past``, a prefill of ``input_ids`` int64 [1, sequence]; with it (the position
        the previous call returned), that many decode steps. ``attention_mask`` is all ones here
        (batch 1, no padding) and not used.

        Returns:
            ``logits`` float32 [1, sequence, vocab] and the next position.

        Raises:
            OptionError: a batch of more than one sequence (LiteRT's signatures are batch 1), or a
                sequence that does not fit the KV cache.
        """
        ids = np.asarray(input_ids)
        if ids.ndim != 2 or ids.shape[0] != 1:
            raise OptionError(f"a tflite variant runs batch 1; got input_ids of shape {list(ids.shape)}")
        if past is None:
            logits = self.runner.prefill(ids[0])  # [sequence, vocab]
        else:
            logits = np.stack([self.runner.decode(int(t), position=past + i) for i, t in enumerate(ids[0])])
        return logits[None], self.runner.position

    def generate(self, prompt_ids: np.ndarray, max_new_tokens: int, *, eos_ids: Sequence[int] = (),
                 loop: str = "bound") -> tuple[np.ndarray, None]:
        """Greedy generation (:meth:`TfliteCausalLM.generate`; ``loop`` has no meaning here).

        Returns:
            The generated ids int64 [generated] and None (no prefill time measured).
        """
        new = self.runner.generate(np.asarray(prompt_ids).reshape(-1).tolist(), max_new_tokens, eos_ids)
        return np.asarray(new, dtype=np.int64), None


def _check_fits_tflite(runner: TfliteCausalLM, window: int, prompt_ids: Sequence[np.ndarray],
                       generation_tokens: int) -> None:
    """The reference's windows and prompts plus their generated tokens fit the tflite model's KV cache.

    Raises:
        OptionError: one line naming both numbers and the fix.
    """
    cache = runner.kv_cache_length
    if window > cache:
        raise OptionError(f"the reference's windows of {window} tokens do not fit this tflite variant's KV cache "
                          f"of {cache} positions; convert it with tflite.kv_cache_length of at least {window} "
                          f"(qwen-onnx tflite --kv-cache-length {window}) or write the reference with "
                          f"evaluation.window of at most {cache}")
    longest = max((len(p) for p in prompt_ids), default=0) + generation_tokens
    if longest > cache:
        raise OptionError(f"the reference's longest prompt plus its {generation_tokens} generated tokens is "
                          f"{longest} tokens, more than this tflite variant's KV cache of {cache} positions; "
                          f"convert it with tflite.kv_cache_length of at least {longest}")


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
    emulate_integer: bool = False,
    runtime: str = "onnxruntime",
) -> dict[str, Any]:
    """Compare a variant with PyTorch fp32's stored outputs and apply its gate (no PyTorch loaded).

    Args:
        variant_dir: ONNX variant folder, a tflite folder (``tflite.json``; run by the LiteRT
            interpreter through :class:`TfliteVariant`, no padded-batch check), a GGUF file (a peer,
            run by llama.cpp, no padded-batch check; ``vocab_compared`` records the ids compared), or
            an OpenVINO IR folder (``openvino_model.xml``, the ``openvino-int4`` peer, run by
            :class:`qwen_onnx.run.openvino_ir.OpenVinoIrCausalLM` with the plugin's defaults, batch 1).
        reference_dir: folder written by :func:`qwen_onnx.measure.reference.write_reference` (window,
            windows, text, prompts and generation length are its own).
        threads: ONNX Runtime CPU threads (the LiteRT interpreter's ``num_threads``; None: all cores).
        kv_decode_steps: decode steps of the KV-cache check (on the first window).
        gate_limits: ``{figure: limit}`` (see :func:`qwen_onnx.settings.gates.check_gate`); None: no limits,
            only the NaN and exploded-perplexity checks.
        gate_kind: the gate kind the limits belong to (``float``, ``int8_dynamic``,
            ``int8_static``, ``int4``), recorded in the report.
        fail_on_gate: raise :class:`GateError` on FAIL (after writing ``output``).
        output: JSON file to write, if given.
        emulate_integer: run with onnxruntime's graph optimizations off, so that QDQ pairs are not
            fused into integer kernels: each DequantizeLinear feeds a float MatMul, which computes
            the quantized graph's exact values whatever the CPU (no int16 saturation of
            ``VPMADDUBSW``); slower. Recorded as ``integer_kernels``. Explicit quantized ops
            (``MatMulNBits``, ``GatherBlockQuantized``) still run their own kernels.
        runtime: what runs an ONNX variant folder (:data:`RUNTIMES`): ``onnxruntime``, or
            ``openvino`` (OpenVINO's CPU plugin, f32 precision hint, :class:`qwen_onnx.run.openvino.OpenVinoCausalLM`;
            its compiled-model report under ``openvino``; no padded-batch check on a
            ``GroupQueryAttention`` graph, which it runs batch 1).

    Returns:
        :meth:`qwen_onnx.measure.metrics.AccuracyAccumulator.summary`, ``window``, ``windows``, the parity
        figures, ``generation`` details, ``gate`` (``PASS``/``FAIL``), ``gate_failures`` and the
        settings.

        For a tflite folder: ``padded_batch`` (:data:`PADDED_BATCH_NOT_APPLICABLE`) instead of the
        padded-batch figures, ``runtime`` ``litert``, ``tflite_quantize``, and
        ``gate_limits_not_applicable`` (limits on those figures, not applied).

    Raises:
        OptionError: a number out of its range (:data:`qwen_onnx.settings.options.RANGES`); for a tflite
            folder, reference windows (or a prompt plus its generated tokens) longer than its KV cache;
            an unknown ``runtime``.
        RunnerError: ``runtime`` ``openvino`` without openvino installed, or a graph it does not compile.
        ArtifactError: the reference folder is incomplete, or the variant's model or external data
            is missing.
        GateError: the gate failed and ``fail_on_gate`` is set.
    """
    if is_tflite_folder(variant_dir) and not litert_here():  # first: locals() is the arguments
        return call_with_litert(accuracy_from_reference, kwargs=locals())  # LiteRT runs in the TFLite environment
    from tqdm import tqdm

    check_options(threads=threads, kv_decode_steps=kv_decode_steps)
    if runtime not in RUNTIMES:
        raise OptionError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    started = time.time()
    name = os.path.basename(os.path.normpath(os.fspath(variant_dir)))
    reference = read_reference(reference_dir)
    meta = reference.meta
    windows, window = reference.windows, int(meta["window"])
    eos = list(meta["eos_token_ids"])

    tflite = is_tflite_folder(variant_dir)
    gguf = is_gguf(variant_dir)
    limits = dict(gate_limits or {})
    extra: dict[str, Any] = {}
    if is_openvino_ir(variant_dir):
        variant = OpenVinoIrCausalLM(variant_dir, threads=threads or os.cpu_count() or 1)
        extra = {"runtime": "openvino", "openvino": variant.report(), "padded_batch": IR_BATCH_ONE,
                 "gate_limits_not_applicable": {k: limits.pop(k) for k in TFLITE_NOT_APPLICABLE if k in limits}}
    elif gguf:
        longest = max((len(p) for p in reference.prompt_ids), default=0) + int(meta["generation_tokens"])
        variant = LlamaCppCausalLM(variant_dir, context=max(window, longest) + 8, threads=threads or os.cpu_count() or 1)
        extra = {"runtime": "llama.cpp", "llama_cpp": package_version("llama-cpp-python"),
                 "padded_batch": LLAMA_PADDED_BATCH_NOT_APPLICABLE,
                 "gate_limits_not_applicable": {k: limits.pop(k) for k in TFLITE_NOT_APPLICABLE if k in limits}}
    elif tflite:
        runner = TfliteCausalLM(variant_dir, threads=threads or os.cpu_count() or 1)
        _check_fits_tflite(runner, window, reference.prompt_ids, int(meta["generation_tokens"]))
        variant: Any = TfliteVariant(runner)
        extra = {"runtime": "litert", "tflite_quantize": runner.info["quantize"],
                 "padded_batch": PADDED_BATCH_NOT_APPLICABLE,
                 "gate_limits_not_applicable": {k: limits.pop(k) for k in TFLITE_NOT_APPLICABLE if k in limits}}
    elif runtime == "openvino":
        variant = OpenVinoCausalLM(variant_dir, threads=threads or os.cpu_count() or 1)
        extra = {"runtime": "openvino", "openvino": variant.report()}
        if variant.max_batch == 1:
            extra.update(padded_batch=f"not applicable: {BATCH_ONE}",
                         gate_limits_not_applicable={k: limits.pop(k) for k in TFLITE_NOT_APPLICABLE if k in limits})
    else:
        # accuracy jobs share the cores with other jobs: spinning threads would slow them (session.session_options)
        settings = {**SHARED_CORES_SETTINGS, **({"graph_optimization_level": "disable"} if emulate_integer else {})}
        variant = OnnxCausalLM(variant_dir, threads=threads, settings=settings)
        extra = {"integer_kernels": "emulated: graph optimizations off, QDQ computed in float" if emulate_integer
                 else "onnxruntime's fused integer kernels"}
    acc = AccuracyAccumulator()
    vocab = None
    for i, ids in enumerate(tqdm(windows, desc=f"accuracy {name}", unit="window")):
        got, _ = variant.forward(ids.reshape(1, -1))  # [1, window, vocab]: one prefill
        want = np.asarray(reference.logits[i], dtype=np.float32)
        # a GGUF's vocabulary may stop before the checkpoint's padded embedding rows (ids no tokenizer emits):
        # both sides are compared on the ids they share
        vocab = min(want.shape[-1], got.shape[-1])
        acc.add(want[:, :vocab], got[0, :-1, :vocab], ids[1:])
    result: dict[str, Any] = {**acc.summary(), "window": window, "windows": int(len(windows))}
    if gguf:
        result["vocab_compared"] = vocab
    if not (tflite or gguf or "padded_batch" in extra):
        result.update(padded_batch_parity(variant, reference.prompt_ids, int(meta["pad_token_id"])))
    result.update(kv_cache_parity(variant, windows[0], min(kv_decode_steps, window - 1)))
    result.update(generation_parity(variant, reference.decoder(), reference.prompts, reference.prompt_ids,
                                    reference.generations, int(meta["generation_tokens"]), eos))
    result["eos_token_ids"] = eos
    result.update(check_variant_tokenizer(variant_dir, meta.get("added_tokens")))
    result.update(extra)

    status, failures = check_gate(result, limits)
    result.update({
        "gate": status,
        "gate_failures": failures,
        "gate_marginal": gate_margins(result, limits) if status == "PASS" else [],
        "gate_limits": limits,
        "gate_kind": gate_kind,
        "text": meta["text"],
        "threads": threads,
        "seconds": round(time.time() - started, 1),
        **machine_isa(),
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

    The reference is written to a temporary folder by :func:`qwen_onnx.measure.reference.write_reference`
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
        OptionError: a number out of its range (:data:`qwen_onnx.settings.options.RANGES`).
        TextError: the text holds no full window.
        ArtifactError: the variant's model or external data is missing.
        GateError: the gate failed and ``fail_on_gate`` is set.
    """
    check_options(window=window, max_windows=max_windows, threads=threads, kv_decode_steps=kv_decode_steps,
                  generation_tokens=generation_tokens)
    started = time.time()
    if not (is_tflite_folder(variant_dir) or is_gguf(variant_dir)):
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
