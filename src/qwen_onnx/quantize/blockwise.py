"""8-bit blockwise weight quantization of chosen MatMuls (MatMulNBits), shared by the INT8 and int4
variants for their sensitive MatMuls and by ``int8-dynamic``'s blockwise scheme."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

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
    converted = sum(n.op_type == "MatMulNBits" for n in quantizer.model.model.graph.node)
    if converted != len(names):
        raise QwenOnnxError(f"MatMulNBits converted {converted} of the {len(names)} MatMuls asked for")
    output = scratch / "blockwise.onnx"
    onnx.external_data_helper.convert_model_to_external_data(
        quantizer.model.model, all_tensors_to_one_file=True, location=(scratch / "blockwise.data").name,
        size_threshold=1024,
    )
    onnx.save_model(quantizer.model.model, str(output))
    return output
