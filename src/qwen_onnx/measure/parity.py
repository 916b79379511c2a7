"""Behavioural parity checks of an ONNX variant: padded batches, the KV cache, greedy generation.

- Padded batch: prompts of different lengths, left-padded into one batch with the tokenizer's pad
  id and an attention mask of zeros on the pads, must give on every non-pad position the logits of
  the same prompt run alone, and no NaN/inf anywhere (pad rows included).
- KV cache: a prefill of the first tokens followed by single-token decode steps must give the
  logits of one full-sequence pass at the same positions.
- Generation: greedy decoding from chat-templated prompts, stopping on every end-of-sequence id
  that ``generation_config.json`` lists, compared token by token with PyTorch's ``generate``.
"""

from __future__ import annotations

import json
import logging
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from qwen_onnx.run.runtime import OnnxCausalLM

log = logging.getLogger(__name__)

PROMPTS_FILE = "prompts.json"


def shipped_prompts() -> list[str]:
    """The fixed user prompts shipped in ``qwen_onnx/data/prompts.json`` (code and prose, English and Chinese)."""
    path = Path(str(resources.files("qwen_onnx") / "data" / PROMPTS_FILE))
    return list(json.loads(path.read_text(encoding="utf-8"))["prompts"])


#: Chat modes the prompts are built in (:func:`chat_mode`), as ``reference.json`` and ``task.json`` state them.
NON_THINKING = "non-thinking (enable_thinking=False)"
NO_THINKING_MODE = "template has no thinking mode"
THINKING_ONLY = "thinking (the template always opens a think block)"


def chat_mode(tokenizer) -> tuple[dict[str, Any], str]:
    """The chat template's keyword arguments for scoring and the mode they give, as ``(kwargs, mode)``.

    Qwen3's hybrid templates think unless told not to: with ``enable_thinking=False`` the generation prompt
    ends with an empty think block (``<|im_start|>assistant\n<think>\n\n</think>\n\n``), the non-thinking
    mode (Qwen3 model cards, "Switching Between Thinking and Non-Thinking Mode"), which evaluation harnesses
    score in. A template whose generation prompt changes with ``enable_thinking=False`` gets it:
    ``({"enable_thinking": False}, NON_THINKING)``; otherwise the kwargs are empty and the mode is
    :data:`THINKING_ONLY` when the generation prompt ends in an opened ``<think>`` (a thinking-only template),
    else :data:`NO_THINKING_MODE` (Qwen2.5).

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
    """
    messages = [{"role": "user", "content": "x"}]
    default = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    switched = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                             enable_thinking=False)
    if switched != default:
        return {"enable_thinking": False}, NON_THINKING
    if default.rstrip().endswith("<think>"):
        return {}, THINKING_ONLY
    return {}, NO_THINKING_MODE


def chat_prompt_ids(tokenizer, prompts: Sequence[str], responses: Sequence[str] | None = None) -> list[np.ndarray]:
    """Token ids of each prompt as a user turn with the generation prompt, in the template's
    non-thinking mode where it has one (:func:`chat_mode`): int64 [prompt] each.

    Each prompt is rendered as text and tokenized without adding special tokens. With ``responses``, each
    prompt's assistant turn starts with its response text (written after the generation prompt), for the model
    to go on from.
    """
    kwargs, _ = chat_mode(tokenizer)
    out = []
    for i, text in enumerate(prompts):
        messages = [{"role": "user", "content": text}]
        chat = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
        ids = tokenizer(chat + (responses[i] if responses is not None else ""), add_special_tokens=False)
        out.append(np.asarray(ids["input_ids"], dtype=np.int64).reshape(-1))
    return out


def padded_batch_parity(model: OnnxCausalLM, prompts: Sequence[np.ndarray], pad_id: int) -> dict[str, Any]:
    """Left-padded batch against each prompt alone.

    Args:
        prompts: token ids int64 [length_i] each, of different lengths.
        pad_id: the tokenizer's pad token id.

    Returns:
        ``padded_batch_max_abs_diff`` (max |Δlogit| over non-pad positions),
        ``padded_batch_top1_pct`` (argmax agreement there, percent), ``padded_batch_nonfinite``
        (NaN/inf count anywhere in the batch logits), ``padded_batch_size``.
    """
    longest = max(len(p) for p in prompts)
    batch = np.full((len(prompts), longest), pad_id, dtype=np.int64)
    mask = np.zeros_like(batch)
    for i, p in enumerate(prompts):
        batch[i, longest - len(p):] = p
        mask[i, longest - len(p):] = 1
    logits, _ = model.forward(batch, mask)
    nonfinite = int((~np.isfinite(logits)).sum())
    worst, agree, count = 0.0, 0, 0
    for i, p in enumerate(prompts):
        alone, _ = model.forward(p.reshape(1, -1))
        padded = logits[i, longest - len(p):]
        worst = max(worst, float(np.nanmax(np.abs(padded - alone[0]))) if np.isfinite(padded).any() else float("inf"))
        agree += int((padded.argmax(-1) == alone[0].argmax(-1)).sum())
        count += len(p)
    return {
        "padded_batch_max_abs_diff": worst,
        "padded_batch_top1_pct": 100.0 * agree / count,
        "padded_batch_nonfinite": nonfinite,
        "padded_batch_size": len(prompts),
    }


