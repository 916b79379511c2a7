"""The ``fp16`` variant: onnxruntime's float16 conversion of the fp32 export, float32 at its edges.

Conversion: ``onnxruntime.transformers.float16.convert_float_to_float16`` (the converter behind
``OnnxModel.convert_float_to_float16`` and onnxconverter-common's ``float16`` module, which ORT
vendors; https://onnxruntime.ai/docs/performance/model-optimizations/float16.html). Every float
initializer and every float tensor between non-blocked nodes becomes float16; weights are clamped to
float16's range (``min_positive_val`` 5.96e-8, ``max_finite_val`` 65504); ``Cast`` nodes are put
where a blocked node (kept float32) meets a float16 one.

``keep_io_types=True``: the graph's inputs and outputs stay float32, the KV cache included
(``past_key_values.{i}.key/value`` float32 [batch_size, kv_heads, past_sequence_length, head_dim]
in, ``logits`` float32 [batch_size, sequence_length, vocab] and ``present.*`` out), so the folder
drops into :class:`qwen_onnx.run.runtime.OnnxCausalLM`, the accuracy and latency stages and
``ORTModelForCausalLM`` unchanged; casts at the edges cost two Casts per cache tensor per step.

Op block list (:func:`op_block_list`): onnxruntime's ``DEFAULT_OP_BLOCK_LIST`` plus the ops chosen
by measuring on Qwen2.5-Coder-0.5B (docs/fp16.md): the RMSNorm's ``Pow`` and ``ReduceMean``
(float16 squares of Qwen's large hidden activations overflow 65504) and ``Softmax``. The rest of
each RMSNorm's variance path, ``Add`` (epsilon), ``Sqrt`` and ``Div``/``Reciprocal`` up to the
product with the hidden state, stays float32 too (:func:`variance_nodes`, blocked by name): the
converter would otherwise cast the float32 mean of squares back to float16 right after
``ReduceMean``, where a mean square above 65504 becomes inf and the normalized row 0.

Weights beyond float16's range are clamped to it by the converter; the stage counts them first
(:func:`out_of_range_weights`) and records the count in ``float16.json``.

Speed: float16 is meant for execution providers with float16 kernels (CUDA, DirectML, CoreML,
ARM64 CPUs with FP16). On x86 without AVX512-FP16 the op profile of its latency run with onnxruntime 1.32's
CPU provider lists MatMul at 84% of the time and Cast at 2.8% (Xeon, AVX-512) or 71% and 12% (EPYC, AVX2);
docs/fp16.md has the measured latency against fp32.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Sequence

import onnx

from qwen_onnx.convert.genai_config import write_genai_config
from qwen_onnx.settings.defaults import FLOAT16
from qwen_onnx.store.artifacts import MODEL_FILE, copy_side_files, model_path, write_json
from qwen_onnx.store.external import lazy_model, save_with_external_data
from qwen_onnx.store.hub_cache import reads_variant
from qwen_onnx.store.provenance import library_versions
from qwen_onnx.store.staging import staged_dir

log = logging.getLogger(__name__)

#: Op types kept float32 on top of onnxruntime's ``float16.DEFAULT_OP_BLOCK_LIST`` (docs/fp16.md,
#: for what each alternative measured); the config's ``float16.blocked_ops``.
EXTRA_BLOCKED_OPS: tuple[str, ...] = tuple(FLOAT16["blocked_ops"])


def op_block_list(extra: Sequence[str] = EXTRA_BLOCKED_OPS) -> list[str]:
    """onnxruntime's default float16 op block list followed by ``extra`` (duplicates dropped)."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST

    return list(dict.fromkeys([*DEFAULT_OP_BLOCK_LIST, *extra]))


#: Ops of an RMSNorm's variance path after ``ReduceMean``: ``Add`` (epsilon), ``Sqrt``, and ``Div``
#: (``1 / sqrt``) or ``Reciprocal``: torch's ``rsqrt`` as exported.
VARIANCE_OPS = ("Add", "Sqrt", "Div", "Reciprocal")


