"""INT8 dynamic and static (QDQ) quantization with onnxruntime.quantization, and calibration data.

Both take the pre-processed graph (ORT's recommended input,
https://onnxruntime.ai/docs/performance/model-optimizations/quantization.html) and write a
self-contained variant folder with one external data file.

- Dynamic: weights quantized offline (QInt8, per-channel or per-tensor), activations quantized at
  run time per batch (``quantize_dynamic``).
- Static: QDQ (QuantizeLinear/DequantizeLinear pairs around each quantized op) with activation
  ranges from calibration on real text (``quantize_static``), MinMax, Entropy or Percentile.
  Only MatMuls with a constant weight are quantized by default (``MatMulConstBOnly``), so the
  attention score and context products, normalisation and Softmax stay float.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import onnx

from .artifacts import MODEL_FILE, copy_side_files, library_versions, model_path, staged_dir, write_json
from .errors import QwenOnnxError
from .export import normalise_external_data
from .external import ScratchFiles, lazy_model
from .text import token_windows

log = logging.getLogger(__name__)

#: Op types never put in ``op_types_to_quantize`` (they stay float): normalisation and Softmax.
FLOAT_ONLY_OPS = frozenset(
    {"Softmax", "LayerNormalization", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization",
     "SkipLayerNormalization", "RMSNormalization", "ReduceMean", "Pow", "Sqrt", "Div"}
)
CALIBRATION_METHODS = ("MinMax", "Entropy", "Percentile")


@dataclass
class DynamicSettings:
    """Settings of ``quantize_dynamic``.

    Attributes:
        op_types: op types to quantize (default ``["MatMul"]``).
        per_channel: one scale per output channel of each weight instead of one per tensor.
        reduce_range: 7-bit weights, for CPUs without VNNI (ORT docs).
        nodes_to_exclude: node names kept float.
    """

    op_types: list[str] = field(default_factory=lambda: ["MatMul"])
    per_channel: bool = True
    reduce_range: bool = False
    nodes_to_exclude: list[str] = field(default_factory=list)


@dataclass
class StaticSettings:
    """Settings of ``quantize_static`` with QDQ format.

    Attributes:
        op_types: op types to quantize (normalisation and Softmax are refused).
        per_channel: per-channel weight scales.
        method: calibration method, one of ``MinMax``, ``Entropy``, ``Percentile``.
        samples: number of calibration windows of ``sequence_length`` tokens.
        sequence_length: tokens per calibration window.
        activation_type: ``QUInt8`` or ``QInt8`` (ORT recommends U8S8 on x86 CPUs).
        weight_type: ``QInt8`` or ``QUInt8``.
        activation_symmetric: symmetric activation ranges.
        matmul_const_b_only: quantize only MatMuls whose second input is a constant weight.
        nodes_to_exclude: node names kept float.
    """

    op_types: list[str] = field(default_factory=lambda: ["MatMul"])
    per_channel: bool = True
    method: str = "MinMax"
    samples: int = 8
    sequence_length: int = 128
    activation_type: str = "QUInt8"
    weight_type: str = "QInt8"
    activation_symmetric: bool = False
    matmul_const_b_only: bool = True
    nodes_to_exclude: list[str] = field(default_factory=list)


def _load_graph_with_shape_infer(model_path: Path) -> onnx.ModelProto:
    """onnxruntime's ``load_model_with_shape_infer`` without loading weight data.

    Weights stay external references, read one at a time by ``numpy_helper.to_array`` from the
    working directory (see :func:`qwen_onnx.external.lazy_model`).
    """
    from onnxruntime.quantization.quant_utils import add_infer_metadata, generate_identified_filename

    inferred = generate_identified_filename(Path(model_path), "-inferred")
    onnx.shape_inference.infer_shapes_path(str(model_path), str(inferred))
    model = onnx.load(str(inferred), load_external_data=False)
    add_infer_metadata(model)
    inferred.unlink()
    return model


@contextlib.contextmanager
def lazy_quantization(input_dir: str | os.PathLike) -> Iterator[tuple[Path, ScratchFiles]]:
    """Run onnxruntime's quantizers on ``input_dir`` without holding all weights in memory.

    Yields the path of a graph-only copy of the model beside its weights, and the
    :class:`~qwen_onnx.external.ScratchFiles` namer for other temporary files there (see
    :func:`qwen_onnx.external.lazy_model`). While inside, onnxruntime.quantization loads models
    without their data; each weight is read when the quantizer needs it. Quantized weights are new
    tensors; the float weights it leaves untouched (embeddings, norms) stay references to
    ``input_dir/model.onnx_data``, which :func:`qwen_onnx.export.normalise_external_data` copies
    into the output (``search=[input_dir]``).
    """
    import importlib

    modules = tuple(
        importlib.import_module(f"onnxruntime.quantization.{name}") for name in ("quant_utils", "quantize", "calibrate")
    )
    saved = [m.load_model_with_shape_infer for m in modules]
    with lazy_model(input_dir) as (proto, scratch):
        graph_only = scratch / "input.onnx"
        onnx.save_model(proto, str(graph_only))
        del proto
        for module in modules:
            module.load_model_with_shape_infer = _load_graph_with_shape_infer
        try:
            yield graph_only, scratch
        finally:
            for module, original in zip(modules, saved):
                module.load_model_with_shape_infer = original


def _check_op_types(op_types: Sequence[str]) -> None:
    bad = sorted(set(op_types) & FLOAT_ONLY_OPS)
    if bad:
        raise QwenOnnxError(
            f"op types {', '.join(bad)} must stay float (normalisation and Softmax lose too much in INT8); "
            "remove them from op_types"
        )


def _node_names(path: Path) -> set[str]:
    return {n.name for n in onnx.load(str(path), load_external_data=False).graph.node}


def activation_matmuls(path: str | os.PathLike) -> list[str]:
    """Names of MatMul nodes whose second input is not a constant weight.

    These are the attention score and context products (Q·Kᵀ, softmax·V) and the rotary
    embedding's frequency product. onnxruntime's ``MatMulConstBOnly`` option is honoured by its
    QOperator and dynamic quantizers but not by the QDQ quantizer (onnxruntime 1.32), so the static
    variant passes these names in ``nodes_to_exclude`` to keep them float.
    """
    graph = onnx.load(str(path), load_external_data=False).graph
    constants = {t.name for t in graph.initializer}
    constants |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    return [n.name for n in graph.node if n.op_type == "MatMul" and n.input[1] not in constants]


def _check_excluded(path: Path, names: Sequence[str]) -> None:
    unknown = sorted(set(names) - _node_names(path))
    if unknown:
        raise QwenOnnxError(
            f"nodes_to_exclude names {len(unknown)} node(s) not in {path}: {', '.join(unknown[:5])}; "
            "use `qwen-onnx inspect` to list node names of the pre-processed graph"
        )


def quantize_dynamic_variant(
    input_dir: str | os.PathLike, output_dir: str | os.PathLike, settings: DynamicSettings
) -> dict:
    """Dynamic INT8 quantization of the pre-processed variant at ``input_dir``.

    Returns:
        Provenance written to ``output_dir/quantize.json``.

    Raises:
        QwenOnnxError: a float-only op type is requested or an excluded node does not exist.
        ArtifactError: the input model or its external data is missing.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    input_dir = Path(input_dir).resolve()
    source = model_path(input_dir)
    _check_op_types(settings.op_types)
    _check_excluded(source, settings.nodes_to_exclude)
    started = time.time()
    with staged_dir(output_dir) as stage, lazy_quantization(input_dir) as (graph_only, _):
        quantize_dynamic(
            graph_only,
            stage / MODEL_FILE,
            op_types_to_quantize=list(settings.op_types),
            per_channel=settings.per_channel,
            reduce_range=settings.reduce_range,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=list(settings.nodes_to_exclude),
            use_external_data_format=True,
            extra_options={"MatMulConstBOnly": True},
        )
        normalise_external_data(stage, search=[input_dir])
        copy_side_files(input_dir, stage)
        info = {
            "kind": "dynamic",
            "settings": asdict(settings),
            "seconds": round(time.time() - started, 1),
            "library_versions": library_versions(),
        }
        write_json(stage / "quantize.json", info)
    return info


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

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._iter is None:
            self._iter = (self.feeds(w) for w in self._windows)
        return next(self._iter, None)

    def rewind(self) -> None:
        self._iter = None


