"""Graph inspection that reads ``model.onnx`` without loading weight data (works past 2 GiB).

Initializer sizes come from their dims and dtype, so a 6 GB external data file is never read.
"""

from __future__ import annotations

import collections
import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

from .artifacts import DATA_FILE, check_external_data, folder_bytes
from .errors import ArtifactError

#: Op types inserted by quantization (QDQ and QOperator forms).
QUANT_OPS = frozenset(
    {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "DynamicQuantizeMatMul",
     "QLinearMatMul", "MatMulIntegerToFloat", "QGemm", "MatMulNBits", "QAttention"}
)


def _dim(d: onnx.TensorShapeProto.Dimension) -> int | str:
    if d.HasField("dim_value"):
        return int(d.dim_value)
    return d.dim_param or "?"


def _value_info(v: onnx.ValueInfoProto) -> dict[str, Any]:
    tensor = v.type.tensor_type
    return {
        "name": v.name,
        "dtype": helper.tensor_dtype_to_np_dtype(tensor.elem_type).name if tensor.elem_type else "unknown",
        "shape": [_dim(d) for d in tensor.shape.dim],
    }


def initializer_bytes(tensor: onnx.TensorProto) -> int:
    """Bytes of an initializer's data computed from dims and dtype (data is not read)."""
    count = int(np.prod(tensor.dims)) if len(tensor.dims) else 1
    if tensor.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
        return (count + 1) // 2
    if tensor.data_type == onnx.TensorProto.STRING:
        return sum(len(s) for s in tensor.string_data)
    return count * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


def load_graph(path: str | os.PathLike) -> onnx.ModelProto:
    """Load an ONNX graph without its weights.

    Raises:
        ArtifactError: the file is missing, is not ONNX, or its external data file is missing.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "model.onnx"
    if not path.is_file():
        raise ArtifactError(f"no ONNX file at {path}")
    check_external_data(path)
    return onnx.load(str(path), load_external_data=False)


def inspect_model(path: str | os.PathLike) -> dict[str, Any]:
    """Summary of an ONNX model file.

    Returns:
        ``ir_version``, ``opsets`` (domain → version), ``inputs``/``outputs`` (name, dtype name,
        dims with symbolic names kept), ``nodes``, ``op_types`` (histogram, most common first),
        ``quant_ops`` (histogram of quantization ops), ``initializers`` (count, bytes per dtype),
        ``bytes_on_disk`` (graph plus external data).

    Raises:
        ArtifactError: see :func:`load_graph`.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "model.onnx"
    proto = load_graph(path)
    graph = proto.graph
    ops = collections.Counter(n.op_type for n in graph.node)
    per_dtype: dict[str, int] = collections.Counter()
    for tensor in graph.initializer:
        per_dtype[helper.tensor_dtype_to_np_dtype(tensor.data_type).name] += initializer_bytes(tensor)
    return {
        "path": str(path),
        "ir_version": proto.ir_version,
        "opsets": {(o.domain or "ai.onnx"): o.version for o in proto.opset_import},
        "inputs": [_value_info(v) for v in graph.input],
        "outputs": [_value_info(v) for v in graph.output],
        "nodes": len(graph.node),
        "op_types": dict(ops.most_common()),
        "quant_ops": {k: v for k, v in ops.most_common() if k in QUANT_OPS},
        "initializers": {
            "count": len(graph.initializer),
            "bytes": int(sum(per_dtype.values())),
            "bytes_per_dtype": dict(per_dtype),
        },
        "bytes_on_disk": folder_bytes(path.parent, (path.name, DATA_FILE)),
    }


def to_markdown(info: dict[str, Any], top: int = 15) -> str:
    """A short Markdown rendering of :func:`inspect_model`'s result."""
    lines = [
        f"# {info['path']}",
        "",
        f"- IR version {info['ir_version']}, opsets {info['opsets']}",
        f"- {info['nodes']} nodes, {info['initializers']['count']} initializers, "
        f"{info['bytes_on_disk'] / 1e6:.1f} MB on disk",
        f"- initializer bytes per dtype: {info['initializers']['bytes_per_dtype']}",
        "",
        "| input | dtype | shape |",
        "|---|---|---|",
    ]
    lines += [f"| {v['name']} | {v['dtype']} | {v['shape']} |" for v in info["inputs"][:6]]
    if len(info["inputs"]) > 6:
        lines.append(f"| … {len(info['inputs']) - 6} more | | |")
    lines += ["", "| op type | count |", "|---|---|"]
    lines += [f"| {op} | {n} |" for op, n in list(info["op_types"].items())[:top]]
    return "\n".join(lines) + "\n"


def decode_weight_bytes(proto: onnx.ModelProto) -> int:
    """Bytes of weights read to decode one token: every initializer, an embedding table as one row.

    A ``Gather`` on an initializer (the token embedding) reads one row per token, so it counts
    ``bytes / rows``; every other initializer (projections, lm_head, norms, quantization scales) is
    read whole at each decode step. This is the numerator of the decode roofline:
    ``tokens/s <= memory bandwidth / weight bytes per token``.
    """
    sizes = {t.name: (initializer_bytes(t), list(t.dims)) for t in proto.graph.initializer}
    gathered = {n.input[0] for n in proto.graph.node if n.op_type == "Gather" and n.input and n.input[0] in sizes}
    total = 0
    for name, (size, dims) in sizes.items():
        if name in gathered and dims and dims[0] > 0:
            total += size // dims[0]
        else:
            total += size
    return int(total)
