"""Static outlier-channel split of a weight MatMul's input, before static INT8 calibration.

``Y = X W`` becomes ``Y = (X * m) W' + X[..., S] W[S, :]``: the few input channels ``S`` with the
largest calibration magnitude (Qwen's massive activations, Sun et al. 2024, "Massive Activations
in Large Language Models", arXiv:2402.17762, sit in a handful of fixed channels of the SwiGLU
product that feeds ``down_proj``) are zeroed by the mask ``m`` in front of the quantized MatMul,
whose weight rows ``S`` are zeroed too (``W'``), and computed apart in float by a ``k``-channel
MatMul read through ``Gather``. The static per-tensor activation range then spans the other
channels only. It is the mixed-precision decomposition of LLM.int8() (Dettmers et al. 2022,
arXiv:2208.07339, section 3.2) with the outlier channels fixed offline from calibration instead of
found per batch at run time, so every activation scale stays static.

The float graph's logits do not change (the two products add up to ``X W`` exactly; tested to
1e-4).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.quantize.calibration import TextCalibrationReader, capture_session
from qwen_onnx.quantize.matmuls import graph_maps, node_role, weight_matmuls
from qwen_onnx.store.external import DataWriter

log = logging.getLogger(__name__)

#: The MatMul roles split by default: down_proj reads the SwiGLU product, where the massive
#: activations are (docs/int8.md, "int8-static").
DEFAULT_ROLES = ("down_proj",)
_SUFFIX = "/outlier_split"


@dataclass
class SplitTarget:
    """One weight MatMul to split: ``node`` reads ``activation`` float32 [batch, sequence,
    in_features] and ``weight`` float32 [in_features, out_features]."""

    node: str
    activation: str
    weight: str
    in_features: int
    layer: int | None
    role: str


def split_targets(graph: onnx.GraphProto, roles: Sequence[str] = DEFAULT_ROLES) -> list[SplitTarget]:
    """The weight MatMuls whose role (:func:`qwen_onnx.quantize.matmuls.node_role`) is one of ``roles``, and
    whose weight no other node reads."""
    _, _, consumers = graph_maps(graph)
    targets = []
    for node, weight in weight_matmuls(graph):
        layer, role = node_role(node.name)
        if role not in roles or len(consumers.get(weight.name, [])) != 1:
            continue
        targets.append(SplitTarget(node.name, node.input[0], weight.name, int(weight.dims[0]), layer, role))
    return targets


def outlier_channels(absmax: np.ndarray, count: int) -> np.ndarray:
    """The ``count`` channels with the largest calibration magnitude, int64 [count], ascending.

    Args:
        absmax: per input channel, max |x| over the calibration tokens, float32 [in_features].
        count: channels to take; at most ``in_features``.
    """
    count = min(int(count), absmax.shape[0])
    return np.sort(np.argsort(-absmax, kind="stable")[:count]).astype(np.int64)


def channel_absmax(graph_only: Path, windows: np.ndarray, activations: Sequence[str], scratch,
                   threads: int | None = None) -> dict[str, np.ndarray]:
    """Per input channel max |x| float32 [in_features] of each of ``activations``, streamed over
    ``windows`` (int64 [samples, sequence], one prefill each)."""

    proto = onnx.load(str(graph_only), load_external_data=False)
    session = capture_session(proto, list(activations), scratch / "split-capture.onnx", threads)
    del proto
    reader = TextCalibrationReader(graph_only, windows)
    absmax: dict[str, np.ndarray] = {}
    for window in windows:
        for name, value in zip(activations, session.run(list(activations), reader.feeds(window))):
            a = np.abs(np.asarray(value, dtype=np.float32)).reshape(-1, value.shape[-1]).max(axis=0)
            absmax[name] = a if name not in absmax else np.maximum(absmax[name], a)
    return absmax


def apply_split(proto: onnx.ModelProto, targets: Sequence[SplitTarget], channels: dict[str, np.ndarray],
                data_path: Path) -> list[str]:
    """Split each target MatMul of ``proto`` in place on its ``channels[node]`` (int64 [k]).

    New weights (``W'`` and ``W[S, :]``) are written to ``data_path`` beside the graph to be saved;
    the original weight is read with ``numpy_helper.to_array`` (external data relative to the
    working directory, as inside :func:`qwen_onnx.store.external.lazy_model`).

    Returns:
        The names of the float ``k``-channel MatMuls added (to keep out of quantization).

    Raises:
        QwenOnnxError: a channel index outside the MatMul's input features.
    """
    graph = proto.graph
    initializers = {t.name: t for t in graph.initializer}
    writer = DataWriter(data_path)
    added: list[str] = []
    position = {node.name: i for i, node in enumerate(graph.node)}
    inserts: dict[str, tuple[list[onnx.NodeProto], list[onnx.NodeProto]]] = {}
    try:
        for target in targets:
            picked = np.asarray(channels[target.node], dtype=np.int64)
            if picked.size == 0:
                continue
            if picked.min() < 0 or picked.max() >= target.in_features:
                raise QwenOnnxError(
                    f"outlier channels of {target.node!r} must lie in [0, {target.in_features}); got {picked.tolist()}")
            node = graph.node[position[target.node]]
            prefix = target.node + _SUFFIX
            w = numpy_helper.to_array(initializers[target.weight]).astype(np.float32)
            outlier_w = onnx.TensorProto()
            outlier_w.name, outlier_w.data_type = f"{prefix}/weight", onnx.TensorProto.FLOAT
            outlier_w.dims.extend([int(picked.size), int(w.shape[1])])
            writer.set(outlier_w, w[picked])
            w[picked] = 0.0
            writer.set(initializers[target.weight], w)
            del w
            mask = np.ones(target.in_features, dtype=np.float32)
            mask[picked] = 0.0
            graph.initializer.extend([outlier_w, numpy_helper.from_array(mask, f"{prefix}/mask"),
                                      numpy_helper.from_array(picked, f"{prefix}/channels")])
            masked, gathered, main_out, side_out = (f"{prefix}/{n}" for n in ("masked", "gathered", "main", "outliers"))
            output = node.output[0]
            before = [
                helper.make_node("Mul", [target.activation, f"{prefix}/mask"], [masked], name=f"{prefix}/Mul"),
                helper.make_node("Gather", [target.activation, f"{prefix}/channels"], [gathered], axis=-1,
                                 name=f"{prefix}/Gather"),
            ]
            node.input[0], node.output[0] = masked, main_out
            side = f"{prefix}/MatMul"
            after = [
                helper.make_node("MatMul", [gathered, outlier_w.name], [side_out], name=side),
                helper.make_node("Add", [main_out, side_out], [output], name=f"{prefix}/Add"),
            ]
            inserts[target.node] = (before, after)
            added.append(side)
    finally:
        writer.close()
    nodes = []
    for node in graph.node:
        before, after = inserts.get(node.name, ([], []))
        nodes.extend([*before, node, *after])
    del graph.node[:]
    graph.node.extend(nodes)
    return added


def split_graph(graph_only: Path, windows: np.ndarray, scratch, *, channels: int,
                roles: Sequence[str] = DEFAULT_ROLES, skip: Collection[str] = (),
                threads: int | None = None) -> tuple[Path, list[str], list[dict[str, Any]]]:
    """The outlier split on the graph-only model ``graph_only`` (inside
    :func:`qwen_onnx.store.external.lazy_model`), channels chosen on ``windows``.

    Args:
        graph_only: a model whose weights are external references in its own folder.
        windows: int64 [samples, sequence] calibration windows.
        scratch: the :class:`~qwen_onnx.store.external.ScratchFiles` namer of that folder.
        channels: input channels computed in float per split MatMul (k).
        roles: which MatMuls are split.
        skip: MatMul names left whole (those kept float).
        threads: ORT intra-op threads.

    Returns:
        ``(path, float_matmuls, rows)``: the split graph (``scratch / "split.onnx"``, new weights in
        ``scratch / "split.data"``), the names of the added float MatMuls, and one row per split
        MatMul (``node``, ``layer``, ``channels``, ``absmax_kept`` = the largest |x| left to the
        quantized MatMul, ``absmax_split`` = the smallest |x| moved to float).

    Raises:
        QwenOnnxError: the graph has no MatMul of these roles.
    """
    proto = onnx.load(str(graph_only), load_external_data=False)
    targets = [t for t in split_targets(proto.graph, roles) if t.node not in skip]
    if not targets:
        raise QwenOnnxError(f"{graph_only}: no weight MatMul with role {', '.join(roles)} to split")
    absmax = channel_absmax(graph_only, windows, sorted({t.activation for t in targets}), scratch, threads)
    picked, rows = {}, []
    for target in targets:
        a = absmax[target.activation]
        picked[target.node] = outlier_channels(a, channels)
        rest = np.delete(a, picked[target.node])
        rows.append({"node": target.node, "layer": target.layer, "channels": picked[target.node].tolist(),
                     "absmax_split": round(float(a[picked[target.node]].min()), 3),
                     "absmax_kept": round(float(rest.max()) if rest.size else 0.0, 3)})
        log.info("outlier split %s: channels %s, max |x| kept %.1f of %.1f", target.node,
                 picked[target.node].tolist(), rows[-1]["absmax_kept"], float(a.max()))
    added = apply_split(proto, targets, picked, scratch / "split.data")
    output = scratch / "split.onnx"
    onnx.save_model(proto, str(output))
    return output, added, rows
