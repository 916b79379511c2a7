"""The fields of a Qwen ``config.json`` that change the computation, and what the graphs do with each.

Every graph this project writes either reproduces a field (and a test checks it against PyTorch in
the regime the field changes) or the checkpoint is refused before any output, in one line naming
the field and its value (:func:`check_config`):

| field | fp32 export (optimum) | ``optimized`` (onnxruntime-genai builder) |
|---|---|---|
| ``use_sliding_window``, ``sliding_window``, ``max_window_layers``, ``layer_types`` | traced masks | each layer's ``local_window_size`` (:func:`layer_windows`) |
| ``rope_scaling`` ``linear``, ``yarn``, ``llama3`` | traced frequencies | rotary caches from transformers (:func:`rotary_caches`) over :func:`context_length` positions |
| ``rope_scaling`` ``dynamic``, ``longrope`` | refused | refused |
| ``max_position_embeddings`` | no limit | rotary cache length (:func:`context_length`) |
| ``head_dim``, biases, q/k norms, ``tie_word_embeddings`` | traced | the builder's own handling |

``dynamic`` (NTK) and ``longrope`` recompute the rotary frequencies from each input's length once it
passes the original context (transformers' ``dynamic_rope_update``); a traced graph keeps the
frequencies of the length it was traced at, so beyond the original context it computes another
function (a tiny Qwen2 with ``dynamic``, factor 4, at 200 tokens: perplexity +14.7%, KL 1.19).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from qwen_onnx.errors import ArchitectureError

#: rope_scaling types whose frequencies are fixed at load time: reproduced by every graph.
STATIC_ROPE_TYPES = ("default", "linear", "yarn", "llama3")
#: rope_scaling types that depend on the input's length: refused, with the reason.
LENGTH_DEPENDENT_ROPE_TYPES = {
    "dynamic": "recomputes the rotary frequencies from each input's length (dynamic NTK)",
    "longrope": "switches between short and long rotary factors with the input's length",
}


def _parsed(config: Mapping[str, Any] | Any):
    """A transformers config object from a ``config.json`` dict (or the object itself)."""
    if isinstance(config, Mapping):
        from transformers import AutoConfig

        return AutoConfig.for_model(**config)
    return config


def rope_type(config: Mapping[str, Any] | Any) -> str:
    """The ``rope_scaling`` type (``rope_type``, or the older ``type`` key), ``default`` without one."""
    scaling = getattr(_parsed(config), "rope_scaling", None) or {}
    return str(scaling.get("rope_type") or scaling.get("type") or "default")


def check_config(config: Mapping[str, Any] | Any, source: str) -> None:
    """Refuse a checkpoint whose config asks for a computation the exported graphs cannot reproduce.

    Args:
        config: ``config.json`` as a dict, or a transformers config.
        source: the checkpoint, for the message.

    Raises:
        ArchitectureError: one line naming the field, its value and the fix, e.g. ``rope_scaling
            type 'dynamic' (factor 4) recomputes ...``.
    """
    parsed = _parsed(config)
    kind = rope_type(parsed)
    scaling = getattr(parsed, "rope_scaling", None) or {}
    if kind in LENGTH_DEPENDENT_ROPE_TYPES:
        raise ArchitectureError(
            f"{source}: rope_scaling type {kind!r} (factor {scaling.get('factor')}) "
            f"{LENGTH_DEPENDENT_ROPE_TYPES[kind]}, which an exported graph cannot do past the original context; "
            f"remove rope_scaling from config.json or use a static type ({', '.join(STATIC_ROPE_TYPES[1:])})"
        )
    if kind not in STATIC_ROPE_TYPES:
        raise ArchitectureError(f"{source}: rope_scaling type {kind!r} is not one qwen-onnx reproduces; use one of "
                                f"{', '.join(STATIC_ROPE_TYPES[1:])} or none")


def context_length(config: Mapping[str, Any] | Any) -> int:
    """Positions the rotary caches and the KV cache cover: ``max_position_embeddings``, or with a
    static ``rope_scaling`` ``factor`` times the original context (``original_max_position_embeddings``,
    else ``max_position_embeddings``) when that is longer."""
    parsed = _parsed(config)
    base = int(getattr(parsed, "max_position_embeddings", None) or 4096)
    scaling = getattr(parsed, "rope_scaling", None) or {}
    if rope_type(parsed) == "default" or not scaling.get("factor"):
        return base
    original = int(scaling.get("original_max_position_embeddings") or base)
    return max(base, int(float(scaling["factor"]) * original))


def layer_windows(config: Mapping[str, Any] | Any) -> list[int]:
    """Each decoder layer's attention window as ``GroupQueryAttention``'s ``local_window_size``.

    transformers windows the layers whose ``layer_types`` entry is ``sliding_attention`` (by default
    those from ``max_window_layers`` on, when ``use_sliding_window`` is true) to ``sliding_window``;
    the kernel's ``local_window_size`` of the same value gives PyTorch's logits to 2e-5 past the
    window (a tiny Qwen2, 96 tokens, window 16). -1: full attention.

    Returns:
        int [num_hidden_layers].
    """
    parsed = _parsed(config)
    types = getattr(parsed, "layer_types", None) or ["full_attention"] * parsed.num_hidden_layers
    window = getattr(parsed, "sliding_window", None)
    return [int(window) if kind == "sliding_attention" and window else -1 for kind in types]


def rotary_caches(config: Mapping[str, Any] | Any, length: int) -> tuple[np.ndarray, np.ndarray]:
    """``GroupQueryAttention``'s ``cos_cache`` and ``sin_cache`` as transformers computes them.

    The inverse frequencies and the attention scaling (YaRN's ``mscale``) come from transformers'
    ``ROPE_INIT_FUNCTIONS`` for the config's ``rope_scaling`` type, and the products in float32
    as its rotary embedding forms them (``cos(position * inv_freq) * attention_scaling``).

    Args:
        length: positions, e.g. :func:`context_length`.

    Returns:
        ``(cos, sin)``: float32 [length, rotary_dim / 2] each (non-interleaved halves).
    """
    import torch
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    parsed = _parsed(config)
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type(parsed)](parsed, "cpu")
    positions = torch.arange(length, dtype=torch.float32)
    freqs = torch.outer(positions, inv_freq.float())
    return ((freqs.cos() * scaling).numpy().astype(np.float32), (freqs.sin() * scaling).numpy().astype(np.float32))
