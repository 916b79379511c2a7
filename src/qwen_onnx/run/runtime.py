"""Run an exported Qwen ONNX decoder with ONNX Runtime, feeding the KV cache by hand.

The graph interface is optimum's ``text-generation-with-past`` export or onnxruntime-genai's model
builder graph (names read from the session's own ``get_inputs()``/``get_outputs()``, never assumed):

- inputs: ``input_ids`` int64 [batch, sequence], ``attention_mask`` int64 [batch, past + sequence],
  ``position_ids`` int64 [batch, sequence] (when present), and per layer ``past_key_values.{i}.key``
  / ``.value`` float [batch, kv_heads, past, head_dim];
- outputs: ``logits`` float [batch, sequence, vocab] and ``present.{i}.key`` / ``.value``
  [batch, kv_heads, past + sequence, head_dim].

The builder's own graphs (``GroupQueryAttention``) have no ``position_ids`` input (the operator derives
positions from ``attention_mask``; the optimized variant's adds it back, read by the operator's rotary)
and can share one past/present buffer: see :class:`BoundDecoder`.

Two decode loops give the same tokens:

- unbound (:meth:`OnnxCausalLM.forward`): ``session.run`` with numpy feeds; each step allocates new
  logits and present tensors and feeds them back as numpy arrays;
- bound (:class:`BoundDecoder`, the default of :meth:`OnnxCausalLM.greedy` and
  :meth:`OnnxCausalLM.generate`): ONNX Runtime IO binding to preallocated buffers, allocated once
  per decoder (grown only when a longer sequence asks for it), no per-step allocation or copy of the
  KV cache.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Container, Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort

from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.run.greedy import unbound_greedy
from qwen_onnx.run.session import resolve_settings, session_options
from qwen_onnx.store.artifacts import model_path

log = logging.getLogger(__name__)

_ORT_TO_NUMPY = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
}
_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")


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


LOOPS = ("bound", "unbound")


def empty_cache(kv: KVLayout, batch: int) -> dict[str, np.ndarray]:
    """Zero-length KV cache for ``batch`` sequences: each [batch, kv_heads, 0, head_dim]."""
    shape = (batch, kv.kv_heads, 0, kv.head_dim)
    return {name: np.zeros(shape, dtype=kv.dtype) for name in kv.names}


def decoder_feeds(
    inputs: Container[str],
    kv: KVLayout,
    input_ids: np.ndarray,
    attention_mask: np.ndarray | None = None,
    past: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """The feeds of one forward pass of a decoder graph whose inputs are named ``inputs``.

    Args:
        input_ids: int64 [batch, sequence].
        attention_mask: int64 [batch, past + sequence]; default all ones.
        past: the cache keyed ``past_key_values.{i}.key`` / ``.value``, each [batch, kv_heads, past,
            head_dim]; default empty (:func:`empty_cache`).

    Returns:
        ``input_ids``, ``attention_mask``, ``position_ids`` (int64 [batch, sequence], from the mask)
        and the cache, each only when the graph declares it.
    """
    input_ids = np.asarray(input_ids, dtype=np.int64)
    batch, sequence = input_ids.shape
    past = past if past is not None else empty_cache(kv, batch)
    past_length = next(iter(past.values())).shape[2] if past else 0
    if attention_mask is None:
        attention_mask = np.ones((batch, past_length + sequence), dtype=np.int64)
    attention_mask = np.asarray(attention_mask, dtype=np.int64)
    feeds = {"input_ids": input_ids, "attention_mask": attention_mask}
    if "position_ids" in inputs:
        feeds["position_ids"] = position_ids_from_mask(attention_mask, sequence)
    feeds.update(past)
    return {k: v for k, v in feeds.items() if k in inputs}


def uses_group_query_attention(path: str | os.PathLike) -> bool:
    """Whether the ONNX file at ``path`` computes attention with ``com.microsoft.GroupQueryAttention``
    (the graph is read without its external data)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    return any(node.op_type == "GroupQueryAttention" for node in graph.node)


