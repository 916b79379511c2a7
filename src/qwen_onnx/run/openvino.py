"""Run one of our ONNX variant folders with OpenVINO's CPU plugin, feeding the KV cache by hand.

:class:`OpenVinoCausalLM` reads the variant's ``model.onnx`` with OpenVINO's ONNX frontend
(``openvino.Core().read_model``; OpenVINO 2026.4 reads onnxruntime's ``com.microsoft`` operators
``MatMulNBits``, ``GatherBlockQuantized`` and ``GroupQueryAttention`` as well as the standard ones),
compiles it for ``CPU`` and gives it the calls the accuracy stage, the parity checks and the timing
sitting make of :class:`qwen_onnx.run.runtime.OnnxCausalLM`: ``forward`` (one pass, the cache in and
out as numpy arrays keyed by the graph's ``past_key_values.{i}.key`` / ``.value`` names, batch and
left padding as in ONNX Runtime), ``generate`` and ``greedy`` (greedy decoding with the KV cache).
The graph stays stateless: the cache is the graph's explicit inputs and outputs, as in our runtime
(optimum-intel's own OpenVINO export makes the cache a state of the compiled model instead).

CPU plugin settings (OpenVINO's CPU device and precision control pages,
https://docs.openvino.ai/2024/openvino-workflow/running-inference/inference-devices-and-modes/cpu-device.html,
https://docs.openvino.ai/2024/openvino-workflow/running-inference/optimize-inference/precision-control.html):

- ``INFERENCE_PRECISION_HINT`` is set to ``f32`` (:data:`PRECISION`): on CPUs with AVX-512 BF16 or
  AMX the plugin's default is ``bf16``, which would run every float layer in bfloat16 and measure
  OpenVINO's bf16 rather than our graph. Quantized weights (``MatMulNBits``' 4-bit and 8-bit) stay
  compressed; their products are computed in f32 (or with OpenVINO's dynamic quantization of the
  activations, below).
- ``INFERENCE_NUM_THREADS`` is the thread count asked for (the sitting's ``latency.threads``); the
  compiled model's value is read back and recorded.
- ``DYNAMIC_QUANTIZATION_GROUP_SIZE`` is left at the plugin's default (32 in 2026.4: activations of
  layers with compressed weights quantized to 8 bits per group of 32, where the plugin supports it),
  the counterpart of our graphs' ``accuracy_level`` 4 in ONNX Runtime; 0 turns it off.

:meth:`OpenVinoCausalLM.report` records what OpenVINO says it used: its version, the CPU plugin's
``OPTIMIZATION_CAPABILITIES`` and ``FULL_DEVICE_NAME``, the precision the plugin would pick without
the hint, the compiled model's properties read back, and from the compiled (runtime) model the
layers per runtime precision and the kernel implementations (``primitiveType``, e.g.
``jit_avx512_f32``).
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from typing import Any, Callable, Sequence

import numpy as np

from qwen_onnx.errors import OptionError, RunnerError
from qwen_onnx.run.greedy import unbound_greedy
from qwen_onnx.run.runtime import (
    LOOPS,
    KVLayout,
    decoder_feeds,
    empty_cache,
    uses_group_query_attention,
)
from qwen_onnx.store.artifacts import model_path

log = logging.getLogger(__name__)

#: The CPU plugin's inference precision hint: f32, so that float layers are not run in bf16 (module docstring).
PRECISION = "f32"
#: What ``envs/setup.sh`` installs (envs/requirements.txt).
INSTALL_HINT = "envs/setup.sh installs it (envs/requirements.txt)"
_PAST = "past_key_values."
#: Why a graph with ``GroupQueryAttention`` runs batch 1 here.
BATCH_ONE = ("OpenVINO 2026.4 runs GroupQueryAttention graphs batch 1 only (a batch of 2 or more gives empty "
             "outputs; its decomposition does not handle batch > 1, openvinotoolkit/openvino#37207)")
#: Compiled-model properties read back into :meth:`OpenVinoCausalLM.report`.
READ_BACK = ("INFERENCE_NUM_THREADS", "INFERENCE_PRECISION_HINT", "DYNAMIC_QUANTIZATION_GROUP_SIZE", "NUM_STREAMS",
              "PERFORMANCE_HINT", "EXECUTION_MODE_HINT", "ENABLE_CPU_PINNING", "ENABLE_HYPER_THREADING")
#: Runtime-model layers that only move data in or out (left out of the per-precision counts).
_NOT_COMPUTE = {"Input", "Output", "Const", "Parameter", "Result", "Constant"}


def openvino_version() -> str | None:
    """The installed OpenVINO's build string (``openvino.get_version()``), or None when it is not installed."""
    try:
        import openvino
    except ImportError:
        return None
    return openvino.get_version()


