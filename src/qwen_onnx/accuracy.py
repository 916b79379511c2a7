"""Accuracy of an ONNX variant against the PyTorch fp32 model on held-out text.

The evaluation text is split into consecutive windows of ``window`` tokens; each window is run as
one prefill through both models and every position except the last predicts the next token.
Metric definitions: :mod:`qwen_onnx.metrics`.
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np

from .artifacts import library_versions, write_json
from .metrics import AccuracyAccumulator
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
    max_windows: int | None = 8,
    threads: int | None = None,
    output: str | os.PathLike | None = None,
) -> dict:
    """Compare a variant's logits with PyTorch fp32 on ``text_path``.

    Args:
        variant_dir: ONNX variant folder.
        hf_dir: the fp32 Hugging Face folder the variants came from.
        text_path: UTF-8 evaluation text (not the calibration text).
        window: tokens per window.
        max_windows: windows evaluated at most; None for the whole text.
        threads: CPU threads for both runtimes.
        output: JSON file to write, if given.

    Returns:
        :meth:`qwen_onnx.metrics.AccuracyAccumulator.summary` plus ``window``, ``windows`` and
        ``seconds``.

    Raises:
        QwenOnnxError: the text holds no full window.
        ArtifactError: the variant's model or external data is missing.
    """
    from tqdm import tqdm
    from transformers import AutoTokenizer

    started = time.time()
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    available = token_windows(tokenizer, text_path, window)
    windows = available if max_windows is None else available[:max_windows]
    reference = load_torch_model(hf_dir, threads)
    variant = OnnxCausalLM(variant_dir, threads=threads)
    acc = AccuracyAccumulator()
    for ids in tqdm(windows, desc=f"accuracy {os.path.basename(os.fspath(variant_dir))}", unit="window"):
        batch = ids.reshape(1, -1)
        ref = torch_logits(reference, batch)[0, :-1]
        got, _ = variant.forward(batch)
        acc.add(ref, got[0, :-1], ids[1:])
    result = {
        **acc.summary(),
        "window": window,
        "windows": int(len(windows)),
        "text": os.fspath(text_path),
        "seconds": round(time.time() - started, 1),
        "library_versions": library_versions(),
    }
    log.info(
        "ppl %.3f (reference %.3f, %+.2f%%), top-1 %.1f%%, max |Δlogit| %.4f over %d tokens",
        result["ppl"], result["ppl_reference"], result["ppl_delta_pct"], result["top1_pct"],
        result["max_abs_logit_diff"], result["tokens"],
    )
    if output is not None:
        write_json(output, result)
    return result
