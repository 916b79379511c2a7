"""What the INT8 and int4 quantizers share: the sensitive-MatMul settings and their choice from the sensitivity
report, and a graph opened for quantization with its weights left on disk.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterator, Mapping

import onnx

from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.quantize.matmuls import check_roles, weight_matmuls
from qwen_onnx.quantize.sensitivity import choose_float_nodes
from qwen_onnx.settings.options import check_option
from qwen_onnx.store.artifacts import read_json
from qwen_onnx.store.external import ScratchFiles, lazy_model

log = logging.getLogger(__name__)


@dataclass
class SensitiveSettings:
    """The fields both variants share: the most sensitive MatMuls and what they get (documented in
    :class:`DynamicSettings`), and reading a config section."""

    sensitive_max_nodes: int = 0
    sensitive_below_sqnr_db: float | None = None
    sensitive_scheme: str = "float"
    block_size: int = 128
    sensitive_max_fraction: float | None = None

    def __post_init__(self) -> None:
        """Numbers checked on construction (:class:`qwen_onnx.errors.OptionError` names the range)."""

        check_option("max_nodes", self.sensitive_max_nodes, key="sensitive_max_nodes")
        check_option("block_size", self.block_size)
        for name in ("samples", "sequence_length", "search_tokens", "outlier_channels"):
            if hasattr(self, name):
                check_option(name, getattr(self, name))
        fraction = self.sensitive_max_fraction
        if fraction is not None and not (isinstance(fraction, (int, float)) and 0 <= fraction <= 1):
            raise QwenOnnxError(f"sensitive max_fraction {fraction!r} is out of range; give a number from 0 to 1")
        for key in ("outlier_roles", "hadamard_roles"):
            check_roles(key, getattr(self, key, []))
        rank = getattr(self, "sensitive_rank", "static")
        if rank not in STATIC_RANKS:
            raise QwenOnnxError(f"sensitive rank {rank!r} unknown; use one of {', '.join(STATIC_RANKS)}")

    @classmethod
    def from_config(cls, section: Mapping[str, Any]):
        """From a config section, whose ``sensitive: {max_nodes, below_sqnr_db, scheme, max_fraction,
        rank}`` is nested (``calibration_text`` is left out; it is a rule input).

        Raises:
            QwenOnnxError: a key this variant has no setting for (``sensitive.rank`` outside a static
                section, a misspelt key), named with the fix.
        """
        values = {k: v for k, v in _flatten_sensitive(section).items() if k != "calibration_text"}
        known = {f.name for f in fields(cls)}
        for key in values:
            if key not in known:
                shown = "sensitive." + key.removeprefix("sensitive_") if key.startswith("sensitive_") else key
                hint = " (rankings are for the static variants: quantize_static, quantize_mixed)" if key == "sensitive_rank" else ""
                raise QwenOnnxError(f"{cls.__name__} has no setting {shown!r}{hint}; remove it from the config section")
        return cls(**values)


SENSITIVE_SCHEMES = ("float", "blockwise")

#: The sensitivity rankings a static variant's sensitive MatMuls can be taken from.
STATIC_RANKS = ("static", "static_percentile")


def _flatten_sensitive(section: Mapping[str, Any]) -> dict[str, Any]:
    values = dict(section)
    sensitive = values.pop("sensitive", None) or {}
    values["sensitive_max_nodes"] = int(sensitive.get("max_nodes", 0))
    values["sensitive_below_sqnr_db"] = sensitive.get("below_sqnr_db")
    values["sensitive_scheme"] = sensitive.get("scheme", "float")
    if "rank" in sensitive:
        values["sensitive_rank"] = sensitive["rank"]
    if sensitive.get("max_fraction") is not None:
        values["sensitive_max_fraction"] = sensitive["max_fraction"]
    return values


def sensitive_nodes(
    settings: SensitiveSettings,
    kind: str,
    sensitivity: str | os.PathLike | Mapping[str, Any] | None,
) -> list[dict[str, Any]]:
    """The sensitivity-chosen MatMuls to treat apart, each ``{name, role, layer, sqnr_db}``.

    Raises:
        QwenOnnxError: ``sensitive_max_nodes`` is set but no sensitivity report is given, or the
            scheme or block size is unknown.
    """
    if settings.sensitive_scheme not in SENSITIVE_SCHEMES:
        raise QwenOnnxError(
            f"sensitive scheme {settings.sensitive_scheme!r} unknown; use one of {', '.join(SENSITIVE_SCHEMES)}"
        )
    if settings.sensitive_max_nodes <= 0:
        return []
    if sensitivity is None:
        raise QwenOnnxError(
            "sensitive.max_nodes needs the sensitivity report of the pre-processed model: run "
            "`qwen-onnx sensitivity PREPROCESSED -o sensitivity.json` and pass it with --sensitivity "
            "(the workflow's sensitivity rule does this)"
        )
    report = read_json(sensitivity) if isinstance(sensitivity, (str, os.PathLike)) else sensitivity
    rows = {r["name"]: r for r in report["nodes"]}
    kind = getattr(settings, "sensitive_rank", kind)
    if kind != "dynamic" and f"rank_{kind}" not in report:
        raise QwenOnnxError(
            f"the sensitivity report has no {kind} ranking (written by an older qwen-onnx); "
            "rerun `qwen-onnx sensitivity` (the workflow's sensitivity rule) to write it"
        )
    budget = settings.sensitive_max_nodes
    if settings.sensitive_max_fraction is not None:
        budget = min(budget, int(settings.sensitive_max_fraction * len(report["nodes"]) + 1e-9))
    names = choose_float_nodes(report, kind, budget, settings.sensitive_below_sqnr_db)
    return [
        {"name": n, "role": rows[n]["role"], "layer": rows[n]["layer"], "sqnr_db": rows[n][f"sqnr_{kind}_db"],
         "ranked_by": f"sqnr_{kind}_db"}
        for n in names
    ]


def _load_graph_with_shape_infer(model_path: Path) -> onnx.ModelProto:
    """onnxruntime's ``load_model_with_shape_infer`` without loading weight data.

    Weights stay external references, read one at a time by ``numpy_helper.to_array`` from the
    working directory (see :func:`qwen_onnx.store.external.lazy_model`).
    """
    from onnxruntime.quantization.quant_utils import (
        add_infer_metadata,
        generate_identified_filename,
    )

    inferred = generate_identified_filename(Path(model_path), "-inferred")
    onnx.shape_inference.infer_shapes_path(str(model_path), str(inferred))
    model = onnx.load(str(inferred), load_external_data=False)
    add_infer_metadata(model)
    inferred.unlink()
    return model


def with_value_types(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with the element type of every tensor recorded in ``value_info``.

    onnxruntime's quantizers read tensor types from ``onnx.shape_inference``, which knows no
    ``com.microsoft`` op: on the optimized graph the outputs of ``SimplifiedLayerNormalization``,
    ``SkipSimplifiedLayerNormalization`` and the like get no type, and the quantizer then skips
    quantizing them ("failed to infer the type of tensor ... Skip to quantize it"), leaving q/k/v,
    gate/up and lm_head as float MatMuls on dequantized weights. onnxruntime's symbolic shape
    inference (``onnxruntime.tools.symbolic_shape_infer``, as ``quant_pre_process`` runs it) knows
    the contrib ops; it reads only the graph and the small shape constants.

    Raises:
        QwenOnnxError: a tensor that a weight MatMul reads still has no type after inference.
    """
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    try:
        inferred = SymbolicShapeInference.infer_shapes(proto, auto_merge=True, guess_output_rank=True)
    except Exception as error:  # an op it does not know: onnxruntime's own inference, as before
        log.warning("symbolic shape inference failed (%s); the quantizer infers types itself", error)
        return proto
    typed = {v.name for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
             if v.type.tensor_type.elem_type}
    typed |= {t.name for t in inferred.graph.initializer}
    missing = sorted({node.input[0] for node, _ in weight_matmuls(inferred.graph)} - typed)
    if missing:
        raise QwenOnnxError(
            f"shape inference left {len(missing)} weight MatMul input(s) without a type ({', '.join(missing[:3])}); "
            "quantize the pre-processed variant instead (optimize.quantize_fused: false)"
        )
    return inferred