class BoundDecoder:
    """Greedy decoding through ONNX Runtime IO binding, with buffers allocated once and reused.

    Every input and output is bound by pointer (``IOBinding.bind_input``/``bind_output`` with
    ``buffer_ptr``) into numpy buffers owned by the decoder; ``run_with_iobinding`` writes the
    logits and the cache straight into them, so a decode step neither allocates nor copies a KV
    tensor. Two cache schemes, chosen from the graph:

    - shared (``share_buffer``, graphs with ``GroupQueryAttention``, e.g. onnxruntime-genai's model
      builder): past and present of a layer are one [batch, kv_heads, max_length, head_dim] buffer,
      bound as both input and output; the operator reads the valid length from ``attention_mask``
      (``seqlens_k`` = sum of the mask - 1, ``total_sequence_length`` = its width) and writes the
      new key/value in place. This is onnxruntime-genai's ``past_present_share_buffer``
      (https://onnxruntime.ai/docs/genai/howto/past-present-share-buffer.html; ORT's
      ``ContribOperators.md``, GroupQueryAttention: "When past_key uses same tensor as
      present_key(k-v cache), it is of length max_sequence_length").
    - alternating (standard attention, optimum's export): present is [batch, kv_heads, past + 1,
      head_dim] and must be fed back as the next past. Each layer has two flat buffers of
      ``kv_heads * max_length * head_dim`` elements; a step binds past to a prefix of one (viewed
      as [1, kv_heads, past, head_dim], contiguous) and present to a prefix of the other, and the
      next step swaps them. (The graph's own Concat still writes past + new into present; only
      the shared scheme appends in place.)

    The logits are bound to a preallocated [1, 1, vocab] buffer during decode (the prefill's
    [1, prompt, vocab] buffer is allocated once per prompt length); greedy decode reads only the
    last position.

    Attributes:
        share_buffer: past and present share one buffer (GroupQueryAttention graphs).
        max_length: tokens (prompt + generated) the buffers hold; grown on demand.
        last_length, last_parity: tokens in the cache after the last :meth:`generate` and the
            alternating buffer that holds them (read them with :meth:`cache`).
        kv_pointers: data pointers of every KV buffer bound since the buffers were last allocated
            (input and output bindings); with no per-step allocation it never holds more than one
            (shared) or two (alternating) pointers per cache tensor.

    Raises:
        QwenOnnxError: a prompt plus new tokens longer than the graph's ``max_positions`` (shared
            buffers only: the builder's rotary cache length).
    """
    def __init__(self, model: "OnnxCausalLM", *, share_buffer: bool | None = None, max_positions: int | None = None):
        self.model = model
        self.session = model.session
        self.share_buffer = model.group_query_attention if share_buffer is None else share_buffer
        self.max_positions = max_positions
        self.max_length = 0
        self.binding = self.session.io_binding()
        self.kv_pointers: set[int] = set()
        self.last_length = 0
        self.last_parity = 0
        self._buffers: dict[str, list[np.ndarray]] = {}
        logits = next(o for o in self.session.get_outputs() if o.name == "logits")
        self.logits_dtype = _ORT_TO_NUMPY.get(logits.type, np.float32)
        self.vocab = int(logits.shape[-1])
        self._step_logits = np.empty((1, 1, self.vocab), dtype=self.logits_dtype)
        self._step_ids = np.zeros((1, 1), dtype=np.int64)
        self._step_positions = np.zeros((1, 1), dtype=np.int64)
        self._mask = np.ones((1, 0), dtype=np.int64)

    def _allocate(self, length: int) -> None:
        """(Re)allocate the cache and mask buffers for ``length`` tokens (only when they are too short)."""
        if length <= self.max_length:
            return
        kv = self.model.kv
        copies = 1 if self.share_buffer else 2
        if self.share_buffer:
            shape = (1, kv.kv_heads, length, kv.head_dim)
        else:
            shape = (kv.kv_heads * length * kv.head_dim,)
        self._buffers = {name: [np.zeros(shape, dtype=kv.dtype) for _ in range(copies)] for name in kv.names}
        self._mask = np.ones((1, length), dtype=np.int64)
        self.max_length = length
        self.kv_pointers = set()
        log.debug("KV buffers for %d tokens: %d x %d tensors of %s", length, copies, len(kv.names), shape)

    def _bind_array(self, name: str, array: np.ndarray, *, output: bool = False, shape=None) -> None:
        shape = list(array.shape if shape is None else shape)
        bind = self.binding.bind_output if output else self.binding.bind_input
        bind(name, "cpu", 0, array.dtype, shape, array.ctypes.data)

    def _bind_cache(self, past_length: int, sequence: int, parity: int) -> None:
        """Bind past (``past_length`` tokens) and present (``past_length + sequence``) of every layer."""
        kv = self.model.kv
        for name in kv.names:
            present = name.replace("past_key_values", "present")
            buffers = self._buffers[name]
            if self.share_buffer:
                (buffer,) = buffers
                self._bind_array(name, buffer)
                self._bind_array(present, buffer, output=True)
                self.kv_pointers.add(buffer.ctypes.data)
            else:
                past, out = buffers[parity], buffers[1 - parity]
                past_shape = (1, kv.kv_heads, past_length, kv.head_dim)
                present_shape = (1, kv.kv_heads, past_length + sequence, kv.head_dim)
                self._bind_array(name, past, shape=past_shape)
                self._bind_array(present, out, output=True, shape=present_shape)
                self.kv_pointers.update((past.ctypes.data, out.ctypes.data))

    def cache(self, name: str, length: int, parity: int = 0) -> np.ndarray:
        """A view of the cache tensor ``name`` holding ``length`` tokens: [1, kv_heads, length, head_dim]
        (``parity``: which of the alternating buffers)."""
        kv = self.model.kv
        buffer = self._buffers[name][0 if self.share_buffer else parity]
        if self.share_buffer:
            return buffer[:, :, :length]
        return buffer[: kv.kv_heads * length * kv.head_dim].reshape(1, kv.kv_heads, length, kv.head_dim)

    def _run(self, ids: np.ndarray, logits: np.ndarray, past_length: int, parity: int) -> None:
        sequence = ids.shape[1]
        total = past_length + sequence
        self._bind_array("input_ids", ids)
        self._bind_array("attention_mask", self._mask, shape=(1, total))
        if "position_ids" in self.model.inputs:
            if sequence == 1:
                self._step_positions[0, 0] = past_length
                positions = self._step_positions
            else:
                positions = np.arange(past_length, total, dtype=np.int64).reshape(1, -1)
            self._bind_array("position_ids", positions)
        self._bind_cache(past_length, sequence, parity)
        self._bind_array("logits", logits, output=True)
        self.session.run_with_iobinding(self.binding)

    def generate(
        self,
        prompt_ids: np.ndarray,
        max_new_tokens: int,
        *,
        eos_ids: Sequence[int] = (),
        timings: list[float] | None = None,
        step_logits: list[np.ndarray] | None = None,
        stop: Callable[[list[int]], bool] | None = None,
    ) -> tuple[np.ndarray, float]:
        """Prefill ``prompt_ids`` int64 [prompt] (or [1, prompt]) then decode greedily.

        Args:
            max_new_tokens: tokens to generate (exactly this many when ``eos_ids`` is empty).
            eos_ids: stop after generating one of these ids (kept in the output).
            stop: if given, called with the ids generated so far after each token; generation ends when
                it returns True (e.g. at a closed code block).
            timings: if given, receives the seconds of each single-token decode step.
            step_logits: if given, receives a copy of the last-position logits float32 [vocab]
                that chose each generated token (for tests; copying costs time).

        Returns:
            The generated ids int64 [generated] and the prefill time in seconds (time to first token).
        """
        prompt = np.ascontiguousarray(np.asarray(prompt_ids, dtype=np.int64).reshape(1, -1))
        length = prompt.shape[1]
        needed = length + max_new_tokens
        if self.max_positions is not None and needed > self.max_positions:

            raise QwenOnnxError(f"{length} prompt + {max_new_tokens} new tokens exceed the graph's "
                                f"{self.max_positions} positions")
        self._allocate(needed)
        eos = set(int(i) for i in eos_ids)
        started = time.perf_counter()
        prefill_logits = np.empty((1, length, self.vocab), dtype=self.logits_dtype)
        self._run(prompt, prefill_logits, 0, 0)
        token = int(prefill_logits[0, -1].argmax())
        prefill = time.perf_counter() - started
        if step_logits is not None:
            step_logits.append(prefill_logits[0, -1].astype(np.float32))
        generated = [token]
        parity = 1  # the prefill wrote present into buffer 1 (alternating scheme)
        while len(generated) < max_new_tokens and token not in eos and not (stop is not None and stop(generated)):
            step = time.perf_counter()
            self._step_ids[0, 0] = token
            self._run(self._step_ids, self._step_logits, length, parity)
            token = int(self._step_logits[0, -1].argmax())
            if timings is not None:
                timings.append(time.perf_counter() - step)
            if step_logits is not None:
                step_logits.append(self._step_logits[0, -1].astype(np.float32))
            generated.append(token)
            length += 1
            parity = 1 - parity
        self.last_length, self.last_parity = length, parity  # tokens in the cache, buffer holding them
        return np.array(generated, dtype=np.int64), prefill


