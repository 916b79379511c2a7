"""Quantized token embeddings: the embedding ``Gather`` as onnxruntime's ``GatherBlockQuantized``.

The embedding table of a Qwen model is large (Qwen2.5 0.5B: 151,936 × 896 float32 = 545 MB, over
half of an INT8 variant's bytes when left float). ``GatherBlockQuantized`` (onnxruntime contrib
op, ``com.microsoft``) gathers rows of a blockwise-quantized table and dequantizes them:

- ``data`` uint8 [vocab, hidden × bits / 8] (4-bit values two per byte, low nibble first),
  ``indices`` int64 [batch, sequence], ``scales`` float [vocab, hidden / block_size], optional
  ``zero_points`` uint8 (packed like ``data``); without zero points the zero point is
  2^(bits-1) (8 or 128), the same convention as ``MatMulNBits``;
- attributes ``bits`` (4 or 8), ``block_size`` (a power of 2, at least 16), ``gather_axis`` 0,
  ``quantize_axis`` 1 -> output float [batch, sequence, hidden].

``MatMulNBits`` stores its weight ``B`` [K, N] as uint8 [N, k_blocks, blob] with scales
[N, k_blocks], ``k_blocks = ceil(K / block_size)`` (the last block zero-padded when ``block_size``
does not divide K): for a tied model (lm_head weight = embedding table transposed, Qwen2.5 0.5B /
1.5B ``tie_word_embeddings``) the lm_head's packed weight *is* the quantized embedding table, laid
out as ``GatherBlockQuantized`` wants it after a Reshape to [N, k_blocks × block_size × bits / 8].
When the block size does not divide the hidden size (hidden 64 at block 128, 896 at block 256),
the gathered rows carry the padding, [batch, sequence, k_blocks × block_size], and a ``Slice``
keeps the first ``hidden`` values. Sharing it stores the table once; this is what the
onnxruntime-genai model builder does for tied models (``builders/base.py``, ``shared_embeddings``).
Measured on onnxruntime 1.32: gathering rows of the shared weight matches the lm_head
``MatMulNBits`` product with an identity input to 5e-7, for 4 and 8 bits, with and without zero
points.

An own table (``quantized``, or a tied table that cannot be shared) gets names of its own
(:func:`_free_name`): on the builder's stored-once layout the table is lm_head's weight, whose
``MatMulNBits`` initializers are already called ``<weight>_Q8`` and ``<weight>_scales``.

Everything here finds the nodes by what they compute, not by exporter names: the embedding is the
``Gather`` whose data is a 2-D float initializer, the lm_head the ``MatMul``/``MatMulNBits``
producing the graph output ``logits`` (or a node named ``lm_head``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.quantize.embedding_graph import Lookup, find_lm_head, find_lookup
from qwen_onnx.settings.options import check_option
from qwen_onnx.store.artifacts import MODEL_FILE
from qwen_onnx.store.external import consolidate_external_data, lazy_model

log = logging.getLogger(__name__)

#: ``embedding`` modes: keep the float table; quantize it on its own (``GatherBlockQuantized`` with
#: ``embedding_bits``); share the lm_head's ``MatMulNBits`` weight when the model is tied (else the
#: same as ``quantized``).
EMBEDDING_MODES = ("float", "quantized", "shared")


@dataclass(frozen=True)
class EmbeddingPlan:
    """What :func:`quantize_embedding` does to one variant.

    Attributes:
        mode: one of :data:`EMBEDDING_MODES`.
        bits: bits of an own quantized table (4 or 8).
        block_size: block length (inputs per scale) of an own table; a power of 2, at least 16.
        tied: whether the source model's lm_head weight equals the embedding table transposed
            (:func:`embedding_tied`); sharing needs it.
        symmetric: an own table without zero points (else one uint8 zero point per block).
    """
    mode: str = "shared"
    bits: int = 8
    block_size: int = 128
    tied: bool = False
    symmetric: bool = True

    def check(self) -> None:
        """Raises QwenOnnxError on an unknown mode, bits other than 4 or 8, or a bad block size."""
        if self.mode not in EMBEDDING_MODES:
            raise QwenOnnxError(f"embedding mode {self.mode!r} unknown; use one of {', '.join(EMBEDDING_MODES)}")
        if self.bits not in (4, 8):
            raise QwenOnnxError(f"embedding bits must be 4 or 8 (GatherBlockQuantized), got {self.bits}")
        check_option("block_size", self.block_size)


def fitting_block_size(block_size: int, length: int) -> int:
    """``block_size`` halved (down to 16) until it divides ``length``, the row length it blocks
    (e.g. a tiny test model's hidden 64 with block 128)."""
    while length % block_size and block_size > 16:
        block_size //= 2
    return block_size


def _const(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def _free_name(graph: onnx.GraphProto, name: str) -> str:
    """``name``, or ``name`` with ``_embedding`` inserted before its last ``_`` part (then numbered),
    when an initializer, node output or graph input of ``graph`` already has it.

    A tied table stored once in the builder's layout is lm_head's weight (``lm_head.MatMul.weight``),
    whose ``MatMulNBits`` initializers are ``lm_head.MatMul.weight_Q8`` and ``..._scales``: an own
    quantized table named after it would be a second initializer of the same name, of another
    shape, which onnxruntime refuses to load (or, at the same shape, silently reads in place of
    the other)."""
    used = {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output}
    used |= {i.name for i in graph.input}
    if name not in used:
        return name
    stem, _, suffix = name.rpartition("_")
    candidates = (f"{stem}_embedding{'' if i == 1 else i}_{suffix}" for i in range(1, len(used) + 2))
    return next(c for c in candidates if c not in used)


def _gather_node(name: str, inputs: list[str], output: str, bits: int, block_size: int) -> onnx.NodeProto:
    return helper.make_node(
        "GatherBlockQuantized", inputs, [output], name=name + "_Q",
        domain="com.microsoft", bits=bits, block_size=block_size, gather_axis=0, quantize_axis=1,
    )


def quantize_table(
    table: np.ndarray, bits: int, block_size: int, symmetric: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Blockwise quantization of an embedding table for ``GatherBlockQuantized``.

    Uses onnxruntime's own MatMulNBits quantizer kernel on the transposed table, so the values are
    exactly what ``MatMulNBits`` would hold for a tied lm_head. When ``block_size`` does not divide
    hidden, the last block of each row is partial: the quantizer pads it with zeros and the padding
    is dropped from ``data`` (``GatherBlockQuantized`` takes ``ceil(hidden / block_size)`` scales
    per row of ``hidden`` values; onnxruntime contrib op docs, CPU kernel
    ``gather_block_quantized.cc``).

    Args:
        table: float32 [vocab, hidden]; hidden even for 4 bits (two values per byte).

    Returns:
        ``(data, scales, zero_points)``: uint8 [vocab, hidden × bits / 8], float32
        [vocab, blocks] with ``blocks = ceil(hidden / block_size)``, and for ``symmetric=False`` uint8
        zero points [vocab, ceil(blocks × bits / 8)] (4-bit ones two per byte), else None.

    Raises:
        QwenOnnxError: 4 bits and an odd hidden size (not a whole number of bytes per row).
    """
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        DefaultWeightOnlyQuantizer,
    )

    vocab, hidden = table.shape
    if hidden * bits % 8:
        raise QwenOnnxError(f"embedding hidden size {hidden} is odd, so its {bits}-bit rows are not whole bytes; "
                            "use embedding bits 8")
    blocks = -(-hidden // block_size)
    quantizer = DefaultWeightOnlyQuantizer(
        DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=symmetric, bits=bits)
    )
    packed, scales, zero_points = quantizer.qbits_block_quant(np.ascontiguousarray(table.T))  # [V, blocks, blob]
    data = packed.reshape(vocab, blocks * block_size * bits // 8)[:, :hidden * bits // 8]  # padding dropped
    zero_points = None if symmetric else zero_points.reshape(vocab, -(-blocks * bits // 8))
    return np.ascontiguousarray(data), scales.reshape(vocab, blocks), zero_points


def _qdq_lookup(graph: onnx.GraphProto, lookup: Lookup, prefix: str) -> tuple[list[onnx.NodeProto], dict] | None:
    """Nodes that look tokens up in lm_head's per-channel INT8 QDQ weight [hidden, vocab] itself:
    ``Gather(weight, ids, axis=1)`` [hidden, batch, sequence] -> ``Cast`` -> ``Mul`` by
    ``Gather(scale, ids)`` [batch, sequence] -> ``Transpose``: the values ``DequantizeLinear``
    gives, bit for bit (symmetric weights, zero points 0), without dequantizing the whole table
    at every step. None unless the ``DequantizeLinear`` is per-channel on the vocab axis with zero
    zero points."""
    initializers = {t.name: t for t in graph.initializer}
    dq = lookup.dequantize
    weight, scale = initializers.get(dq.input[0]), initializers.get(dq.input[1])
    zero = initializers.get(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
    if weight is None or scale is None or len(weight.dims) != 2 or list(scale.dims) != [weight.dims[1]] or axis != 1:
        return None
    if zero is not None and np.any(numpy_helper.to_array(zero)):
        return None
    name = lookup.gather.name or "embedding"  # nodes keep the lookup's name (/model/embed_tokens/...)
    nodes = [
        helper.make_node("Gather", [weight.name, lookup.ids], [prefix + "_int8"], name=name, axis=1),
        helper.make_node("Cast", [prefix + "_int8"], [prefix + "_values"], name=name + "_Cast",
                         to=onnx.TensorProto.FLOAT),
        helper.make_node("Gather", [scale.name, lookup.ids], [prefix + "_scales"], name=name + "_scales", axis=0),
        helper.make_node("Mul", [prefix + "_values", prefix + "_scales"], [prefix + "_hidden_first"],
                         name=name + "_Mul"),
        helper.make_node("Transpose", [prefix + "_hidden_first"], [lookup.output], name=name + "_Transpose",
                         perm=lookup.perm),
    ]
    vocab, hidden = int(weight.dims[1]), int(weight.dims[0])
    return nodes, {"vocab": vocab, "hidden": hidden, "shared_with": dq.name}


def _shareable_zero_points(graph: onnx.GraphProto, head: onnx.NodeProto) -> bool:
    """Whether ``GatherBlockQuantized`` can read the lm_head ``MatMulNBits``'s zero points: none, or a
    uint8 initializer (HQQ stores float zero points, which ``GatherBlockQuantized`` does not take)."""
    if len(head.input) < 4 or not head.input[3]:
        return True
    zero = next((t for t in graph.initializer if t.name == head.input[3]), None)
    return zero is not None and zero.data_type == onnx.TensorProto.UINT8


def _shared_lookup(graph: onnx.GraphProto, head: onnx.NodeProto, lookup: Lookup, name: str, prefix: str,
                   vocab: int, hidden: int, bits: int, block_size: int
                   ) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """The nodes (and their shape constants) that look tokens up in the lm_head ``MatMulNBits``'s own
    packed weight: Reshapes of its data uint8 [vocab, k_blocks, blob] to [vocab, k_blocks × blob] and
    of its scales to [vocab, k_blocks] (and of its uint8 zero points to [vocab, ceil(k_blocks × bits / 8)]
    when they are stored flat), then ``GatherBlockQuantized`` -> float [batch, sequence,
    k_blocks × block_size]; when ``block_size`` does not divide ``hidden`` (``k_blocks =
    ceil(hidden / block_size)``, the last block zero-padded by the quantizer), a ``Slice`` keeps the
    first ``hidden`` values of the last axis: [batch, sequence, hidden]."""
    blocks = -(-hidden // block_size)
    padded = blocks * block_size
    gathered = lookup.output if padded == hidden else prefix + "_shared_padded"
    shapes = {"data": [vocab, padded * bits // 8], "scales": [vocab, blocks],
              "zero_points": [vocab, -(-blocks * bits // 8)]}
    sources = {"data": head.input[1], "scales": head.input[2],
               "zero_points": head.input[3] if len(head.input) > 3 and head.input[3] else None}
    zero = next((t for t in graph.initializer if t.name == sources["zero_points"]), None)
    if zero is not None and list(zero.dims) == shapes["zero_points"]:
        shapes.pop("zero_points")  # packed uint8 zero points, one row per vocab entry, read as they are
    nodes: list[onnx.NodeProto] = []
    added: list[onnx.TensorProto] = []
    inputs = [prefix + "_shared_data", lookup.ids]
    for part, source in sources.items():
        if source is None:
            continue
        if part not in shapes:
            inputs.append(source)
            continue
        shape = _const(f"{prefix}_shared_{part}_shape", shapes[part])
        added.append(shape)
        nodes.append(helper.make_node("Reshape", [source, shape.name], [f"{prefix}_shared_{part}"],
                                      name=f"{prefix}_shared_{part}_Reshape"))
        if part != "data":
            inputs.append(f"{prefix}_shared_{part}")
    nodes.append(_gather_node(name, inputs, gathered, bits, block_size))
    if gathered != lookup.output:  # [batch, sequence, padded] -> [batch, sequence, hidden]
        bounds = [_const(f"{prefix}_shared_slice_{b}", [v]) for b, v in (("starts", 0), ("ends", hidden),
                                                                         ("axes", -1))]
        added += bounds
        nodes.append(helper.make_node("Slice", [gathered, *(b.name for b in bounds)], [lookup.output],
                                      name=name + "_Slice"))
    return nodes, added


def _check_unique_initializers(graph: onnx.GraphProto) -> None:
    """Raises QwenOnnxError when two initializers of ``graph`` share a name: onnxruntime refuses such
    a graph when their shapes differ ("Shape of initializer ... does not match") and reads one for
    the other when they agree, so the stage fails rather than write a variant that does not load
    or computes with the wrong weights."""
    seen: dict[str, list[int]] = {}
    for tensor in graph.initializer:
        if tensor.name in seen:
            raise QwenOnnxError(
                f"the quantized graph holds two initializers named {tensor.name} ({seen[tensor.name]} and "
                f"{list(tensor.dims)}), so onnxruntime would not load it; this is a qwen-onnx bug, please report "
                "it with the stage's settings, and use --embedding float meanwhile")
        seen[tensor.name] = list(tensor.dims)


def quantize_embedding(folder: str | os.PathLike, plan: EmbeddingPlan) -> dict[str, Any]:
    """Replace the float token lookup (:func:`find_lookup`) of the variant in ``folder`` by a quantized one, in place
    (:func:`replace_lookup`); ``folder/model.onnx_data`` is rewritten without the float table when nothing
    else reads it.

    Returns:
        :func:`replace_lookup`'s record.

    Raises:
        QwenOnnxError: a bad plan, or an odd hidden size for a 4-bit own table.
    """
    plan.check()
    folder = Path(folder)
    if plan.mode == "float":
        return {"mode": "float"}
    with lazy_model(folder) as (proto, _):
        info = replace_lookup(proto, plan)
        if info["mode"] != "float":
            consolidate_external_data(proto, folder / MODEL_FILE, search=[folder])
    return info


def replace_lookup(proto: onnx.ModelProto, plan: EmbeddingPlan, cache: dict | None = None) -> dict[str, Any]:
    """Replace the float token lookup (:func:`find_lookup`) of ``proto`` by a quantized one, in memory.

    - ``shared`` with ``plan.tied`` and an lm_head that is ``MatMulNBits`` over [hidden, vocab] (any
      block size; uint8 zero points or none): ``GatherBlockQuantized`` reads the lm_head's packed
      weight, scales and zero points through Reshapes, then a ``Slice`` drops the last block's
      padding when the block size does not divide hidden (:func:`_shared_lookup`; no new weight bytes).
    - ``shared`` where the lookup reads lm_head's QDQ weight (a static variant of a table stored
      once): the lookup gathers the INT8 weight's columns and their scales (:func:`_qdq_lookup`),
      no new weight bytes.
    - Otherwise (``quantized``, or ``shared`` without a tied quantized lm_head) the table is
      quantized on its own at ``plan.bits`` with ``plan.block_size`` (halved down to 16 until it
      divides the hidden size; below 16, the last block partial: :func:`quantize_table`) for
      ``GatherBlockQuantized``, under names no other tensor has (:func:`_free_name`).

    The float table is removed from the graph when nothing else reads it; an external table is read
    relative to the working directory (inside :func:`qwen_onnx.store.external.lazy_model`).

    Args:
        cache: ``{(table name, bits, block size, symmetric): (data, scales, zero points)}``
            (:func:`quantize_table`'s result), looked up and filled: the precision search builds
            every candidate with the same table.

    Returns:
        ``{"mode", "bits", "block_size", "shared_with", "table_bytes_before", "table_bytes_after"}``
        (``mode`` is what was done: ``float``, ``quantized`` or ``shared``).

    Raises:
        QwenOnnxError: a bad plan, or an odd hidden size for a 4-bit own table.
    """
    plan.check()
    if plan.mode == "float":
        return {"mode": "float"}
    graph = proto.graph
    lookup = find_lookup(graph)
    if lookup is None:
        return {"mode": "float", "reason": "no float embedding Gather"}
    first = lookup.nodes[0]
    name = lookup.gather.name or "embedding"  # new nodes keep the lookup's name (/model/embed_tokens/...)
    prefix = name.strip("/").replace("/", "_")
    head = find_lm_head(graph)
    attrs = {a.name: helper.get_attribute_value(a) for a in head.attribute} if head is not None else {}
    table = lookup.table
    added: list[onnx.TensorProto] = []
    after = 0
    shared_with = None
    qdq = _qdq_lookup(graph, lookup, prefix) if lookup.dequantize is not None and plan.mode == "shared" else None
    if lookup.dequantize is not None and qdq is None:
        return {"mode": "float", "reason": "the lookup reads a DequantizeLinear that cannot be shared"}
    if qdq is not None:
        new_nodes, shape = qdq
        vocab, hidden = shape["vocab"], shape["hidden"]
        bits, block_size, shared_with, share = 8, hidden, shape["shared_with"], True
    else:
        vocab, hidden = (int(d) for d in (table.dims[::-1] if lookup.hidden_first else table.dims))
        share = (plan.mode == "shared" and plan.tied and head is not None and head.op_type == "MatMulNBits"
                 and attrs.get("K") == hidden and attrs.get("N") == vocab and _shareable_zero_points(graph, head))
    before = vocab * hidden * 4
    if share and qdq is None:
        bits, block_size = int(attrs["bits"]), int(attrs["block_size"])
        new_nodes, added = _shared_lookup(graph, head, lookup, name, prefix, vocab, hidden, bits, block_size)
        shared_with = head.name
    elif not share:
        bits, block_size = plan.bits, fitting_block_size(plan.block_size, hidden)
        key = (table.name, bits, block_size, plan.symmetric)
        if cache is not None and key in cache:
            data, scales, zero_points = cache[key]
        else:
            data, scales, zero_points = quantize_table(lookup.float_table(), bits, block_size, plan.symmetric)
            if cache is not None:
                cache[key] = (data, scales, zero_points)
        stem = table.name.removesuffix("_transposed")
        arrays = {f"_Q{bits}": data, "_scales": scales.astype(np.float32), "_zero_points": zero_points}
        for suffix, values in arrays.items():
            if values is not None:
                added.append(numpy_helper.from_array(values, _free_name(graph, stem + suffix)))
        inputs = [added[0].name, lookup.ids, *(t.name for t in added[1:])]
        new_nodes = [_gather_node(name, inputs, lookup.output, bits, block_size)]
        after = sum(len(t.raw_data) for t in added)
    graph.initializer.extend(added)
    position = list(graph.node).index(first)
    for node in lookup.nodes:
        graph.node.remove(node)
    for offset, node in enumerate(new_nodes):
        graph.node.insert(position + offset, node)
    if table is not None and not any(table.name in n.input for n in graph.node):
        graph.initializer.remove(table)
    if not any(o.domain == "com.microsoft" for o in proto.opset_import):
        proto.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    _check_unique_initializers(graph)
    mode = "shared" if share else "quantized"
    log.info("embedding: %s, %d bits, block %d, %.0f MB -> %.0f MB", mode, bits, block_size,
             before / 1e6, after / 1e6)
    return {"mode": mode, "bits": bits, "block_size": block_size, "shared_with": shared_with,
            "table_bytes_before": before, "table_bytes_after": after}