def _value(value: Any) -> Any:
    """A property value as JSON: OpenVINO element types as their short names (``f32``), enums as names."""
    if hasattr(value, "to_string"):
        return value.to_string()
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_value(v) for v in value]
    return getattr(value, "name", str(value))


def compiled_report(core, compiled, requested: dict[str, Any], *, kv_cache: str,
                    read_back: Sequence[str] = READ_BACK) -> dict[str, Any]:
    """What OpenVINO says a compiled model runs: ``openvino`` (version), ``device`` (``FULL_DEVICE_NAME``),
    ``optimization_capabilities`` (the CPU plugin's, e.g. ``FP32``, ``BF16``, ``INT8``),
    ``plugin_default_precision`` (the precision it picks without a hint), ``requested`` (the properties
    set), ``compiled`` (``read_back`` properties read back from the compiled model), ``layers_by_precision``
    (compute layers of the runtime model per ``runtimePrecision``; weights kept 4-bit show as ``u4``),
    ``kernels`` (their ``primitiveType`` implementations, e.g. ``brgemm_avx512_f32``) and ``kv_cache``."""
    import openvino

    read = {}
    for key in read_back:
        try:
            read[key] = _value(compiled.get_property(key))
        except Exception:  # noqa: BLE001 - a property this build does not have
            read[key] = None
    precisions, kernels = Counter(), Counter()
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        kind = info["layerType"].astype(str) if "layerType" in info else op.get_type_name()
        if kind in _NOT_COMPUTE:
            continue
        precisions[info["runtimePrecision"].astype(str) if "runtimePrecision" in info else "?"] += 1
        if "primitiveType" in info:
            kernels[info["primitiveType"].astype(str)] += 1
    return {
        "openvino": openvino.get_version(),
        "device": _value(core.get_property("CPU", "FULL_DEVICE_NAME")),
        "optimization_capabilities": _value(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")),
        "plugin_default_precision": _value(core.get_property("CPU", "INFERENCE_PRECISION_HINT")),
        "requested": {k: _value(v) for k, v in requested.items()},
        "compiled": read,
        "layers_by_precision": dict(sorted(precisions.items())),
        "kernels": dict(sorted(kernels.items())),
        "kv_cache": kv_cache,
    }


class OpenVinoCausalLM:
    """One ONNX variant folder compiled by OpenVINO for the CPU, with prefill/decode helpers.

    Args:
        folder: variant folder (or path to its ``model.onnx``).
        threads: the CPU plugin's ``INFERENCE_NUM_THREADS``; None for the plugin's default (every core).
        precision: ``INFERENCE_PRECISION_HINT`` (:data:`PRECISION`; ``bf16`` or ``f16`` to try the plugin's
            lower precisions).
        dynamic_quantization_group_size: ``DYNAMIC_QUANTIZATION_GROUP_SIZE``; None keeps the plugin's
            default, 0 turns dynamic quantization of activations off.

    Attributes:
        load_seconds: ``read_model`` plus ``compile_model``, seconds.
        kv: the cache's layout, read from the graph's inputs.
        max_batch: 1 for a graph with ``GroupQueryAttention`` (:data:`BATCH_ONE`), else None (any batch).

    Raises:
        ArtifactError: the model or its external data is missing.
        OptionError: ``threads`` below 1.
        RunnerError: OpenVINO is not installed, or it does not read or compile the graph (the
            message has OpenVINO's first line).
    """

    def __init__(self, folder: str | os.PathLike, *, threads: int | None = None, precision: str = PRECISION,
                 dynamic_quantization_group_size: int | None = None) -> None:
        if threads is not None and threads < 1:
            raise OptionError(f"threads must be at least 1, got {threads}")
        self.path = model_path(folder)
        try:
            import openvino
        except ImportError as exc:
            raise RunnerError(f"openvino is not installed ({exc}); {INSTALL_HINT}") from exc
        self.version = openvino.get_version()
        self.core = openvino.Core()
        config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": precision}
        if threads is not None:
            config["INFERENCE_NUM_THREADS"] = int(threads)
        if dynamic_quantization_group_size is not None:
            config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = int(dynamic_quantization_group_size)
        self.requested = {k: v for k, v in config.items()}
        started = time.perf_counter()
        try:
            model = self.core.read_model(str(self.path))
            self.compiled = self.core.compile_model(model, "CPU", config)
        except Exception as exc:  # noqa: BLE001 - OpenVINO raises RuntimeError and its own types
            first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            raise RunnerError(f"OpenVINO {self.version} did not compile {self.path}: {first.strip()}") from exc
        self.load_seconds = time.perf_counter() - started
        self.inputs = {name for port in self.compiled.inputs for name in port.get_names()}
        self.outputs = [(port.get_any_name(), port) for port in self.compiled.outputs]
        self.kv = self._kv_layout(model)
        del model
        self.max_batch = 1 if uses_group_query_attention(self.path) else None
        self.request = self.compiled.create_infer_request()
        threads_used = int(self.compiled.get_property("INFERENCE_NUM_THREADS"))
        if threads is not None and threads_used != threads:
            log.warning("OpenVINO runs %d threads, %d asked for", threads_used, threads)

    @staticmethod
    def _kv_layout(model) -> KVLayout:
        found = []
        for port in model.inputs:
            name = port.get_any_name()
            if name.startswith(_PAST):
                layer, kind = name[len(_PAST):].split(".")
                found.append((int(layer), kind != "key", name, port))
        layout = KVLayout()
        for _, _, name, port in sorted(found, key=lambda f: f[:2]):
            shape = port.get_partial_shape()  # [batch, kv_heads, past, head_dim]
            layout.names.append(name)
            layout.kv_heads = shape[1].get_length()
            layout.head_dim = shape[3].get_length()
            layout.dtype = np.float16 if port.get_element_type().to_string() == "f16" else np.float32
        return layout

    def report(self) -> dict[str, Any]:
        """What OpenVINO says it runs (:func:`compiled_report`)."""
        return compiled_report(self.core, self.compiled, self.requested,
                               kv_cache="explicit graph inputs and outputs (stateless), float32 numpy arrays")

    def empty_past(self, batch: int) -> dict[str, np.ndarray]:
        """Zero-length KV cache for ``batch`` sequences: each [batch, kv_heads, 0, head_dim]."""
        return empty_cache(self.kv, batch)

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray | None = None,
                past: dict[str, np.ndarray] | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """One forward pass of ``input_ids`` int64 [batch, sequence] after ``past`` (default empty);
        ``attention_mask`` int64 [batch, past + sequence] defaults to all ones.

        Returns:
            ``logits`` float32 [batch, sequence, vocab] and the new cache keyed by the *input* names
            (``past_key_values.{i}.key``), each [batch, kv_heads, past + sequence, head_dim] (copies
            owned by the caller).

        Raises:
            OptionError: a batch of more than one sequence on a ``GroupQueryAttention`` graph (:data:`BATCH_ONE`).
        """
        if self.max_batch is not None and np.shape(input_ids)[0] > self.max_batch:
            raise OptionError(f"{BATCH_ONE}; got input_ids of shape {list(np.shape(input_ids))}")
        feeds = decoder_feeds(self.inputs, self.kv, input_ids, attention_mask, past)
        # inputs shared with OpenVINO (no copy in), outputs copied out: the next step feeds them back
        result = self.request.infer(feeds, share_inputs=True, share_outputs=False)
        named = {name: result[port] for name, port in self.outputs}
        present = {name: named[name.replace("past_key_values", "present")] for name in self.kv.names}
        return named["logits"].astype(np.float32, copy=False), present

    def greedy(self, prompt_ids: np.ndarray, new_tokens: int, *, timings: list[float] | None = None,
               loop: str = "bound", step_logits: list[np.ndarray] | None = None) -> tuple[np.ndarray, float]:
        """Prefill ``prompt_ids`` int64 [1, prompt] then decode exactly ``new_tokens`` greedily
        (end-of-sequence ignored), as :meth:`qwen_onnx.run.runtime.OnnxCausalLM.greedy`.

        Returns:
            The generated ids int64 [new_tokens] and the prefill time in seconds (time to first token).
        """
        return self.generate(prompt_ids, new_tokens, timings=timings, loop=loop, step_logits=step_logits)

    def generate(self, prompt_ids: np.ndarray, max_new_tokens: int, *, eos_ids: Sequence[int] = (),
                 timings: list[float] | None = None, loop: str = "bound",
                 step_logits: list[np.ndarray] | None = None,
                 stop: Callable[[list[int]], bool] | None = None) -> tuple[np.ndarray, float]:
        """Greedy generation of up to ``max_new_tokens`` after ``prompt_ids`` int64 [prompt], stopping
        after one of ``eos_ids`` (kept in the output) or when ``stop(ids so far)`` is True
        (:func:`qwen_onnx.run.greedy.unbound_greedy`). ``loop`` is accepted for the interface of
        :class:`~qwen_onnx.run.runtime.OnnxCausalLM` (one loop here: the cache fed back as arrays).

        Args:
            timings: if given, receives the seconds of each single-token decode step.
            step_logits: if given, receives the last-position logits float32 [vocab] of the prefill
                and of every step.

        Returns:
            The generated ids int64 [generated] and the prefill time in seconds.

        Raises:
            ValueError: ``loop`` is not one of :data:`qwen_onnx.run.runtime.LOOPS`.
        """
        if loop not in LOOPS:
            raise ValueError(f"loop must be one of {LOOPS}, got {loop!r}")
        return unbound_greedy(self.forward, prompt_ids, max_new_tokens, eos_ids=eos_ids, timings=timings,
                              step_logits=step_logits, stop=stop)
