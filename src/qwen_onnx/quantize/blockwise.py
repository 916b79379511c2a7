"""8-bit blockwise weight quantization of chosen MatMuls (MatMulNBits), shared by the INT8 and int4
variants for their sensitive MatMuls and by ``int8-dynamic``'s blockwise scheme."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import onnx

from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.store.external import ScratchFiles


def blockwise_int8(graph_only: Path, names: Sequence[str], block_size: int, scratch: ScratchFiles) -> Path:
    """Turn the MatMuls ``names`` of ``graph_only`` into MatMulNBits with 8-bit blockwise weights.

    Weights: INT8 symmetric, one scale per ``block_size`` rows of each output column;
    ``accuracy_level=4``: ONNX Runtime quantizes the activation to INT8 per token and block at run
    time and accumulates in integers (onnxruntime contrib op MatMulNBits,
    ``onnxruntime.quantization.matmul_nbits_quantizer``). Outliers then cost only their own block.

    Runs inside :func:`lazy_quantization`: weights are read one at a time from the model's folder,
    and the new INT8 weights go to a scratch data file there.

    Returns:
        The path of the new graph (``scratch / "blockwise.onnx"``).
    """
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    proto = onnx.load(str(graph_only), load_external_data=False)
    wanted = set(names)
    before = sum(n.op_type == "MatMulNBits" for n in proto.graph.node)
    others = [n.name for n in proto.graph.node if n.op_type == "MatMul" and n.name not in wanted]
    # nodes_to_include only adds to op_types_to_quantize; nodes_to_exclude is what restricts
    quantizer = MatMulNBitsQuantizer(
        proto, bits=8, block_size=block_size, is_symmetric=True, accuracy_level=4, nodes_to_exclude=others,
        op_types_to_quantize=("MatMul",),
    )
    # the quantizer logs one INFO line per MatMul it leaves alone (thousands on a real model)
    quiet = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = quiet.level
    quiet.setLevel(max(level, logging.WARNING))
    try:
        quantizer.process()
    finally:
        quiet.setLevel(level)
    converted = sum(n.op_type == "MatMulNBits" for n in quantizer.model.model.graph.node) - before
    if converted != len(names):
        raise QwenOnnxError(f"MatMulNBits converted {converted} of the {len(names)} MatMuls asked for")
    output = scratch / "blockwise.onnx"
    onnx.external_data_helper.convert_model_to_external_data(
        quantizer.model.model, all_tensors_to_one_file=True, location=(scratch / "blockwise.data").name,
        size_threshold=1024,
    )
    onnx.save_model(quantizer.model.model, str(output))
    return output


def blockwise_int8_weight(weight: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``weight`` in onnxruntime's symmetric 8-bit MatMulNBits blocks, by its own C++ kernel
    (``quantize_matmul_8bits``, what :func:`blockwise_int8`'s quantizer calls).

    Args:
        weight: float32 [K, N]; K is zero-padded to a multiple of ``block_size``.

    Returns:
        ``(packed, scales)``: uint8 [N, k_blocks, block_size] (value ``q + 128``; 0 past K), float32
        [N, k_blocks], ``k_blocks = ceil(K / block_size)``; the weight is ``(packed - 128) * scale``.
    """
    from onnxruntime.capi._pybind_state import quantize_matmul_8bits

    k, n = weight.shape
    k_blocks = (k - 1) // block_size + 1
    padded = np.zeros((k_blocks * block_size, n), dtype=np.float32)
    padded[:k] = weight
    packed = np.zeros((n, k_blocks, block_size), dtype=np.uint8)
    scales = np.zeros((n, k_blocks), dtype=np.float32)
    zero_point = np.zeros((n, (k_blocks + 1) // 2), dtype=np.uint8)  # unused when symmetric
    quantize_matmul_8bits(packed, padded, scales, zero_point, block_size, n, k, True)  # rows past K stay 0, as in onnxruntime
    return packed, scales


def cached_int8_weight(name: str, load: Callable[[], np.ndarray], block_size: int,
                       cache: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`blockwise_int8_weight` of MatMul ``name``'s weight, looked up in ``cache`` first under
    ``(name, 8, block_size, True)`` (value ``(packed, scales, None)``, the shape of
    :data:`qwen_onnx.quantize.kquant.BlockCache`); ``load()`` returns the float32 [K, N] weight on a miss."""
    key = (name, 8, block_size, True)
    if cache is not None and key in cache:
        return cache[key][:2]
    packed, scales = blockwise_int8_weight(load(), block_size)
    if cache is not None:
        cache[key] = (packed, scales, None)
    return packed, scales


def blockwise_int8_node(node: onnx.NodeProto, weight: onnx.TensorProto, load: Callable[[], np.ndarray],
                        block_size: int, cache: dict | None = None) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
    """The MatMulNBits node and initializers that :func:`blockwise_int8` makes of one MatMul (onnxruntime's
    ``DefaultWeightOnlyQuantizer``, QOperator format, symmetric, ``accuracy_level=4``), node for node
    and byte for byte, without a quantizer pass over the graph.

    Args:
        node: the MatMul; ``weight`` its second input, a 2-D float initializer [K, N].
        load: returns that weight as float32 [K, N]; called only when ``cache`` lacks it.
        cache: ``{(node name, 8, block_size, True): (packed, scales, None)}``, looked up and filled
            (the key and value shape of :data:`qwen_onnx.quantize.kquant.BlockCache`).
    """
    packed, scales = cached_int8_weight(node.name, load, block_size, cache)
    k, n = (int(d) for d in weight.dims)
    tensors = [onnx.numpy_helper.from_array(packed, weight.name + "_Q8"),
               onnx.numpy_helper.from_array(scales, weight.name + "_scales")]
    new = onnx.helper.make_node("MatMulNBits", [node.input[0], *(t.name for t in tensors)], [node.output[0]],
                                name=node.name + "_Q8" if node.name else "", domain="com.microsoft",
                                K=k, N=n, bits=8, block_size=block_size, accuracy_level=4)
    return new, tensors
