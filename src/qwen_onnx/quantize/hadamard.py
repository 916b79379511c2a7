"""Online Hadamard rotation of a weight MatMul's input, before static INT8 calibration.

``Y = X W`` becomes ``Y = (X R) (R^T W)`` with ``R`` orthogonal, so the float graph computes the same
product (tested to 1e-4). ``R`` is block-diagonal: the ``in_features`` channels are cut into blocks of
``b`` (the largest power of two dividing ``in_features``, at most :data:`MAX_BLOCK`) and each block is
multiplied by the normalised Sylvester-Hadamard matrix ``H_b / sqrt(b)``. ``R^T W`` is folded into the
weight offline; ``X R`` runs online as ``Reshape → MatMul(H) → Reshape`` in front of the MatMul,
a float MatMul of ``in_features x b`` multiply-adds per token (a quarter of the 0.5B down_proj's
``4864 x 896`` for ``b = 256``), kept out of quantization like the attention products.

Why: the input of ``down_proj`` (the SwiGLU product) carries Qwen's massive activations (Sun et al.
2024, "Massive Activations in Large Language Models", arXiv:2402.17762): a few tokens whose values in
a handful of channels are a hundred times the rest, so one per-tensor activation scale either clips
them or spends its 256 levels on them. A Hadamard rotation spreads a value of one channel over the
``b`` channels of its block, dividing its magnitude by ``sqrt(b)`` (16 for ``b = 256``), while a
token with no outlier keeps its spread: the per-tensor range needed shrinks and the other tokens get
finer steps. This is QuaRot's online Hadamard in front of down_proj (Ashkboos et al. 2024,
"QuaRot: Outlier-Free 4-Bit Inference in Rotated LLMs", arXiv:2404.00456, section 4), with a
block-diagonal Hadamard (as QuaRot does for dimensions that are not a power of two times a known
Hadamard order) and static per-tensor scales instead of QuaRot's per-token ones.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Collection, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.quantize.matmuls import ROLES
from qwen_onnx.quantize.outlier_split import SplitTarget, split_targets
from qwen_onnx.store.external import DataWriter

log = logging.getLogger(__name__)

#: The largest Hadamard block: 256 divides the intermediate size of every Qwen1.5/2/2.5/3 model
#: measured here (0.5B 4864 = 19 x 256, 1.5B 8960 = 35 x 256) and costs a quarter of a 0.5B
#: down_proj's multiply-adds per token.
MAX_BLOCK = 256
#: The MatMul roles rotated by default: every weight MatMul's input (measured on the 0.5B: down_proj
#: alone, where the massive activations are, +1.18% perplexity / 93.1% top-1; every role +0.51% /
#: 96.5%; docs/int8.md, "int8-static").
DEFAULT_ROLES = ROLES
#: Root of the names of the nodes and tensors a rotation adds: ``/hadamard<rotated tensor>/MatMul``.
_PREFIX = "/hadamard"


def hadamard_matrix(size: int) -> np.ndarray:
    """The normalised Sylvester-Hadamard matrix float32 [size, size]: symmetric and orthogonal
    (``H @ H = I``), entries ``±1 / sqrt(size)``.

    Raises:
        QwenOnnxError: ``size`` is not a power of two.
    """
    if size < 1 or size & (size - 1):
        raise QwenOnnxError(f"a Sylvester-Hadamard matrix needs a power-of-two size; got {size}")
    h = np.ones((1, 1), dtype=np.float64)
    while h.shape[0] < size:
        h = np.block([[h, h], [h, -h]])
    return (h / np.sqrt(size)).astype(np.float32)


def block_size(in_features: int, largest: int = MAX_BLOCK) -> int:
    """The Hadamard block for ``in_features`` channels: the largest power of two that divides it,
    at most ``largest``.

    Raises:
        QwenOnnxError: ``in_features`` is odd (a block of 1 rotates nothing).
    """
    b = 1
    while b * 2 <= largest and in_features % (b * 2) == 0:
        b *= 2
    if b == 1:
        raise QwenOnnxError(f"{in_features} input channels have no power-of-two block to rotate")
    return b


def rotate_weight(w: np.ndarray, block: int) -> np.ndarray:
    """``R^T W`` for the block-diagonal rotation: float32 [in_features, out_features] in and out."""
    h = hadamard_matrix(block)
    blocks = w.reshape(-1, block, w.shape[1])  # [blocks, b, out]
    return np.einsum("ij,njk->nik", h.T, blocks, optimize=True).reshape(w.shape).astype(np.float32)


def apply_rotation(proto: onnx.ModelProto, targets: Sequence[SplitTarget], data_path: Path) -> list[str]:
    """Rotate each target MatMul of ``proto`` in place: its weight becomes ``R^T W`` (written to
    ``data_path`` beside the graph to be saved) and ``Reshape → MatMul(H) → Reshape`` is inserted on
    its input, named ``/hadamard<input tensor>/...``. Targets sharing an input share one rotation.

    Returns:
        The names of the rotation MatMuls added (float; to keep out of quantization).
    """
    graph = proto.graph
    initializers = {t.name: t for t in graph.initializer}
    position = {node.name: i for i, node in enumerate(graph.node)}
    writer = DataWriter(data_path)
    rotated: dict[str, str] = {}  # activation -> its rotated tensor
    inserts: dict[str, list[onnx.NodeProto]] = {}
    added: list[str] = []
    try:
        for target in targets:
            block = block_size(target.in_features)
            node = graph.node[position[target.node]]
            writer.set(initializers[target.weight],
                       rotate_weight(numpy_helper.to_array(initializers[target.weight]).astype(np.float32), block))
            if target.activation not in rotated:
                # named after the rotated tensor under its own root, so that no layer's or MatMul's
                # name prefix (qwen_onnx.measure.inspect_graph.KEY_WEIGHTS) takes in the rotation's [b, b] matrix
                prefix = _PREFIX + (target.activation if target.activation.startswith("/") else "/" + target.activation)
                h = numpy_helper.from_array(hadamard_matrix(block), f"{prefix}/H")
                split = numpy_helper.from_array(np.array([0, 0, -1, block], dtype=np.int64), f"{prefix}/blocks")
                joined = numpy_helper.from_array(np.array([0, 0, target.in_features], dtype=np.int64),
                                                 f"{prefix}/channels")
                graph.initializer.extend([h, split, joined])
                # [batch, sequence, in] -> [batch, sequence, in / b, b] @ [b, b] -> [batch, sequence, in]
                blocks, turned, out = (f"{prefix}/{n}" for n in ("blocks_out", "rotated_blocks", "rotated"))
                matmul = f"{prefix}/MatMul"
                inserts[target.node] = [
                    helper.make_node("Reshape", [target.activation, split.name], [blocks], name=f"{prefix}/Reshape"),
                    helper.make_node("MatMul", [blocks, h.name], [turned], name=matmul),
                    helper.make_node("Reshape", [turned, joined.name], [out], name=f"{prefix}/Reshape_back"),
                ]
                rotated[target.activation] = out
                added.append(matmul)
            node.input[0] = rotated[target.activation]
    finally:
        writer.close()
    nodes = []
    for node in graph.node:
        nodes.extend([*inserts.get(node.name, []), node])
    del graph.node[:]
    graph.node.extend(nodes)
    return added


def rotate_graph(graph_only: Path, scratch, *, roles: Sequence[str] = DEFAULT_ROLES,
                 skip: Collection[str] = ()) -> tuple[Path, list[str], list[dict[str, Any]]]:
    """The Hadamard rotation on the graph-only model ``graph_only`` (inside
    :func:`qwen_onnx.store.external.lazy_model`).

    Args:
        graph_only: a model whose weights are external references in its own folder.
        scratch: the :class:`~qwen_onnx.store.external.ScratchFiles` namer of that folder.
        roles: which MatMuls are rotated (:func:`qwen_onnx.quantize.matmuls.node_role`).
        skip: MatMul names left as they are (those kept float).

    Returns:
        ``(path, rotation_matmuls, rows)``: the rotated graph (``scratch / "rotated.onnx"``, new
        weights in ``scratch / "rotated.data"``), the names of the rotation MatMuls added, and one
        row per rotated MatMul (``node``, ``layer``, ``block``).

    Raises:
        QwenOnnxError: the graph has no MatMul of these roles, or one with an odd input width.
    """
    proto = onnx.load(str(graph_only), load_external_data=False)
    targets = [t for t in split_targets(proto.graph, roles) if t.node not in skip]
    if not targets:
        raise QwenOnnxError(f"{graph_only}: no weight MatMul with role {', '.join(roles)} to rotate")
    rows = [{"node": t.node, "layer": t.layer, "block": block_size(t.in_features)} for t in targets]
    added = apply_rotation(proto, targets, scratch / "rotated.data")
    output = scratch / "rotated.onnx"
    onnx.save_model(proto, str(output))
    log.info("Hadamard rotation of %d MatMul inputs (%s), blocks of %s", len(targets), ", ".join(roles),
             sorted({r["block"] for r in rows}))
    return output, added, rows