@contextlib.contextmanager
def lazy_quantization(input_dir: str | os.PathLike) -> Iterator[tuple[Path, ScratchFiles]]:
    """Run onnxruntime's quantizers on ``input_dir`` without holding all weights in memory.

    Yields the path of a graph-only copy of the model beside its weights, and the
    :class:`~qwen_onnx.store.external.ScratchFiles` namer for other temporary files there (see
    :func:`qwen_onnx.store.external.lazy_model`). While inside, onnxruntime.quantization loads models
    without their data; each weight is read when the quantizer needs it. Quantized weights are new
    tensors; the float weights it leaves untouched (embeddings, norms) stay references to
    ``input_dir/model.onnx_data``, which :func:`qwen_onnx.convert.export.normalise_external_data` copies
    into the output (``search=[input_dir]``).
    """
    import importlib

    modules = tuple(
        importlib.import_module(f"onnxruntime.quantization.{name}") for name in ("quant_utils", "quantize", "calibrate")
    )
    saved = [m.load_model_with_shape_infer for m in modules]
    with lazy_model(input_dir) as (proto, scratch):
        graph_only = scratch / "input.onnx"
        onnx.save_model(with_value_types(proto), str(graph_only))
        del proto
        for module in modules:
            module.load_model_with_shape_infer = _load_graph_with_shape_infer
        try:
            yield graph_only, scratch
        finally:
            for module, original in zip(modules, saved):
                module.load_model_with_shape_infer = original
