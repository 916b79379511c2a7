"""Calibration data: windows of real text fed to a graph as prefills, for onnxruntime's static
quantization, GPTQ, the sensitivity analysis, SmoothQuant and the streaming range calibrator
(:mod:`qwen_onnx.quantize.activation_ranges`)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import onnx

from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.run.session import SHARED_CORES_SETTINGS, session_options

log = logging.getLogger(__name__)


class TextCalibrationReader:
    """``onnxruntime.quantization.CalibrationDataReader`` over windows of real text.

    Each sample is one window of ``sequence_length`` tokens fed as a prefill: ``input_ids`` int64
    [1, sequence], ``attention_mask`` of ones, ``position_ids`` 0..sequence-1, and empty past
    keys/values [1, kv_heads, 0, head_dim], with names, shapes and dtypes read from the graph's own
    inputs (what ``InferenceSession.get_inputs()`` would report, read without loading weights).

    Args:
        model_path: the ONNX model that calibration will run (the pre-processed graph).
        windows: int64 [samples, sequence] token windows.
    """
    def __init__(self, model_path: str | os.PathLike, windows: np.ndarray) -> None:
        graph = onnx.load(str(model_path), load_external_data=False).graph
        initializers = {t.name for t in graph.initializer}
        self._inputs = []
        for value in graph.input:
            if value.name in initializers:
                continue
            tensor = value.type.tensor_type
            shape = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in tensor.shape.dim]
            dtype = "tensor(float16)" if tensor.elem_type == onnx.TensorProto.FLOAT16 else "tensor(other)"
            self._inputs.append((value.name, shape, dtype))
        self._windows = np.asarray(windows, dtype=np.int64)
        self._iter: Iterator[dict[str, np.ndarray]] | None = None

    def feeds(self, window: np.ndarray) -> dict[str, np.ndarray]:
        """Session feeds for one window int64 [sequence]."""
        sequence = window.shape[0]
        feeds: dict[str, np.ndarray] = {}
        for name, shape, dtype in self._inputs:
            if name == "input_ids":
                feeds[name] = window.reshape(1, sequence)
            elif name == "attention_mask":
                feeds[name] = np.ones((1, sequence), dtype=np.int64)
            elif name == "position_ids":
                feeds[name] = np.arange(sequence, dtype=np.int64).reshape(1, sequence)
            elif name.startswith("past_key_values."):
                np_dtype = np.float16 if dtype == "tensor(float16)" else np.float32
                feeds[name] = np.zeros((1, int(shape[1]), 0, int(shape[3])), dtype=np_dtype)
            else:
                raise QwenOnnxError(f"calibration cannot feed graph input {name!r} {shape} {dtype}")
        return feeds

    def __len__(self) -> int:
        return len(self._windows)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        """Every window's feeds, from the first (what ``CalibrationDataReader.__iter__`` yields)."""
        return (self.feeds(w) for w in self._windows)

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._iter is None:
            self._iter = (self.feeds(w) for w in self._windows)
        return next(self._iter, None)

    def rewind(self) -> None:
        self._iter = None


def capture_session(proto: onnx.ModelProto, tensor_names: Sequence[str], path: Path, threads: int | None = None):
    """An ONNX Runtime session of ``proto`` with ``tensor_names`` added as graph outputs, saved at
    ``path`` (beside the weights; graph optimizations off so that every named tensor exists)."""
    import onnxruntime as ort


    capture = onnx.ModelProto()
    capture.CopyFrom(proto)
    present = {o.name for o in capture.graph.output}
    for name in tensor_names:
        if name not in present:
            capture.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    onnx.save_model(capture, str(path))
    del capture
    options = session_options(threads, settings=SHARED_CORES_SETTINGS)  # beside other jobs: no spinning
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
