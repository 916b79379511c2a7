"""Tied embeddings stored once: the embedding table and lm_head share one initializer.

Qwen2.5 0.5B and 1.5B tie lm_head to the embedding table. The export stores the table once and
feeds lm_head through a ``Transpose``; ONNX Runtime's constant folding (``ORT_ENABLE_BASIC`` and
up, as in ``preprocess`` and ``optimize``) turns that Transpose into a second initializer
``<table>_transposed`` [hidden, vocab], so the saved model holds the same weights twice
(+544 MB on the 0.5B, +933 MB on the 1.5B, in fp32).

``preprocess`` and ``optimize`` call :func:`store_tied_once`, which keeps only the transposed copy,
which lm_head's MatMul reads as a constant (so the quantizers still see a weight MatMul), and the
token lookup reads the same tensor: ``Gather(table, ids, axis=0)`` [batch, sequence, hidden]
becomes ``Gather(Identity(table_transposed), ids, axis=1)`` [hidden, batch, sequence] followed by
``Transpose(perm=[1, 2, 0])``. (onnxruntime-genai's builder writes the other stored-once layout,
``Gather(Transpose(lm_head weight), ids, axis=0)``.) The lookup then reads ``hidden`` values
strided by ``vocab`` per token, a cost per prompt token only.

The quantizers then make the lookup read lm_head's quantized weight, so no float copy stays
(:func:`qwen_onnx.quantize.embeddings.quantize_embedding`): ``GatherBlockQuantized`` over a ``MatMulNBits``
weight (at any block size: when it does not divide the hidden size, a ``Slice`` drops the last
block's padding from the gathered rows), or, after QDQ quantization (whose ``DequantizeLinear`` every reader of the weight would
otherwise read, dequantizing the whole table at every step), a ``Gather`` of the INT8 columns
times their per-channel scales.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qwen_onnx.store.external import consolidate_external_data

log = logging.getLogger(__name__)

SUFFIX = "_transposed"  # onnxruntime's constant folding names a folded Transpose's output so


def _array(tensor: onnx.TensorProto, folder: Path) -> np.ndarray:
    """The tensor's values, memory-mapped when they are in an external file (not loaded)."""
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return numpy_helper.to_array(tensor)
    info = {e.key: e.value for e in tensor.external_data}
    dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
    return np.memmap(folder / info["location"], dtype=dtype, mode="r", offset=int(info.get("offset", 0)),
                     shape=tuple(tensor.dims))


def _same_transposed(table: np.ndarray, transposed: np.ndarray, rows: int = 4096) -> bool:
    """Whether ``transposed`` [hidden, vocab] is ``table`` [vocab, hidden] transposed, bit for bit,
    compared ``rows`` table rows at a time."""
    if table.shape != transposed.shape[::-1] or table.dtype != transposed.dtype:
        return False
    return all(np.array_equal(table[i:i + rows], transposed[:, i:i + rows].T) for i in range(0, table.shape[0], rows))


def store_tied_once(model_file: str | os.PathLike) -> list[str]:
    """Rewrite ``model_file`` (with its ``model.onnx_data``) so that a tied table is stored once.

    A pair qualifies when initializer ``T = <E>_transposed`` holds exactly ``E`` transposed and
    every consumer of ``E`` is a ``Gather`` on axis 0 whose indices have a known rank.

    Returns:
        The names of the tables removed (empty when the model has no such pair; the file is then
        left untouched).
    """
    path = Path(model_file)
    folder = path.parent
    proto = onnx.load(str(path), load_external_data=False)
    graph = proto.graph
    initializers = {t.name: t for t in graph.initializer}
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in [*graph.input, *graph.value_info]
             if v.type.tensor_type.HasField("shape")}
    removed = []
    for name, transposed in list(initializers.items()):
        table = initializers.get(name[: -len(SUFFIX)]) if name.endswith(SUFFIX) else None
        if table is None or len(table.dims) != 2:
            continue
        users = [n for n in graph.node if table.name in n.input]
        gathers = [n for n in users if n.op_type == "Gather" and n.input[0] == table.name
                   and table.name not in n.input[1:]
                   and next((a.i for a in n.attribute if a.name == "axis"), 0) == 0 and n.input[1] in ranks]
        if not users or len(gathers) != len(users) or any(o.name == table.name for o in graph.output):
            continue
        if not _same_transposed(_array(table, folder), _array(transposed, folder)):
            continue
        # The lookup reads the table through an Identity (removed by onnxruntime at load), so a
        # blockwise quantizer (MatMulNBits) given this graph quantizes lm_head's weight alone.
        lookup = f"{name}_lookup"
        graph.node.insert(0, helper.make_node("Identity", [name], [lookup], name=f"{name}_Identity"))
        for gather in gathers:
            rank = ranks[gather.input[1]]
            output = gather.output[0]
            gather.input[0] = lookup
            del gather.attribute[:]
            gather.attribute.append(helper.make_attribute("axis", 1))
            gather.output[0] = f"{output}_hidden_first"
            transpose = helper.make_node("Transpose", [gather.output[0]], [output], name=f"{gather.name}_Transpose",
                                         perm=[*range(1, rank + 1), 0])
            position = list(graph.node).index(gather) + 1
            graph.node.insert(position, transpose)
        graph.initializer.remove(table)
        removed.append(table.name)
    if removed:
        consolidate_external_data(proto, path, search=[folder])
        log.info("tied embedding stored once: %s removed, lookups read %s", ", ".join(removed),
                 ", ".join(r + SUFFIX for r in removed))
    return removed