class OnnxCausalLM:
    """An ONNX Runtime session over one variant folder, with prefill/decode helpers.

    Args:
        folder: variant folder (or path to its ``model.onnx``).
        threads: intra-op threads; None for ORT's default.
        provider: ONNX Runtime execution provider, default ``CPUExecutionProvider``.
        settings: session settings over :data:`DEFAULT_SETTINGS` (see :func:`session_options`).

    Raises:
        ArtifactError: the model or its external data is missing.
        ValueError: an unknown session setting.
    """
    def __init__(
        self,
        folder: str | os.PathLike,
        *,
        threads: int | None = None,
        provider: str = "CPUExecutionProvider",
        profile_prefix: str | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        self.path = model_path(folder)
        self.settings = resolve_settings(settings)
        started = time.perf_counter()
        self.session = ort.InferenceSession(
            str(self.path), session_options(threads, profile_prefix=profile_prefix, settings=settings),
            providers=[provider],
        )
        self.load_seconds = time.perf_counter() - started
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.kv = self._kv_layout()
        self.group_query_attention = uses_group_query_attention(self.path)
        self._decoder: BoundDecoder | None = None

    @property
    def decoder(self) -> BoundDecoder:
        """The IO-bound decoder of this session (created on first use, buffers kept between calls)."""
        if self._decoder is None:
            max_positions = None
            config = self.path.parent / "config.json"
            if self.group_query_attention and config.is_file():
                import json

                max_positions = json.loads(config.read_text(encoding="utf-8")).get("max_position_embeddings")
            self._decoder = BoundDecoder(self, max_positions=max_positions)
        return self._decoder

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
        return empty_cache(self.kv, batch)

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
        return decoder_feeds(self.inputs, self.kv, input_ids, attention_mask, past)

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
        self,
        prompt_ids: np.ndarray,
        new_tokens: int,
        *,
        timings: list[float] | None = None,
        loop: str = "bound",
        step_logits: list[np.ndarray] | None = None,
    ) -> tuple[np.ndarray, float]:
        """Prefill ``prompt_ids`` int64 [1, prompt] then decode ``new_tokens`` greedily with the KV cache.

        End-of-sequence ids are ignored so that every call decodes exactly ``new_tokens`` tokens.

        Args:
            timings: if given, receives the seconds of each decode step.
            loop: ``bound`` (IO binding, :class:`BoundDecoder`) or ``unbound`` (``session.run`` with
                numpy feeds, :meth:`forward`); both give the same tokens.
            step_logits: if given, receives the last-position logits float32 [vocab] of the
                prefill and of every step.

        Returns:
            The generated ids int64 [new_tokens] and the prefill time in seconds (time to first
            token: the first generated id is the argmax of the prefill logits).

        Raises:
            ValueError: ``loop`` is not one of :data:`LOOPS`.
        """
        return self.generate(prompt_ids, new_tokens, timings=timings, loop=loop, step_logits=step_logits)

    def generate(
        self,
        prompt_ids: np.ndarray,
        max_new_tokens: int,
        *,
        eos_ids: Sequence[int] = (),
        timings: list[float] | None = None,
        loop: str = "bound",
        step_logits: list[np.ndarray] | None = None,
        stop: Callable[[list[int]], bool] | None = None,
    ) -> tuple[np.ndarray, float]:
        """Greedy generation of up to ``max_new_tokens`` after ``prompt_ids`` int64 [prompt], stopping
        after one of ``eos_ids`` (kept in the output) or when ``stop`` (called with the ids generated so far
        after each token) returns True; see :meth:`greedy` for the other arguments.

        Returns:
            The generated ids int64 [generated] and the prefill time in seconds.

        Raises:
            ValueError: ``loop`` is not one of :data:`LOOPS`.
        """
        if loop not in LOOPS:
            raise ValueError(f"loop must be one of {LOOPS}, got {loop!r}")
        if loop == "bound":
            return self.decoder.generate(prompt_ids, max_new_tokens, eos_ids=eos_ids, timings=timings,
                                         step_logits=step_logits, stop=stop)
        return unbound_greedy(self.forward, prompt_ids, max_new_tokens, eos_ids=eos_ids, timings=timings,
                              step_logits=step_logits, stop=stop)
