"""The greedy decode loop with the KV cache fed back as arrays, shared by the runtimes that have no
IO-bound loop of their own (onnxruntime's ``loop="unbound"``, OpenVINO's CPU plugin on our graphs)."""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np


def unbound_greedy(
    forward: Callable[..., tuple[np.ndarray, Any]],
    prompt_ids: np.ndarray,
    max_new_tokens: int,
    *,
    eos_ids: Sequence[int] = (),
    timings: list[float] | None = None,
    step_logits: list[np.ndarray] | None = None,
    stop: Callable[[list[int]], bool] | None = None,
) -> tuple[np.ndarray, float]:
    """Greedy decoding with the KV cache fed back as arrays, for any runtime's one-pass function.

    ``forward(input_ids, attention_mask, past)`` takes int64 [1, sequence] ids, an int64 [1, past +
    sequence] mask of ones (None at the prefill) and the cache it returned last (None at the prefill),
    and returns the logits [1, sequence, vocab] and the new cache (:meth:`qwen_onnx.run.runtime.OnnxCausalLM.forward`,
    :meth:`qwen_onnx.run.openvino.OpenVinoCausalLM.forward`). Stops after one of ``eos_ids`` (kept),
    after ``max_new_tokens``, or when ``stop(ids so far)`` is True.

    Args:
        timings: if given, receives the seconds of each single-token decode step.
        step_logits: if given, receives the last-position logits float32 [vocab] of the prefill and of
            every step.

    Returns:
        The generated ids int64 [generated] and the prefill time (with the first argmax) in seconds.
    """
    eos = set(int(i) for i in eos_ids)
    prompt = np.asarray(prompt_ids, dtype=np.int64).reshape(1, -1)
    started = time.perf_counter()
    logits, past = forward(prompt, None, None)
    token = int(logits[0, -1].argmax())
    prefill = time.perf_counter() - started
    if step_logits is not None:
        step_logits.append(logits[0, -1].astype(np.float32))
    generated = [token]
    length = prompt.shape[1]
    step_ids = np.zeros((1, 1), dtype=np.int64)
    while len(generated) < max_new_tokens and token not in eos and not (stop is not None and stop(generated)):
        step = time.perf_counter()
        step_ids[0, 0] = token
        length += 1
        logits, past = forward(step_ids, np.ones((1, length), dtype=np.int64), past)
        token = int(logits[0, -1].argmax())
        if timings is not None:
            timings.append(time.perf_counter() - step)
        if step_logits is not None:
            step_logits.append(logits[0, -1].astype(np.float32))
        generated.append(token)
    return np.array(generated, dtype=np.int64), prefill
