"""Accuracy of an ONNX variant against the PyTorch fp32 model on held-out text, with gates.

PyTorch runs first (reference logits of every window go to a scratch ``.npy`` on disk, greedy
outputs are kept), then is released before ONNX Runtime loads the variant, so the stage holds one
model at a time.

Token-level figures: the evaluation text is split into consecutive windows of ``window`` tokens;
each window runs as one prefill through both models and every position except the last predicts
the next token (perplexity, KL divergence, top-1 agreement, |Δlogit|; definitions in
:mod:`qwen_onnx.metrics`). Behavioural checks (:mod:`qwen_onnx.parity`): padded-batch parity,
KV-cache parity, and greedy generation against PyTorch on fixed chat prompts. Gates
(:mod:`qwen_onnx.gates`) mark the variant PASS or FAIL.
"""

from __future__ import annotations

import gc
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .artifacts import library_versions, model_path, write_json
from .errors import GateError
from .gates import check_gate
from .metrics import AccuracyAccumulator
from .parity import (
    chat_prompt_ids,
    eos_token_ids,
    generation_parity,
    kv_cache_parity,
    padded_batch_parity,
    shipped_prompts,
    torch_generate,
)
from .runtime import OnnxCausalLM
from .text import token_windows

log = logging.getLogger(__name__)


def load_torch_model(hf_dir: str | os.PathLike, threads: int | None = None):
    """The PyTorch fp32 reference (eager attention), in eval mode on the CPU."""
    import torch
    from transformers import AutoModelForCausalLM

    if threads:
        torch.set_num_threads(int(threads))
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


def torch_logits(model, input_ids: np.ndarray) -> np.ndarray:
    """PyTorch logits float32 [batch, sequence, vocab] for ``input_ids`` int64 [batch, sequence]."""
    import torch

    with torch.inference_mode():
        out = model(input_ids=torch.from_numpy(np.asarray(input_ids, dtype=np.int64)), use_cache=False)
    return out.logits.float().numpy()


def evaluate_accuracy(
    variant_dir: str | os.PathLike,
    hf_dir: str | os.PathLike,
    text_path: str | os.PathLike,
    *,
    window: int = 256,
    max_windows: int | None = 12,
    threads: int | None = None,
    prompts: Sequence[str] | None = None,
    kv_decode_steps: int = 16,
    generation_tokens: int = 32,
    gate_limits: Mapping[str, float] | None = None,
    gate_kind: str | None = None,
    fail_on_gate: bool = False,
    output: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Compare a variant with PyTorch fp32 and apply its gate.

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
        gate_limits: ``{figure: limit}`` (see :func:`qwen_onnx.gates.check_gate`); None: no limits,
            only the NaN and exploded-perplexity checks.
        gate_kind: the gate kind the limits belong to (``float``, ``int8_dynamic``,
            ``int8_static``), recorded in the report.
        fail_on_gate: raise :class:`GateError` on FAIL (after writing ``output``).
        output: JSON file to write, if given.

    Returns:
        :meth:`qwen_onnx.metrics.AccuracyAccumulator.summary`, the parity figures, ``generation``
        details, ``gate`` (``PASS``/``FAIL``) and ``gate_failures``.

    Raises:
        OptionError: a number out of its range (:data:`qwen_onnx.options.RANGES`).
        QwenOnnxError: the text holds no full window.
        ArtifactError: the variant's model or external data is missing.
        GateError: the gate failed and ``fail_on_gate`` is set.
    """
    from tqdm import tqdm
    from .text import load_tokenizer

    from .options import check_options

    check_options(window=window, max_windows=max_windows, threads=threads, kv_decode_steps=kv_decode_steps,
                  generation_tokens=generation_tokens)

    started = time.time()
    model_path(variant_dir)  # a missing, truncated or damaged variant is named before the reference pass
    name = os.path.basename(os.path.normpath(os.fspath(variant_dir)))
    tokenizer = load_tokenizer(hf_dir)
    available = token_windows(tokenizer, text_path, window)
    windows = available if max_windows is None else available[:max_windows]
    prompts = list(prompts) if prompts is not None else shipped_prompts()
    prompt_ids = chat_prompt_ids(tokenizer, prompts)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    eos = eos_token_ids(hf_dir)

    with tempfile.TemporaryDirectory(prefix="qwen-onnx-accuracy-") as scratch:
        reference_path = Path(scratch) / "reference_logits.npy"
        reference = load_torch_model(hf_dir, threads)
        logits_store = None
        for i, ids in enumerate(tqdm(windows, desc=f"PyTorch reference for {name}", unit="window")):
            ref = torch_logits(reference, ids.reshape(1, -1))[0, :-1]  # [window - 1, vocab]
            if logits_store is None:
                logits_store = np.lib.format.open_memmap(
                    reference_path, mode="w+", dtype=np.float32, shape=(len(windows), *ref.shape))
            logits_store[i] = ref
        logits_store.flush()
        del logits_store
        references = [torch_generate(reference, ids, generation_tokens, eos, pad_id)
                      for ids in tqdm(prompt_ids, desc="PyTorch greedy generation", unit="prompt")]
        del reference
        gc.collect()

        variant = OnnxCausalLM(variant_dir, threads=threads)
        stored = np.load(reference_path, mmap_mode="r")
        acc = AccuracyAccumulator()
        for i, ids in enumerate(tqdm(windows, desc=f"accuracy {name}", unit="window")):
            got, _ = variant.forward(ids.reshape(1, -1))
            acc.add(np.array(stored[i]), got[0, :-1], ids[1:])
        del stored
    result: dict[str, Any] = {**acc.summary(), "window": window, "windows": int(len(windows))}
    result.update(padded_batch_parity(variant, prompt_ids, pad_id))
    result.update(kv_cache_parity(variant, windows[0], min(kv_decode_steps, window - 1)))
    result.update(generation_parity(variant, tokenizer, prompts, prompt_ids, references, generation_tokens, eos))
    result["eos_token_ids"] = eos

    status, failures = check_gate(result, dict(gate_limits or {}))
    result.update({
        "gate": status,
        "gate_failures": failures,
        "gate_limits": dict(gate_limits or {}),
        "gate_kind": gate_kind,
        "text": os.fspath(text_path),
        "threads": threads,
        "seconds": round(time.time() - started, 1),
        "library_versions": library_versions(),
    })
    log.info(
        "%s: %s; ppl %.3f (PyTorch %.3f, %+.2f%%), KL %.4f, top-1 %.1f%%, max |Δlogit| %.4f over %d tokens; "
        "generation %.0f%% matched",
        name, status, result["ppl"], result["ppl_reference"], result["ppl_delta_pct"], result["kl_mean"],
        result["top1_pct"], result["max_abs_logit_diff"], result["tokens"], result["generation_match_pct"],
    )
    if output is not None:
        write_json(output, result)
    if status == "FAIL" and fail_on_gate:
        raise GateError(f"{name} gate FAIL: {'; '.join(failures)}")
    return result
