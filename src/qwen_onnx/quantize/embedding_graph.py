"""Where a Qwen graph looks up its token embedding and computes its logits: the embedding ``Gather`` and its
table, the lookup however the exporter wrote it, the lm_head MatMul, and whether the two share one table."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from qwen_onnx.quantize.matmuls import graph_maps
from qwen_onnx.store.external import lazy_model

#: The graph output the lm_head writes.
LOGITS = "logits"
#: Rows of the embedding table compared at a time when checking whether the lm_head shares it.
_CHUNK_ROWS = 8192


def find_embedding(graph: onnx.GraphProto) -> tuple[onnx.NodeProto, onnx.TensorProto] | None:
    """The token embedding: the ``Gather`` (axis 0) whose data is the largest 2-D float initializer,
    with that initializer; None when the graph has none (already quantized, or stored once as
    [hidden, vocab]: see :func:`find_lookup`)."""
    initializers = {t.name: t for t in graph.initializer}
    found = []
    for node in graph.node:
        if node.op_type != "Gather" or node.domain not in ("", "ai.onnx"):
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        table = initializers.get(node.input[0])
        if axis == 0 and table is not None and len(table.dims) == 2 and table.data_type == onnx.TensorProto.FLOAT:
            found.append((node, table))
    return max(found, key=lambda f: int(np.prod(f[1].dims))) if found else None


@dataclass
class Lookup:
    """The token lookup of a graph, in one of the two layouts this project writes.

    Attributes:
        nodes: the nodes that compute it (removed when it is rewritten), in one of the layouts
            :func:`find_lookup` lists.
        ids: the token ids it reads (int64 [batch, sequence]).
        output: its output, float [batch, sequence, hidden].
        table: the float initializer it reads, or None when it reads a ``DequantizeLinear``.
        dequantize: that ``DequantizeLinear`` (of lm_head's QDQ weight), or None.
        hidden_first: whether the table is [hidden, vocab] (stored once) rather than [vocab, hidden].
        perm: the permutation that takes a lookup of the [hidden, vocab] table on axis 1
            ([hidden, batch, sequence]) to the output (``hidden_first`` only).
    """
    nodes: list[onnx.NodeProto]
    ids: str
    output: str
    table: onnx.TensorProto | None
    dequantize: onnx.NodeProto | None
    hidden_first: bool
    perm: list[int]

    @property
    def gather(self) -> onnx.NodeProto:
        """The ``Gather`` node among :attr:`nodes`."""
        return next(n for n in self.nodes if n.op_type == "Gather")

    def float_table(self) -> np.ndarray:
        """The table as float32 [vocab, hidden] (read from the external data)."""
        values = numpy_helper.to_array(self.table)
        return np.ascontiguousarray(values.T) if self.hidden_first else values


def _rank(graph: onnx.GraphProto, name: str) -> int:
    """The rank of tensor ``name`` from the graph's inputs and value_info (2, input_ids', when unknown)."""
    info = next((v for v in [*graph.input, *graph.value_info] if v.name == name), None)
    if info is not None and info.type.tensor_type.HasField("shape"):
        return len(info.type.tensor_type.shape.dim)
    return 2


def find_lookup(graph: onnx.GraphProto) -> Lookup | None:
    """The float token lookup (:class:`Lookup`), or None when the graph has none left.

    Three layouts: ``Gather`` (axis 0) of a [vocab, hidden] table (the export's); for a tied table
    stored once as [hidden, vocab], ``Identity`` -> ``Gather`` (axis 1) -> ``Transpose``
    (:mod:`qwen_onnx.convert.tied`) or ``Transpose`` -> ``Gather`` (axis 0) (onnxruntime-genai's model
    builder). The [hidden, vocab] table is a float initializer or, after QDQ quantization, the
    ``DequantizeLinear`` of one.
    """
    embedding = find_embedding(graph)
    if embedding is not None:
        gather, table = embedding
        return Lookup([gather], gather.input[1], gather.output[0], table, None, False, [])
    initializers, producers, consumers = graph_maps(graph)

    def source(name: str) -> tuple[onnx.TensorProto | None, onnx.NodeProto | None] | None:
        table = initializers.get(name)
        if table is not None:
            return (table, None) if len(table.dims) == 2 and table.data_type == onnx.TensorProto.FLOAT else None
        dequantize = producers.get(name)
        if dequantize is not None and dequantize.op_type == "DequantizeLinear" and dequantize.input[0] in initializers:
            return None, dequantize
        return None

    def only_consumer(name: str, op_type: str) -> onnx.NodeProto | None:
        users = consumers.get(name, [])
        return users[0] if len(users) == 1 and users[0].op_type == op_type and users[0].input[0] == name else None

    for first in graph.node:
        if first.op_type not in ("Identity", "Transpose") or (found := source(first.input[0])) is None:
            continue
        gather = only_consumer(first.output[0], "Gather")
        axis = next((a.i for a in gather.attribute if a.name == "axis"), 0) if gather is not None else None
        if first.op_type == "Identity" and axis == 1:
            transpose = only_consumer(gather.output[0], "Transpose")
            if transpose is not None:
                perm = list(next(a.ints for a in transpose.attribute if a.name == "perm"))
                return Lookup([first, gather, transpose], gather.input[1], transpose.output[0], *found, True, perm)
        perm = list(next((a.ints for a in first.attribute if a.name == "perm"), [1, 0]))
        if first.op_type == "Transpose" and axis == 0 and perm == [1, 0]:
            rank = _rank(graph, gather.input[1])
            return Lookup([first, gather], gather.input[1], gather.output[0], *found, True, [*range(1, rank + 1), 0])
    return None


def find_lm_head(graph: onnx.GraphProto) -> onnx.NodeProto | None:
    """The lm_head: the ``MatMul`` or ``MatMulNBits`` whose output is the graph output ``logits``,
    else the one named ``lm_head``; None when there is neither."""
    heads = [n for n in graph.node if n.op_type in ("MatMul", "MatMulNBits")]
    return next((n for n in heads if LOGITS in n.output), None) or next((n for n in heads if "lm_head" in n.name), None)


def embedding_tied(folder: str | os.PathLike) -> bool:
    """Whether ``folder/model.onnx``'s lm_head weight [hidden, vocab] is the embedding table
    [vocab, hidden] transposed, value for value (a tied model, ``tie_word_embeddings``).

    A table stored once (:func:`qwen_onnx.convert.tied.store_tied_once`, which checked the values) is tied
    when lm_head reads it. Otherwise compares the two tables in chunks of rows, read from the
    external data up to the first chunk that differs (all of them, about 2 × 545 MB on Qwen2.5 0.5B,
    only for a tied pair).
    """
    with lazy_model(folder) as (proto, _):
        lookup = find_lookup(proto.graph)
        head = find_lm_head(proto.graph)
        if lookup is None or lookup.table is None or head is None or head.op_type != "MatMul":
            return False
        if lookup.hidden_first:
            return head.input[1] == lookup.table.name
        initializers = {t.name: t for t in proto.graph.initializer}
        weight = initializers.get(head.input[1])
        table = lookup.table
        if weight is None or list(weight.dims) != list(reversed(table.dims)):
            return False
        if table.name == weight.name:
            return False  # the same tensor read two ways would need a Transpose; not a layout we write
        emb, lm = _mapped(table), _mapped(weight)  # an untied pair differs in its first rows: read no more
        return all(np.array_equal(emb[i:i + _CHUNK_ROWS], lm[:, i:i + _CHUNK_ROWS].T)
                   for i in range(0, emb.shape[0], _CHUNK_ROWS))


def _mapped(tensor: onnx.TensorProto) -> np.ndarray:
    """``tensor``'s values, memory-mapped from its external data file (relative to the working
    directory) when it has one, so that a caller reading a few rows reads only those from disk."""
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return numpy_helper.to_array(tensor)
    info = {e.key: e.value for e in tensor.external_data}
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
    return np.memmap(info["location"], dtype=dtype, mode="r", offset=int(info.get("offset", 0)),
                     shape=tuple(tensor.dims))
