"""MatMulNBits nodes (onnxruntime's weight-only quantized MatMul, its docs/ContribOperators.md): zero points
packed as the operator asks, a node from quantized blocks, and the weight MatMuls of a graph replaced by the
nodes their builders make."""

from __future__ import annotations

import collections
import os
from typing import Callable, Mapping

import numpy as np
import onnx
from onnxruntime.quantization.neural_compressor.weight_only import (
    make_matmul_weight_only_node as _ort_matmul_nbits_node,
)

from qwen_onnx.quantize.source_grid import insert_block_sums


def pack_zero_points(zero_point: np.ndarray, n: int, k_blocks: int, num_bits: int) -> np.ndarray:
    """MatMulNBits' uint8 ``zero_points`` input from one zero point per block.

    Args:
        zero_point: integers in ``[0, 2^bits - 1]``, ``N * k_blocks`` of them in row-major
            [N, k_blocks] order (any shape).
        n: output columns N; k_blocks: blocks per column, ``ceil(K / block_size)``.
        num_bits: 4 or 8.

    Returns:
        uint8 [N, ceil(k_blocks * bits / 8)]: each column's zero points packed on their own
        (4 bits: the first block in the low nibble, an odd last byte padded with 8), as the
        MatMulNBits spec (onnxruntime docs/ContribOperators.md) asks.
    """
    zp = np.asarray(zero_point).reshape(n, k_blocks).astype(np.uint8)
    if num_bits == 8:
        return zp
    if num_bits != 4:
        raise ValueError(f"MatMulNBits zero points of {num_bits} bits are not packed here; use 4 or 8")
    if k_blocks % 2:
        zp = np.concatenate([zp, np.full((n, 1), 8, dtype=np.uint8)], axis=1)
    return (zp[:, 0::2] | (zp[:, 1::2] << 4)).astype(np.uint8)


def matmul_nbits_node(node, weight_shape, num_bits, group_size, k_blocks, q_weight, scale, zero_point,
                      accuracy_level=0):
    """onnxruntime's ``make_matmul_weight_only_node`` (same arguments and returns: the MatMulNBits
    node and its new initializers) with the zero points packed by :func:`pack_zero_points`.

    Args:
        weight_shape: the float weight's ``(K, N)``.
        q_weight: uint8 [N * k_blocks, group_size] integers in ``[0, 2^bits - 1]``.
        scale: float32 or float16 [N * k_blocks, 1]; zero_point: [N * k_blocks, 1] or None (the
            operator's default ``2^(bits-1)``).
    """
    new, tensors = _ort_matmul_nbits_node(
        node=node, weight_shape=weight_shape, num_bits=num_bits, group_size=group_size, k_blocks=k_blocks,
        q_weight=q_weight, scale=scale, zero_point=None, accuracy_level=accuracy_level,
    )
    if zero_point is not None:
        packed = pack_zero_points(zero_point, weight_shape[1], k_blocks, num_bits)
        tensors.append(onnx.numpy_helper.from_array(packed, node.input[1] + "_zp"))
        new.input.append(tensors[-1].name)
    return new, tensors


def replace_weight_matmuls(proto: onnx.ModelProto, builders: Mapping[str, Callable], base_dir: str | os.PathLike
                           ) -> None:
    """Replace weight MatMuls of ``proto`` in place by the nodes their builders return.

    Args:
        builders: ``{MatMul node name: build}``; ``build(node, weight, load)`` gets the node, its
            weight initializer (2-D float [K, N]) and a ``load()`` that reads that weight as float32
            [K, N] from ``base_dir``, and returns ``(new node, new initializers)``
            (:func:`matmul_nbits_node`, :func:`qwen_onnx.quantize.blockwise.blockwise_int8_node`).

    A float weight no other node reads is removed; the ``com.microsoft`` opset is added, and the block sums
    that nodes kept on their source grid read (:func:`qwen_onnx.quantize.source_grid.insert_block_sums`).
    """
    graph = proto.graph
    initializers = {t.name: t for t in graph.initializer}
    readers = collections.Counter(i for n in graph.node for i in n.input)
    nodes, dropped = [], set()
    for node in graph.node:
        build = builders.get(node.name)
        if build is None:
            nodes.append(node)
            continue
        tensor = initializers[node.input[1]]
        new, tensors = build(node, tensor, lambda t=tensor: onnx.numpy_helper.to_array(
            t, base_dir=str(base_dir)).astype(np.float32))
        graph.initializer.extend(tensors)
        nodes.append(new)
        readers[tensor.name] -= 1
        if readers[tensor.name] == 0:
            dropped.add(tensor.name)
    del graph.node[:]
    graph.node.extend(nodes)
    kept = [t for t in graph.initializer if t.name not in dropped]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    if not any(o.domain == "com.microsoft" for o in proto.opset_import):
        proto.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    insert_block_sums(proto)