def quantize_static_variant(
    input_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    calibration_text: str | os.PathLike,
    settings: StaticSettings,
) -> dict:
    """Static INT8 QDQ quantization of the pre-processed variant, calibrated on ``calibration_text``.

    Returns:
        Provenance written to ``output_dir/quantize.json``, including the calibration token count.

    Raises:
        QwenOnnxError: an unknown calibration method, a float-only op type, an excluded node that
            does not exist, or a calibration text too short for the requested samples.
    """
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.calibrate import create_calibrator, save_tensors_data
    from transformers import AutoTokenizer

    if settings.method not in CALIBRATION_METHODS:
        raise QwenOnnxError(f"calibration method {settings.method!r} unknown; use one of {', '.join(CALIBRATION_METHODS)}")
    _check_op_types(settings.op_types)
    input_dir = Path(input_dir).resolve()
    source = model_path(input_dir)
    _check_excluded(source, settings.nodes_to_exclude)
    tokenizer = AutoTokenizer.from_pretrained(input_dir)
    windows = token_windows(tokenizer, calibration_text, settings.sequence_length, settings.samples)
    reader = TextCalibrationReader(source, windows)
    method = getattr(CalibrationMethod, settings.method)
    excluded = list(settings.nodes_to_exclude)
    if settings.matmul_const_b_only:
        excluded += [name for name in activation_matmuls(source) if name not in excluded]
    started = time.time()
    with staged_dir(output_dir) as stage, lazy_quantization(input_dir) as (graph_only, scratch):
        # Calibration first, with its augmented model beside the weights (onnxruntime would put it
        # in a system temporary folder, where the weights cannot be referenced); its ranges go to
        # a calibration cache that quantize_static then reads instead of calibrating again.
        cache = scratch / "calibration.json"
        calibrator = create_calibrator(
            graph_only,
            list(settings.op_types),
            augmented_model_path=str(scratch / "augmented.onnx"),
            calibrate_method=method,
            use_external_data_format=True,
            providers=["CPUExecutionProvider"],
            extra_options={"symmetric": settings.activation_symmetric},
        )
        calibrator.collect_data(reader)
        save_tensors_data(calibrator.compute_data(), cache)
        del calibrator
        gc.collect()
        quantize_static(
            graph_only,
            stage / MODEL_FILE,
            None,
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=list(settings.op_types),
            per_channel=settings.per_channel,
            activation_type=getattr(QuantType, settings.activation_type),
            weight_type=getattr(QuantType, settings.weight_type),
            calibrate_method=method,
            nodes_to_exclude=excluded,
            use_external_data_format=True,
            calibration_cache_path=str(cache),
            extra_options={
                "MatMulConstBOnly": settings.matmul_const_b_only,
                # Q/DQ only on the inputs of each quantized MatMul: its output, and the other
                # consumers of its input (residual Add, Shape), stay float. ORT then runs the
                # DQ -> MatMul pattern as an integer MatMul with float output.
                "OpTypesToExcludeOutputQuantization": ["MatMul"],
                "DedicatedQDQPair": True,
                "ActivationSymmetric": settings.activation_symmetric,
                "WeightSymmetric": True,
                "CalibTensorRangeSymmetric": settings.activation_symmetric,
            },
        )
        normalise_external_data(stage, search=[input_dir])
        copy_side_files(input_dir, stage)
        info = {
            "kind": "static",
            "format": "QDQ",
            "settings": asdict(settings),
            "calibration_text": str(calibration_text),
            "calibration_tokens": int(windows.size),
            "nodes_excluded": excluded,
            "seconds": round(time.time() - started, 1),
            "library_versions": library_versions(),
        }
        write_json(stage / "quantize.json", info)
    return info
