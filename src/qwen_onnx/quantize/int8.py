"""INT8 dynamic and static (QDQ or QOperator) quantization with onnxruntime.quantization, and calibration data.

Both take the pre-processed graph (ORT's recommended input,
https://onnxruntime.ai/docs/performance/model-optimizations/quantization.html) and write a
self-contained variant folder with one external data file.

- Dynamic: weights quantized offline (QInt8, per-channel or per-tensor), activations quantized at
  run time per batch (``quantize_dynamic``).
- Static: activation ranges from calibration on real text, streamed one window at a time
  (:mod:`qwen_onnx.quantize.activation_ranges`: MinMax, Entropy, Percentile or the output-error
  ``Search``), optionally after our SmoothQuant transform (:mod:`qwen_onnx.quantize.smoothquant`), then
  ``quantize_static`` from that calibration cache, in one of two formats (onnxruntime ``QuantFormat``): QDQ (QuantizeLinear /
  DequantizeLinear pairs around each quantized op, which ORT fuses into integer kernels when it
  loads the model; the default) or QOperator (the quantized ops written out: QLinearMatMul with
  INT8 weights, activations quantized by QuantizeLinear before it and its UINT8 output
  dequantized after it). Only MatMuls with a constant weight are quantized by default
  (``MatMulConstBOnly``), so the attention score and context products, normalisation and Softmax
  stay float.
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import onnx

from qwen_onnx.convert.export import normalise_external_data
from qwen_onnx.convert.genai_config import write_genai_config
from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.quantize.activation_ranges import (
    CALIBRATION_METHODS,
    StreamingCalibrator,
    tensors_data,
    weight_matmul_ranges,
)
from qwen_onnx.quantize.blockwise import blockwise_int8
from qwen_onnx.quantize.common import (
    SensitiveSettings,
    lazy_quantization,
    sensitive_nodes,
)
from qwen_onnx.quantize.embedding_graph import embedding_tied
from qwen_onnx.quantize.embeddings import EmbeddingPlan, quantize_embedding
from qwen_onnx.quantize.hadamard import DEFAULT_ROLES as HADAMARD_ROLES
from qwen_onnx.quantize.hadamard import rotate_graph
from qwen_onnx.quantize.kquant import carry_over_pass
from qwen_onnx.quantize.matmuls import (
    activation_matmuls,
    weight_matmul_names,
    weight_matmuls,
)
from qwen_onnx.quantize.outlier_split import split_graph
from qwen_onnx.quantize.smoothquant import smooth_graph
from qwen_onnx.quantize.source_grid import weight_origins
from qwen_onnx.source.text import load_token_encoder, token_windows
from qwen_onnx.store.artifacts import (
    MODEL_FILE,
    copy_side_files,
    model_path,
    write_json,
)
from qwen_onnx.store.hub_cache import reads_variant
from qwen_onnx.store.provenance import library_versions
from qwen_onnx.store.staging import staged_dir

log = logging.getLogger(__name__)

#: Op types never put in ``op_types_to_quantize`` (they stay float): normalisation and Softmax.
FLOAT_ONLY_OPS = frozenset(
    {"Softmax", "LayerNormalization", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization",
     "SkipLayerNormalization", "RMSNormalization", "ReduceMean", "Pow", "Sqrt", "Div"}
)
#: onnxruntime ``QuantFormat`` names of the static variant.
QUANT_FORMATS = ("QDQ", "QOperator")


@dataclass
class DynamicSettings(SensitiveSettings):
    """Settings of the dynamic INT8 variant (weights INT8 offline, activations quantized at run time).

    Attributes:
        scheme: ``per_tensor``: onnxruntime ``quantize_dynamic`` (DynamicQuantizeMatMul: one
            activation scale per tensor, computed at each call; QInt8 weights per channel or per
            tensor); ``blockwise``: every weight MatMul becomes MatMulNBits 8-bit with
            ``accuracy_level=4`` (INT8 weights with one scale per ``block_size`` inputs; the
            activation is quantized per token and block at each call).
        op_types: op types to quantize with ``per_tensor`` (default ``["MatMul"]``).
        per_channel: ``per_tensor`` scheme: one weight scale per output channel instead of one per tensor.
        reduce_range: ``per_tensor`` scheme: 7-bit weights, so that its U8S8 MatMulInteger never
            saturates the int16 pair sums of AVX2/AVX-512BW kernels (as ``StaticSettings.reduce_range``).
        nodes_to_exclude: node names kept float.
        sensitive_max_nodes: treat up to this many MatMuls apart, the most sensitive first (from
            the report of :func:`qwen_onnx.quantize.sensitivity.analyse_sensitivity`); 0: none.
        sensitive_below_sqnr_db: of those, only the ones whose simulated SQNR is under this (dB);
            None: all ``sensitive_max_nodes``.
        sensitive_max_fraction: at most this fraction of the report's weight MatMuls (rounded
            down), whatever ``sensitive_max_nodes`` says; None: no such cap.
        sensitive_scheme: what the sensitive MatMuls get: ``float`` (left unquantized) or
            ``blockwise`` (INT8 weights with one scale per ``block_size`` inputs, run as
            MatMulNBits 8-bit with ``accuracy_level=4``, which quantizes the activation per token
            and block at run time; onnxruntime contrib op MatMulNBits).
        block_size: block length of the ``blockwise`` scheme (a power of 2, 16 to 256; 64 by default, the
            accuracy of 32 at the speed of 128 on the embedded models, docs/int8.md), and of an own
            quantized embedding table.
        embedding: the embedding table: ``shared`` (tied models whose lm_head is MatMulNBits, at any
            ``block_size``: the embedding ``GatherBlockQuantized`` reads the lm_head's INT8 weight;
            otherwise as ``quantized``), ``quantized`` (its own ``GatherBlockQuantized`` table at
            ``embedding_bits``) or ``float`` (:mod:`qwen_onnx.quantize.embeddings`).
        embedding_bits: bits of an own quantized table (4 or 8).
        source_grid: ``blockwise`` scheme: a weight a GGUF source stored on an 8-bit grid (Q5_0, Q5_1, Q8_0 and
            Q5_K at block 32, Q6_K at block 16) is carried over exactly at that block instead of being rounded
            again at ``block_size`` (:mod:`qwen_onnx.quantize.source_grid`); no effect on float sources. Off by
            default: rounding at block 32 scored the same KL as the exact weights, and onnxruntime's 8-bit
            kernel at blocks of 32 and 16 decodes slower than at 64 (docs/int8.md).
    """
    block_size: int = 64
    scheme: str = "blockwise"
    op_types: list[str] = field(default_factory=lambda: ["MatMul"])
    per_channel: bool = True
    reduce_range: bool = True
    nodes_to_exclude: list[str] = field(default_factory=list)
    embedding: str = "shared"
    embedding_bits: int = 8
    source_grid: bool = False


@dataclass
class StaticSettings(SensitiveSettings):
    """Settings of ``quantize_static``.

    Attributes:
        quant_format: ``QDQ`` (QuantizeLinear/DequantizeLinear pairs that ORT fuses at load time;
            recommended by ORT for CPU since 1.11) or ``QOperator`` (QLinearMatMul written into the
            graph, its output quantized too); onnxruntime ``QuantFormat``.
        op_types: op types to quantize (normalisation and Softmax are refused).
        per_channel: per-channel weight scales.
        method: calibration method, one of ``MinMax``, ``Entropy``, ``Percentile`` (onnxruntime's)
            or ``Search`` (the clipping of the MinMax range with the lowest MatMul output error);
            all streamed one window at a time (:class:`qwen_onnx.quantize.activation_ranges.StreamingCalibrator`).
        samples: number of calibration windows of ``sequence_length`` tokens.
        sequence_length: tokens per calibration window.
        activation_type: ``QUInt8`` or ``QInt8`` (ORT recommends U8S8 on x86 CPUs).
        weight_type: ``QInt8`` or ``QUInt8``.
        reduce_range: 7-bit weights (QInt8 in [-64, 64]; onnxruntime's ``reduce_range``): with u8
            activations no pair of products in MLAS's ``VPMADDUBSW`` kernels (AVX2, AVX-512BW
            without VNNI) reaches the int16 limit (2 x 255 x 64 = 32,640 < 32,767), so the graph
            computes the same on every x86 CPU (onnxruntime's quantization docs and OpenVINO's
            "Saturation (overflow) issue workaround" recommend it for CPUs without VNNI).
        activation_symmetric: symmetric activation ranges.
        smooth: SmoothQuant scale migration before calibration (:mod:`qwen_onnx.quantize.smoothquant`).
        smooth_alphas: migration strengths α searched per MatMul group.
        search_tokens: activation rows kept per tensor for the α and ``Search`` scoring.
        matmul_const_b_only: quantize only MatMuls whose second input is a constant weight.
        nodes_to_exclude: node names kept float.
        sensitive_max_nodes, sensitive_below_sqnr_db, sensitive_scheme, block_size: the most
            sensitive MatMuls and what they get, as in :class:`DynamicSettings`.
        sensitive_rank: the sensitivity report's ranking they are taken from: ``static`` (SQNR
            with the MinMax range, over the whole tensor) or ``static_percentile`` (per-token SQNR
            with the Percentile range; :mod:`qwen_onnx.quantize.sensitivity`).
        embedding, embedding_bits: the embedding table, as in :class:`DynamicSettings`.
        outlier_channels: per MatMul of ``outlier_roles``, this many input channels (the largest
            calibration magnitudes) computed apart in float, so that the static activation range
            spans the others (:mod:`qwen_onnx.quantize.outlier_split`); 0: no split.
        outlier_roles: the MatMul roles split (``down_proj``: the SwiGLU product's massive activations).
        hadamard_roles: the MatMul roles whose input is rotated by a block Hadamard matrix online
            (the inverse folded into the weight) before calibration, so that one static scale spans
            the massive activations with finer steps (:mod:`qwen_onnx.quantize.hadamard`; QuaRot); default every
            role; empty: none.
    """
    quant_format: str = "QDQ"
    op_types: list[str] = field(default_factory=lambda: ["MatMul"])
    per_channel: bool = True
    method: str = "Percentile"
    samples: int = 72
    sequence_length: int = 128
    activation_type: str = "QUInt8"
    weight_type: str = "QInt8"
    reduce_range: bool = True
    activation_symmetric: bool = False
    smooth: bool = False
    smooth_alphas: list[float] = field(default_factory=lambda: [0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
    search_tokens: int = 512
    matmul_const_b_only: bool = True
    nodes_to_exclude: list[str] = field(default_factory=list)
    embedding: str = "shared"
    embedding_bits: int = 8
    sensitive_rank: str = "static"
    outlier_channels: int = 0
    outlier_roles: list[str] = field(default_factory=lambda: ["down_proj"])
    hadamard_roles: list[str] = field(default_factory=lambda: list(HADAMARD_ROLES))


DYNAMIC_SCHEMES = ("per_tensor", "blockwise")


def _check_op_types(op_types: Sequence[str]) -> None:
    bad = sorted(set(op_types) & FLOAT_ONLY_OPS)
    if bad:
        raise QwenOnnxError(
            f"op types {', '.join(bad)} must stay float (normalisation and Softmax lose too much in INT8); "
            "remove them from op_types"
        )


def _node_names(path: Path) -> set[str]:
    return {n.name for n in onnx.load(str(path), load_external_data=False).graph.node}


def _check_excluded(path: Path, names: Sequence[str]) -> None:
    unknown = sorted(set(names) - _node_names(path))
    if unknown:
        raise QwenOnnxError(
            f"nodes_to_exclude names {len(unknown)} node(s) not in {path}: {', '.join(unknown[:5])}; "
            "use `qwen-onnx inspect` to list node names of the pre-processed graph"
        )


@reads_variant("input_dir")
def quantize_dynamic_variant(
    input_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    settings: DynamicSettings,
    sensitivity: str | os.PathLike | Mapping[str, Any] | None = None,
) -> dict:
    """Dynamic INT8 quantization of the pre-processed variant at ``input_dir``.

    Args:
        sensitivity: the sensitivity report (JSON path or dict) of ``input_dir``, needed when
            ``settings.sensitive_max_nodes`` is set.

    Returns:
        Provenance written to ``output_dir/quantize.json``, with the sensitive nodes and their scheme.

    Raises:
        QwenOnnxError: a float-only op type is requested, an excluded node does not exist, or
            sensitive nodes are asked for without a sensitivity report.
        ArtifactError: the input model or its external data is missing.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    input_dir = Path(input_dir).resolve()
    source = model_path(input_dir)
    _check_op_types(settings.op_types)
    sensitive = sensitive_nodes(settings, "dynamic", sensitivity)
    names = [n["name"] for n in sensitive]
    excluded = list(dict.fromkeys([*settings.nodes_to_exclude, *names]))
    _check_excluded(source, excluded)
    if settings.scheme not in DYNAMIC_SCHEMES:
        raise QwenOnnxError(f"dynamic scheme {settings.scheme!r} unknown; use one of {', '.join(DYNAMIC_SCHEMES)}")
    plan = _embedding_plan(settings, input_dir)
    started = time.time()
    origin = None
    with staged_dir(output_dir) as stage, lazy_quantization(input_dir) as (graph_only, scratch):
        if settings.scheme == "blockwise":
            float_names = set(settings.nodes_to_exclude) | (set(names) if settings.sensitive_scheme == "float" else set())
            weights = weight_matmul_names(graph_only)
            blockwise = [n for n in weights if n not in float_names]
            found: dict[str, tuple[int, int] | None] = {}
            if settings.source_grid:
                graph_only, found = carry_over_pass(graph_only, blockwise, 8, scratch)
            carried = {n: f"8/{o[1]}" for n, o in found.items() if o is not None and o[0] == 8}
            rounded = [n for n in blockwise if n not in carried]
            if rounded:
                graph_only = blockwise_int8(graph_only, rounded, settings.block_size, scratch)
            shutil.copyfile(graph_only, stage / MODEL_FILE)
            if settings.source_grid:
                sizes = {node.name: int(np.prod(t.dims)) for node, t in weight_matmuls(
                    onnx.load(str(source), load_external_data=False).graph)}
                built = {n: "float" if n in float_names else carried.get(n, f"8/{settings.block_size}") for n in weights}
                origin = weight_origins(built, found, sizes)
        else:
            if settings.sensitive_scheme == "blockwise" and names:
                graph_only = blockwise_int8(graph_only, names, settings.block_size, scratch)
            quantize_dynamic(
                graph_only,
                stage / MODEL_FILE,
                op_types_to_quantize=list(settings.op_types),
                per_channel=settings.per_channel,
                reduce_range=settings.reduce_range,
                weight_type=QuantType.QInt8,
                nodes_to_exclude=excluded,
                use_external_data_format=True,
                extra_options={"MatMulConstBOnly": True},
            )
        normalise_external_data(stage, search=[input_dir])
        embedding = quantize_embedding(stage, plan)
        copy_side_files(input_dir, stage)
        write_genai_config(stage)  # onnxruntime-genai runs the folder
        info = {
            "kind": "dynamic",
            "gate_kind": "int8_dynamic",
            "embedding": embedding,
            "settings": asdict(settings),
            "nodes_excluded": excluded,
            "sensitive_nodes": sensitive,
            "sensitive_scheme": settings.sensitive_scheme,
            **({"weight_origin": origin} if origin is not None else {}),
            "seconds": round(time.time() - started, 1),
            "library_versions": library_versions(),
        }
        write_json(stage / "quantize.json", info)
    return info


def _embedding_plan(settings: DynamicSettings | StaticSettings, input_dir: Path) -> EmbeddingPlan:
    """The embedding plan of an INT8 variant (checked; tied-ness read from ``input_dir`` only when sharing)."""
    plan = EmbeddingPlan(settings.embedding, settings.embedding_bits, settings.block_size)
    plan.check()
    if plan.mode == "shared":
        plan = EmbeddingPlan(plan.mode, plan.bits, plan.block_size, embedding_tied(input_dir))
    return plan


def _static_extra_options(settings: StaticSettings) -> dict[str, Any]:
    """``quantize_static`` extra options for ``settings.quant_format``.

    Options read by both quantizers (``base_quantizer`` / ``onnx_quantizer`` in onnxruntime 1.32):
    ``MatMulConstBOnly``, ``ActivationSymmetric``, ``WeightSymmetric``; ``CalibTensorRangeSymmetric``
    is a calibration option (read where the ranges are computed). The QDQ quantizer alone reads
    ``OpTypesToExcludeOutputQuantization`` and ``DedicatedQDQPair`` (``qdq_quantizer``), so
    QOperator does not get them: its QLinearMatMul always has a quantized output.
    """
    options: dict[str, Any] = {
        "MatMulConstBOnly": settings.matmul_const_b_only,
        "ActivationSymmetric": settings.activation_symmetric,
        "WeightSymmetric": True,
        "CalibTensorRangeSymmetric": settings.activation_symmetric,
    }
    if settings.quant_format == "QDQ":
        options.update({
            # Q/DQ only on the inputs of each quantized MatMul: its output, and the other
            # consumers of its input (residual Add, Shape), stay float. ORT then runs the
            # DQ -> MatMul pattern as an integer MatMul with float output.
            "OpTypesToExcludeOutputQuantization": ["MatMul"],
            "DedicatedQDQPair": True,
        })
    return options


@reads_variant("input_dir")
def quantize_static_variant(
    input_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    calibration_text: str | os.PathLike,
    settings: StaticSettings,
    sensitivity: str | os.PathLike | Mapping[str, Any] | None = None,
) -> dict:
    """Static INT8 quantization (QDQ or QOperator) of the pre-processed variant, calibrated on ``calibration_text``.

    Args:
        sensitivity: the sensitivity report (JSON path or dict) of ``input_dir``, needed when
            ``settings.sensitive_max_nodes`` is set.

    Returns:
        Provenance written to ``output_dir/quantize.json``, including the calibration token count
        and the sensitive nodes with their scheme.

    Raises:
        QwenOnnxError: an unknown calibration method or format, a float-only op type, the type
            pairing QInt8 activations / QUInt8 weights, ``matmul_const_b_only`` false, an excluded
            node that does not exist, a calibration text too short for the requested samples, or sensitive
            nodes asked for without a sensitivity report.
    """
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.calibrate import save_tensors_data

    if settings.method not in CALIBRATION_METHODS:
        raise QwenOnnxError(f"calibration method {settings.method!r} unknown; use one of {', '.join(CALIBRATION_METHODS)}")
    if settings.quant_format not in QUANT_FORMATS:
        raise QwenOnnxError(
            f"quantization format {settings.quant_format!r} unknown; use one of {', '.join(QUANT_FORMATS)}"
        )
    _check_op_types(settings.op_types)
    if (settings.activation_type, settings.weight_type) == ("QInt8", "QUInt8"):
        raise QwenOnnxError("activation_type QInt8 with weight_type QUInt8 is a pairing onnxruntime does not quantize; "
                            "use QUInt8/QInt8 (the default), QInt8/QInt8 or QUInt8/QUInt8")
    if not settings.matmul_const_b_only:
        raise QwenOnnxError("matmul_const_b_only false would quantize the MatMuls of two activations (attention, "
                            "rotary), whose ranges the streamed calibration does not measure; keep it true")
    input_dir = Path(input_dir).resolve()
    source = model_path(input_dir)
    sensitive = sensitive_nodes(settings, "static", sensitivity)
    names = [n["name"] for n in sensitive]
    excluded = list(dict.fromkeys([*settings.nodes_to_exclude, *names]))
    _check_excluded(source, excluded)
    tokenizer = load_token_encoder(input_dir)
    windows = token_windows(tokenizer, calibration_text, settings.sequence_length, settings.samples)
    if any(not 0 < a < 1 for a in settings.smooth_alphas) or (settings.smooth and not settings.smooth_alphas):
        raise QwenOnnxError(f"smooth_alphas {settings.smooth_alphas} must be numbers between 0 and 1 (exclusive)")
    if settings.matmul_const_b_only:
        excluded += [name for name in activation_matmuls(source) if name not in excluded]
    model_weight_matmuls = set(weight_matmul_names(source))
    plan = _embedding_plan(settings, input_dir)
    started = time.time()
    with staged_dir(output_dir) as stage, lazy_quantization(input_dir) as (graph_only, scratch):
        smoothing: list[dict] = []
        if settings.smooth:
            graph_only, smoothing = smooth_graph(
                graph_only, windows, scratch, alphas=settings.smooth_alphas, search_tokens=settings.search_tokens,
                symmetric=settings.activation_symmetric,
            )
        split: list[dict] = []
        split_float: list[str] = []
        if settings.outlier_channels:
            graph_only, split_float, split = split_graph(
                graph_only, windows, scratch, channels=settings.outlier_channels, roles=settings.outlier_roles,
                skip=set(excluded))
            excluded += split_float
        rotation: list[dict] = []
        rotation_matmuls: list[str] = []
        if settings.hadamard_roles:
            graph_only, rotation_matmuls, rotation = rotate_graph(
                graph_only, scratch, roles=settings.hadamard_roles, skip=set(excluded))
            excluded += rotation_matmuls
        # Calibration first, one window at a time (onnxruntime's calibrators hold every window's
        # outputs); its ranges go to a calibration cache that quantize_static reads instead of
        # calibrating again.
        cache = scratch / "calibration.json"
        ranges = weight_matmul_ranges(graph_only, windows, StreamingCalibrator(
            settings.method, symmetric=settings.activation_symmetric, search_tokens=settings.search_tokens),
            set(excluded), scratch, outputs=settings.quant_format == "QOperator")
        save_tensors_data(tensors_data(ranges), cache)
        gc.collect()
        if settings.sensitive_scheme == "blockwise" and names:
            graph_only = blockwise_int8(graph_only, names, settings.block_size, scratch)
        quantize_static(
            graph_only,
            stage / MODEL_FILE,
            None,
            quant_format=getattr(QuantFormat, settings.quant_format),
            op_types_to_quantize=list(settings.op_types),
            per_channel=settings.per_channel,
            activation_type=getattr(QuantType, settings.activation_type),
            weight_type=getattr(QuantType, settings.weight_type),
            reduce_range=settings.reduce_range,
            # the cache holds final ranges whatever the method (qwen_onnx.quantize.activation_ranges.tensors_data)
            calibrate_method=CalibrationMethod.MinMax,
            nodes_to_exclude=excluded,
            use_external_data_format=True,
            calibration_cache_path=str(cache),
            extra_options=_static_extra_options(settings),
        )
        normalise_external_data(stage, search=[input_dir])
        embedding = quantize_embedding(stage, plan)
        copy_side_files(input_dir, stage)
        write_genai_config(stage)  # onnxruntime-genai runs the folder
        info = {
            "kind": "static",
            # blockwise sensitive MatMuls (quantize_mixed) run activations quantized at run time: the mixed gate
            "gate_kind": "int8_mixed" if settings.sensitive_scheme == "blockwise" else "int8_static",
            "embedding": embedding,
            "format": settings.quant_format,
            "settings": asdict(settings),
            "calibration_text": str(calibration_text),
            "calibration_tokens": int(windows.size),
            "calibrated_tensors": len(ranges),
            "smoothing": smoothing,
            "outlier_split": split,
            "hadamard_rotation": rotation,
            # the model's own weight MatMuls left float (not the attention products, the rotations or
            # the split's k-channel products)
            "float_weight_matmuls": [n for n in excluded if n in model_weight_matmuls],
            "rotation_matmuls": rotation_matmuls,
            "nodes_excluded": excluded,
            "sensitive_nodes": sensitive,
            "sensitive_scheme": settings.sensitive_scheme,
            "seconds": round(time.time() - started, 1),
            "library_versions": library_versions(),
        }
        write_json(stage / "quantize.json", info)
    return info
