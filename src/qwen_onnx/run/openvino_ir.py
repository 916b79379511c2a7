"""An OpenVINO IR exported by optimum-intel (``openvino_model.xml``, the KV cache a state of the model), batch 1:
the ``openvino-int4`` peer's logits for the accuracy stage.

:class:`OpenVinoIrCausalLM` gives the compiled IR the calls the accuracy loop and the parity checks make
of :class:`qwen_onnx.run.runtime.OnnxCausalLM`, as :class:`qwen_onnx.run.llama_cpp.LlamaCppCausalLM`
does for llama.cpp: ``forward`` (a prefill from an empty state, or decode steps appended to it; ``past``
is the position the previous call returned) and greedy ``generate``. The IR's inputs are optimum-intel's
stateful decoder's: ``input_ids``, ``attention_mask``, ``position_ids`` and ``beam_idx`` (one beam here),
its output ``logits`` [batch, sequence, vocab]; the cache lives in the infer request's state
(``reset_state`` starts a sequence).

It runs with the CPU plugin's own defaults, as a user of optimum-intel or openvino-genai gets them
(bf16 inference precision on CPUs with AVX-512 BF16 or AMX, an 8-bit KV cache, dynamic quantization
of activations), plus the threads asked for; :meth:`OpenVinoIrCausalLM.report` records what the plugin
chose (:func:`qwen_onnx.run.openvino.compiled_report`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from qwen_onnx.errors import ArtifactError, OptionError, RunnerError
from qwen_onnx.run.openvino import INSTALL_HINT, READ_BACK, compiled_report

#: The IR file optimum-intel writes.
IR_FILE = "openvino_model.xml"
#: Why the padded-batch figures of the IR are absent.
IR_BATCH_ONE = "not applicable: the OpenVINO IR runs batch 1 here (its KV cache is a state of one sequence)"


def is_openvino_ir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder holding an OpenVINO IR decoder (``openvino_model.xml``)."""
    return (Path(path) / IR_FILE).is_file()


class OpenVinoIrCausalLM:
    """optimum-intel's OpenVINO IR of a causal LM compiled for the CPU, batch 1, the cache held between calls.

    Args:
        folder: the export folder (``openvino_model.xml`` and ``.bin``).
        threads: ``INFERENCE_NUM_THREADS``; None for the plugin's default.
        precision: ``INFERENCE_PRECISION_HINT``; None (default) keeps the plugin's (module docstring).

    Raises:
        ArtifactError: no ``openvino_model.xml`` in ``folder``.
        OptionError: ``threads`` below 1.
        RunnerError: OpenVINO is not installed, or it does not compile the IR.
    """

    def __init__(self, folder: str | os.PathLike, *, threads: int | None = None, precision: str | None = None):
        if threads is not None and threads < 1:
            raise OptionError(f"threads must be at least 1, got {threads}")
        self.path = Path(folder) / IR_FILE
        if not self.path.is_file():
            raise ArtifactError(f"no {IR_FILE} in {folder}: export the IR first (the openvino_export stage)")
        try:
            import openvino
        except ImportError as exc:
            raise RunnerError(f"openvino is not installed ({exc}); {INSTALL_HINT}") from exc
        self.core = openvino.Core()
        self.requested: dict[str, Any] = {}
        if threads is not None:
            self.requested["INFERENCE_NUM_THREADS"] = int(threads)
        if precision is not None:
            self.requested["INFERENCE_PRECISION_HINT"] = precision
        started = time.perf_counter()
        try:
            self.compiled = self.core.compile_model(str(self.path), "CPU", self.requested)
        except Exception as exc:  # noqa: BLE001 - OpenVINO raises RuntimeError and its own types
            first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            version = openvino.get_version()
            raise RunnerError(f"OpenVINO {version} did not compile {self.path}: {first.strip()}") from exc
        self.load_seconds = time.perf_counter() - started
        self.inputs = {name for port in self.compiled.inputs for name in port.get_names()}
        self.request = self.compiled.create_infer_request()
        self.position = 0

    def report(self) -> dict[str, Any]:
        """What OpenVINO says it runs (:func:`qwen_onnx.run.openvino.compiled_report`), KV cache precision included."""
        return compiled_report(self.core, self.compiled, self.requested, read_back=(*READ_BACK, "KV_CACHE_PRECISION"),
                               kv_cache="a state of the compiled model (KV_CACHE_PRECISION)")

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray | None = None,
                past: int | None = None) -> tuple[np.ndarray, int]:
        """Without ``past``, a prefill of ``input_ids`` int64 [1, sequence] from an empty state; with it (the
        position the previous call returned), the tokens appended after it. ``attention_mask`` is all ones
        (batch 1, no padding) and not used.

        Returns:
            ``logits`` float32 [1, sequence, vocab] and the next position.

        Raises:
            OptionError: a batch of more than one sequence, or ``past`` not the current position.
        """
        ids = np.asarray(input_ids, dtype=np.int64)
        if ids.ndim != 2 or ids.shape[0] != 1:
            raise OptionError(f"the OpenVINO IR runs batch 1 here; got input_ids of shape {list(ids.shape)}")
        if past is None:
            self.request.reset_state()
            self.position = 0
        elif past != self.position:
            raise OptionError(f"past {past} is not the position of the state ({self.position})")
        start, length = self.position, ids.shape[1]
        feeds = {"input_ids": ids, "attention_mask": np.ones((1, start + length), dtype=np.int64),
                 "position_ids": np.arange(start, start + length, dtype=np.int64).reshape(1, -1),
                 "beam_idx": np.zeros(1, dtype=np.int32)}
        self.request.infer({k: v for k, v in feeds.items() if k in self.inputs})
        self.position += length
        return np.array(self.request.get_tensor("logits").data, dtype=np.float32), self.position

    def generate(self, prompt_ids: np.ndarray, max_new_tokens: int, *, eos_ids: Sequence[int] = (),
                 loop: str = "bound") -> tuple[np.ndarray, None]:
        """Greedy generation after a prefill of ``prompt_ids``: up to ``max_new_tokens`` argmax tokens,
        stopping at a token of ``eos_ids`` (included); ``loop`` has no meaning here.

        Returns:
            The generated ids int64 [generated] and None (no prefill time measured).
        """
        logits, position = self.forward(np.asarray(prompt_ids).reshape(1, -1))
        eos, new = {int(e) for e in eos_ids}, []
        while len(new) < max_new_tokens:
            token = int(np.argmax(logits[0, -1]))
            new.append(token)
            if token in eos:
                break
            logits, position = self.forward(np.asarray([[token]], dtype=np.int64), past=position)
        return np.asarray(new, dtype=np.int64), None