def variance_nodes(graph: onnx.GraphProto) -> list[str]:
    """Names of the nodes between each ``Pow`` -> ``ReduceMean`` (an RMSNorm's mean of squares) and
    the product with the hidden state: each a :data:`VARIANCE_OPS` node, the only consumer of the
    one before it."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    producers = {o: n for n in graph.node for o in n.output}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    names = []
    for node in graph.node:
        if node.op_type != "ReduceMean" or getattr(producers.get(node.input[0]), "op_type", None) != "Pow":
            continue
        current = node
        while True:
            following = consumers.get(current.output[0], [])
            if len(following) != 1 or following[0].op_type not in VARIANCE_OPS:
                break
            current = following[0]
            names.append(current.name)
    return names


def out_of_range_weights(graph: onnx.GraphProto, base_dir: str | os.PathLike) -> dict[str, int]:
    """Float32 initializer values that float16 cannot hold, per tensor: magnitudes above 65504
    (clamped to it by the converter's ``max_finite_val``). Infinities and NaN count too.

    Returns:
        ``{initializer name: values out of range}``, only tensors with any.
    """
    import numpy as np
    from onnx import numpy_helper

    counts = {}
    for tensor in graph.initializer:
        if tensor.data_type != onnx.TensorProto.FLOAT:
            continue
        values = numpy_helper.to_array(tensor, base_dir=str(base_dir))
        n = int(np.count_nonzero(~(np.abs(values) <= 65504.0)))
        if n:
            counts[tensor.name] = n
    return counts


def _infer_types(proto: onnx.ModelProto) -> None:
    """Add the element type of every intermediate tensor to ``proto.graph.value_info`` (symbolic
    shape inference of onnxruntime, run on the graph without its weights; shapes dropped, as
    ``OnnxModel.convert_float_to_float16`` does, since the converter needs only types)."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    inferred = SymbolicShapeInference.infer_shapes(proto, 2**31 - 1, True, False, 0)
    known = {vi.name for vi in proto.graph.value_info}
    for vi in inferred.graph.value_info:
        if vi.name and vi.name not in known and vi.type.tensor_type.elem_type != onnx.TensorProto.UNDEFINED:
            copy = onnx.ValueInfoProto()
            copy.CopyFrom(vi)
            copy.type.tensor_type.ClearField("shape")
            proto.graph.value_info.append(copy)


@reads_variant("input_dir")
def convert_float16_variant(
    input_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    blocked_ops: Sequence[str] = EXTRA_BLOCKED_OPS,
    blocked_nodes: Sequence[str] = (),
) -> dict:
    """Write the float16 version of a float32 variant folder, float32 inputs and outputs.

    Args:
        input_dir: float32 variant folder (the workflow uses ``fp32``).
        output_dir: folder to create with ``model.onnx`` + ``model.onnx_data`` and side files.
        blocked_ops: op types kept float32, added to onnxruntime's ``DEFAULT_OP_BLOCK_LIST``.
        blocked_nodes: node names kept float32.

    Returns:
        Provenance written to ``output_dir/float16.json``: the full op block list, the blocked
        nodes, the RMSNorm variance nodes kept float32 (:func:`variance_nodes`), the weight values
        clamped to 65504 per tensor (:func:`out_of_range_weights`), bytes of float16 and float32
        initializers, seconds, versions.

    Raises:
        ArtifactError: the input model or its external data is missing.
        IntegrityError: a file of ``input_dir`` differs from its manifest.
    """
    from onnx.external_data_helper import load_external_data_for_model
    from onnxruntime.transformers.float16 import convert_float_to_float16
    from onnxruntime.transformers.onnx_model import OnnxModel

    source = model_path(input_dir)
    started = time.time()
    blocked = op_block_list(blocked_ops)
    # types from the graph alone (onnx's own inference refuses protos past 2 GiB); inside lazy_model the
    # working directory is the folder, where symbolic inference reads the few constants it evaluates
    with lazy_model(source.parent) as (proto, _):
        _infer_types(proto)
    load_external_data_for_model(proto, str(source.parent.resolve()))  # fp32 weights in memory: 4 bytes/parameter
    clamped = out_of_range_weights(proto.graph, source.parent)
    if clamped:
        log.warning("fp16: %d weight values in %d tensors exceed float16's 65504 and are clamped to it (first: %s)",
                    sum(clamped.values()), len(clamped), next(iter(clamped)))
    variance = variance_nodes(proto.graph)
    node_blocks = list(dict.fromkeys([*blocked_nodes, *variance]))
    proto = convert_float_to_float16(proto, keep_io_types=True, disable_shape_infer=True,
                                     op_block_list=blocked, node_block_list=node_blocks)
    model = OnnxModel(proto)
    model.remove_cascaded_cast_nodes()  # Cast(fp16) -> Cast(fp32) pairs left at block boundaries
    model.remove_useless_cast_nodes()
    proto = model.model
    initializer_bytes = {"float16": 0, "float32": 0}
    for tensor in proto.graph.initializer:
        kind = {onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.FLOAT: "float32"}.get(tensor.data_type)
        if kind:
            initializer_bytes[kind] += len(tensor.raw_data) or 0
    with staged_dir(output_dir) as stage:
        save_with_external_data(proto, stage / MODEL_FILE)
        del proto, model
        model_path(stage)
        copy_side_files(input_dir, stage)
        write_genai_config(stage)  # onnxruntime-genai runs the folder
        info = {
            "gate_kind": "float16",
            "conversion": "onnxruntime.transformers.float16.convert_float_to_float16",
            "keep_io_types": True,
            "op_block_list": blocked,
            "extra_blocked_ops": list(blocked_ops),
            "node_block_list": list(blocked_nodes),
            "variance_nodes_float32": len(variance),
            "clamped_weights": {"values": sum(clamped.values()), "tensors": clamped},
            "initializer_bytes": initializer_bytes,
            "seconds": round(time.time() - started, 1),
            "library_versions": library_versions(),
        }
        write_json(stage / "float16.json", info)
    log.info("fp16: %s -> %s, %.1f MB float16 weights, %.1f s", input_dir, output_dir,
             initializer_bytes["float16"] / 1e6, info["seconds"])
    return info


def float16_nodes(folder: str | os.PathLike) -> dict[str, int]:
    """Nodes of ``folder/model.onnx`` whose first output is float16, float32, or neither (``other``),
    read from the graph's value infos (without loading weights); ``Cast`` counts apart."""
    proto = onnx.load(str(Path(folder) / MODEL_FILE), load_external_data=False)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in (*proto.graph.value_info, *proto.graph.output)}
    counts = {"float16": 0, "float32": 0, "other": 0, "Cast": 0}
    for node in proto.graph.node:
        if node.op_type == "Cast":
            counts["Cast"] += 1
            continue
        dtype = types.get(node.output[0]) if node.output else None
        counts["float16" if dtype == onnx.TensorProto.FLOAT16 else "float32" if dtype == onnx.TensorProto.FLOAT
               else "other"] += 1
    return counts
