"""Run an exported Qwen ONNX decoder with ONNX Runtime, feeding the KV cache by hand.

The graph interface is optimum's ``text-generation-with-past`` export (names read from the
session's own ``get_inputs()``/``get_outputs()``, never assumed):

- inputs: ``input_ids`` int64 [batch, sequence], ``attention_mask`` int64 [batch, past + sequence],
  ``position_ids`` int64 [batch, sequence] (when present), and per layer ``past_key_values.{i}.key``
  / ``.value`` float [batch, kv_heads, past, head_dim];
- outputs: ``logits`` float [batch, sequence, vocab] and ``present.{i}.key`` / ``.value``
  [batch, kv_heads, past + sequence, head_dim].
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .artifacts import model_path

log = logging.getLogger(__name__)

_ORT_TO_NUMPY = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
}
_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")


def session_options(threads: int | None = None, *, profile_prefix: str | None = None) -> ort.SessionOptions:
    """ONNX Runtime session options with ``threads`` intra-op threads (0 or None: ORT's default)."""
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = int(threads)
        options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return options


def position_ids_from_mask(attention_mask: np.ndarray, sequence_length: int) -> np.ndarray:
    """Position ids for the last ``sequence_length`` tokens: cumulative sum of the mask minus one.

    Left padding gets position 0 (the convention of transformers' ``generate`` and optimum's
    ``ORTModelForCausalLM``).

    Args:
        attention_mask: int64 [batch, past + sequence], 1 for real tokens, 0 for padding.
        sequence_length: number of new tokens.

    Returns:
        int64 [batch, sequence].
    """
    positions = np.cumsum(attention_mask, axis=-1) - 1
    positions = np.where(attention_mask == 0, 0, positions)
    return positions[:, -sequence_length:].astype(np.int64)


@dataclass
class KVLayout:
    """Shape of the KV cache inputs read from the graph.

    Attributes:
        names: ``past_key_values.{i}.key`` / ``.value`` in layer order.
        kv_heads: key/value heads per layer (grouped-query attention when below attention heads).
        head_dim: size of one head.
        dtype: numpy dtype of the cache.
    """

    names: list[str] = field(default_factory=list)
    kv_heads: int = 0
    head_dim: int = 0
    dtype: type = np.float32

    @property
    def layers(self) -> int:
        return len(self.names) // 2


class OnnxCausalLM:
    """An ONNX Runtime session over one variant folder, with prefill/decode helpers.

    Args:
        folder: variant folder (or path to its ``model.onnx``).
        threads: intra-op threads; None for ORT's default.
        provider: ONNX Runtime execution provider, default ``CPUExecutionProvider``.

    Raises:
        ArtifactError: the model or its external data is missing.
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        *,
        threads: int | None = None,
        provider: str = "CPUExecutionProvider",
        profile_prefix: str | None = None,
    ) -> None:
        self.path = model_path(folder)
        started = time.perf_counter()
        self.session = ort.InferenceSession(
            str(self.path), session_options(threads, profile_prefix=profile_prefix), providers=[provider]
        )
        self.load_seconds = time.perf_counter() - started
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.kv = self._kv_layout()

    def _kv_layout(self) -> KVLayout:
        layout = KVLayout()
        found = []
        for name, meta in self.inputs.items():
            match = _PAST.match(name)
            if match:
                found.append((int(match.group(1)), match.group(2) != "key", name, meta))
        found.sort()
        for _, _, name, meta in found:
            layout.names.append(name)
            layout.kv_heads = int(meta.shape[1])
            layout.head_dim = int(meta.shape[3])
            layout.dtype = _ORT_TO_NUMPY.get(meta.type, np.float32)
        return layout

    def empty_past(self, batch: int) -> dict[str, np.ndarray]:
        """Zero-length KV cache for ``batch`` sequences: each [batch, kv_heads, 0, head_dim]."""
        shape = (batch, self.kv.kv_heads, 0, self.kv.head_dim)
        return {name: np.zeros(shape, dtype=self.kv.dtype) for name in self.kv.names}

    def feeds(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray | None = None,
        past: dict[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """Build the session feeds for ``input_ids`` int64 [batch, sequence].

        ``attention_mask`` int64 [batch, past + sequence] defaults to all ones; ``past`` defaults
        to an empty cache. Only inputs that the graph declares are fed.
        """
        input_ids = np.asarray(input_ids, dtype=np.int64)
        batch, sequence = input_ids.shape
        past = past if past is not None else self.empty_past(batch)
        past_length = next(iter(past.values())).shape[2] if past else 0
        if attention_mask is None:
            attention_mask = np.ones((batch, past_length + sequence), dtype=np.int64)
        attention_mask = np.asarray(attention_mask, dtype=np.int64)
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask}
        if "position_ids" in self.inputs:
            feeds["position_ids"] = position_ids_from_mask(attention_mask, sequence)
        feeds.update(past)
        return {k: v for k, v in feeds.items() if k in self.inputs}

    def forward(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray | None = None,
        past: dict[str, np.ndarray] | None = None,
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """One forward pass.

        Returns:
            ``logits`` float32 [batch, sequence, vocab] and the new cache keyed by the *input*
            names (``past_key_values.{i}.key``), each [batch, kv_heads, past + sequence, head_dim].
        """
        outputs = self.session.run(None, self.feeds(input_ids, attention_mask, past))
        named = dict(zip(self.output_names, outputs))
        present = {
            name: named[name.replace("past_key_values", "present")]
            for name in self.kv.names
            if name.replace("past_key_values", "present") in named
        }
        return named["logits"].astype(np.float32, copy=False), present

    def greedy(
        self, prompt_ids: np.ndarray, new_tokens: int, *, timings: list[float] | None = None
    ) -> tuple[np.ndarray, float]:
        """Prefill ``prompt_ids`` int64 [1, prompt] then decode ``new_tokens`` greedily with the KV cache.

        End-of-sequence ids are ignored so that every call decodes exactly ``new_tokens`` tokens.

        Args:
            timings: if given, receives the seconds of each decode step.

        Returns:
            The generated ids int64 [new_tokens] and the prefill time in seconds (time to first
            token: the first generated id is the argmax of the prefill logits).
        """
        prompt_ids = np.asarray(prompt_ids, dtype=np.int64).reshape(1, -1)
        started = time.perf_counter()
        logits, past = self.forward(prompt_ids)
        token = int(logits[0, -1].argmax())
        prefill = time.perf_counter() - started
        generated = [token]
        mask = np.ones((1, prompt_ids.shape[1] + 1), dtype=np.int64)
        for _ in range(new_tokens - 1):
            step = time.perf_counter()
            logits, past = self.forward(np.array([[token]], dtype=np.int64), mask, past)
            token = int(logits[0, -1].argmax())
            generated.append(token)
            mask = np.ones((1, mask.shape[1] + 1), dtype=np.int64)
            if timings is not None:
                timings.append(time.perf_counter() - step)
        return np.array(generated, dtype=np.int64), prefill


def end_profiling(model: OnnxCausalLM) -> Path:
    """Stop ONNX Runtime profiling and return the JSON trace path."""
    return Path(model.session.end_profiling())