def kv_cache_parity(model: OnnxCausalLM, tokens: np.ndarray, decode_steps: int) -> dict[str, Any]:
    """Prefill of ``tokens[:-decode_steps]`` then ``decode_steps`` single-token steps vs one full pass.

    Args:
        tokens: int64 [sequence], longer than ``decode_steps``.

    Returns:
        ``kv_cache_max_abs_diff`` over the decoded positions, ``kv_cache_top1_pct``,
        ``kv_cache_steps``.
    """
    tokens = np.asarray(tokens, dtype=np.int64).reshape(1, -1)
    length = tokens.shape[1]
    prefill = length - decode_steps
    full, _ = model.forward(tokens)
    logits, past = model.forward(tokens[:, :prefill])
    steps = [logits[0, -1]]
    for t in range(prefill, length - 1):
        mask = np.ones((1, t + 1), dtype=np.int64)
        logits, past = model.forward(tokens[:, t : t + 1], mask, past)
        steps.append(logits[0, -1])
    cached = np.stack(steps)  # [decode_steps, vocab], positions prefill-1 .. length-2
    reference = full[0, prefill - 1 : length - 1]
    return {
        "kv_cache_max_abs_diff": float(np.abs(cached - reference).max()),
        "kv_cache_top1_pct": 100.0 * float((cached.argmax(-1) == reference.argmax(-1)).mean()),
        "kv_cache_steps": decode_steps,
    }


def onnx_generate(
    model: OnnxCausalLM, prompt: np.ndarray, max_new_tokens: int, eos_ids: Sequence[int], loop: str = "bound"
) -> list[int]:
    """Greedy generation with the KV cache, stopping after an end-of-sequence id (kept in the output).

    ``loop``: ``bound`` (IO binding, the default) or ``unbound`` (:meth:`OnnxCausalLM.generate`).
    """
    return model.generate(prompt, max_new_tokens, eos_ids=eos_ids, loop=loop)[0].tolist()


def torch_generate(torch_model, prompt: np.ndarray, max_new_tokens: int, eos_ids: Sequence[int], pad_id: int) -> list[int]:
    """PyTorch ``generate`` with greedy decoding and the same stopping ids."""
    import torch

    ids = torch.from_numpy(prompt.reshape(1, -1))
    with torch.inference_mode():
        out = torch_model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
            eos_token_id=list(eos_ids), pad_token_id=pad_id, temperature=None, top_p=None, top_k=None,
        )
    return out[0, ids.shape[1]:].tolist()


def matched_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading tokens two sequences share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def generation_parity(
    model: OnnxCausalLM, tokenizer, prompts: Sequence[str], prompt_ids: Sequence[np.ndarray],
    references: Sequence[Sequence[int]], max_new_tokens: int, eos_ids: Sequence[int], loop: str = "bound",
) -> dict[str, Any]:
    """Greedy outputs of the variant against PyTorch's (``references``, from :func:`torch_generate`).

    Returns:
        ``generation_match_pct`` (tokens matched before the first difference, percent of
        PyTorch's output length, averaged over prompts), ``generation_exact`` (prompts with
        identical output), and ``generation`` (per prompt: the texts and matched count).
    """
    details, shares = [], []
    for text, ids, reference in zip(prompts, prompt_ids, references):
        got = onnx_generate(model, ids, max_new_tokens, eos_ids, loop)
        matched = matched_prefix(reference, got)
        shares.append(matched / max(len(reference), 1))
        details.append({
            "prompt": text,
            "pytorch": tokenizer.decode(reference),
            "onnx": tokenizer.decode(got),
            "pytorch_tokens": len(reference),
            "onnx_tokens": len(got),
            "matched_tokens": matched,
        })
    return {
        "generation_match_pct": 100.0 * float(np.mean(shares)),
        "generation_exact": sum(d["matched_tokens"] == d["pytorch_tokens"] == d["onnx_tokens"] for d in details),
        "generation": details,
    }
