"""Graph edits on onnxruntime-genai's GroupQueryAttention graph that make it exact for every Qwen config:
left-padded rows, each layer's own sliding window, and the rotary caches of a static ``rope_scaling``;
and the ``position_ids`` input that optimum's ``ORTModelForCausalLM`` expects, read by the kernel's rotary.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qwen_onnx.errors import ArtifactError
from qwen_onnx.settings.qwen_config import context_length, rope_type, rotary_caches

log = logging.getLogger(__name__)


#: Additive bias on the attention scores of padded key positions. Finite (not -inf) so that a padding
#: query row, whose keys are all padding, softmaxes to a uniform row instead of NaN; large enough
#: that exp(bias) underflows to exactly 0 in float32 next to any real score.
# GroupQueryAttention input slots (com.microsoft contrib op spec, onnxruntime ContribOperators.md)
_GQA_SEQLENS_K, _GQA_TOTAL_SEQUENCE, _GQA_POSITION_IDS, _GQA_ATTENTION_BIAS = 5, 6, 9, 10
PAD_BIAS = -1.0e9
#: bool [batch]: the row's first ``attention_mask`` column is padding (written by :func:`left_padding_support`).
LEFT_ROWS = "/qwen_onnx/left_padding/left"


def _remove_dead_nodes(graph: onnx.GraphProto) -> int:
    """Drop nodes none of whose outputs is read; returns how many were dropped."""
    dropped = 0
    while True:
        used = {name for n in graph.node for name in n.input} | {o.name for o in graph.output}
        dead = [n for n in graph.node if not any(o in used for o in n.output if o)]
        if not dead:
            return dropped
        for n in dead:
            graph.node.remove(n)
        dropped += len(dead)


def left_padding_support(model: onnx.ModelProto) -> int:
    """Make the builder's ``GroupQueryAttention`` graph exact for left-padded batches as well as
    right-padded ones (onnxruntime-genai's), in place.

    For each row whose first ``attention_mask`` column is 0 (left padding), every attention node's
    ``seqlens_k`` (the builder's ``ReduceSum(attention_mask) - 1``) becomes ``total_sequence_length
    - 1``, int32 [batch], and its ``attention_bias`` float [batch, 1, sequence, total_sequence] row
    ``(attention_mask - 1) * 1e9`` (0 for real tokens, :data:`PAD_BIAS` for padding). Every other
    row (no padding, or right padding: onnxruntime-genai writes each new token at ``seqlens_k``, over
    the padding) keeps the builder's ``seqlens_k`` and a zero bias. For a batch without padding both
    inputs are what the builder's graph computes.

    Returns:
        The number of attention nodes rewritten.

    Raises:
        ArtifactError: the graph has no ``input_ids`` or ``attention_mask`` input, or an attention node already has
            an ``attention_bias`` or no ``total_sequence_length``.
    """
    graph = model.graph
    names = {i.name for i in graph.input}
    if not {"attention_mask", "input_ids"} <= names:
        raise ArtifactError(
            f"left padding support needs input_ids and attention_mask graph inputs, got {sorted(names)}"
        )
    attention = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    if not attention:
        return 0
    total = attention[0].input[_GQA_TOTAL_SEQUENCE]
    native = attention[0].input[_GQA_SEQLENS_K]
    for n in attention:
        if len(n.input) > _GQA_ATTENTION_BIAS and n.input[_GQA_ATTENTION_BIAS]:
            raise ArtifactError(f"{n.name} already has an attention_bias input")
        if n.input[_GQA_TOTAL_SEQUENCE] != total or not total:
            raise ArtifactError(f"{n.name}: expected one shared total_sequence_length input, got {n.input}")
        if n.input[_GQA_SEQLENS_K] != native or not native:
            raise ArtifactError(f"{n.name}: expected one shared seqlens_k input, got {n.input}")
    past = next((i for i in graph.input if i.name.startswith("past_key_values.")), None)
    bias_type = past.type.tensor_type.elem_type if past is not None else TensorProto.FLOAT
    bias_dtype = helper.tensor_dtype_to_np_dtype(bias_type)
    prefix = "/qwen_onnx/left_padding"
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array([0], dtype=np.int64), f"{prefix}/zero_1d"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), f"{prefix}/one_1d"),
            numpy_helper.from_array(np.array([1, 2], dtype=np.int64), f"{prefix}/axes_1_2"),
            numpy_helper.from_array(np.array(1, dtype=np.int32), f"{prefix}/one_i32"),
            numpy_helper.from_array(np.array(1, dtype=bias_dtype), f"{prefix}/one"),
            numpy_helper.from_array(np.array(-PAD_BIAS, dtype=bias_dtype), f"{prefix}/pad_bias"),
            numpy_helper.from_array(np.array(0, dtype=np.int64), f"{prefix}/zero_i64"),
            numpy_helper.from_array(np.array(0, dtype=np.int64), f"{prefix}/zero"),
        ]
    )
    seqlens, bias = f"{prefix}/seqlens_k", f"{prefix}/attention_bias"
    nodes = [
        # batch: Shape(attention_mask)[0:1], int64 [1]
        helper.make_node("Shape", ["attention_mask"], [f"{prefix}/mask_shape"], name=f"{prefix}/Shape"),
        helper.make_node(
            "Gather",
            [f"{prefix}/mask_shape", f"{prefix}/zero_1d"],
            [f"{prefix}/batch"],
            name=f"{prefix}/Gather",
            axis=0,
        ),
        # left: bool [batch], the row's first column is padding
        helper.make_node("Gather", ["attention_mask", f"{prefix}/zero_i64"], [f"{prefix}/first_column"],
                         name=f"{prefix}/Gather_first", axis=1),
        helper.make_node("Equal", [f"{prefix}/first_column", f"{prefix}/zero"], [LEFT_ROWS],
                         name=f"{prefix}/Equal_left"),
        # seqlens_k = total_sequence_length - 1 on left-padded rows, the builder's elsewhere: int32 [batch]
        helper.make_node("Sub", [total, f"{prefix}/one_i32"], [f"{prefix}/total_minus_1"], name=f"{prefix}/Sub_total"),
        helper.make_node("Expand", [f"{prefix}/total_minus_1", f"{prefix}/batch"], [f"{prefix}/seqlens_left"],
                         name=f"{prefix}/Expand"),
        helper.make_node("Where", [LEFT_ROWS, f"{prefix}/seqlens_left", native], [seqlens],
                         name=f"{prefix}/Where_seqlens"),
        # attention_bias = (mask - 1) * 1e9 on left-padded rows, 0 elsewhere: [batch, total] ->
        # [batch, 1, 1, total] -> [batch, 1, sequence, total] (the kernel wants the sequence axis in full)
        helper.make_node("Cast", ["attention_mask"], [f"{prefix}/mask_float"], name=f"{prefix}/Cast", to=bias_type),
        helper.make_node(
            "Sub", [f"{prefix}/mask_float", f"{prefix}/one"], [f"{prefix}/mask_minus_1"], name=f"{prefix}/Sub_mask"
        ),
        helper.make_node(
            "Mul", [f"{prefix}/mask_minus_1", f"{prefix}/pad_bias"], [f"{prefix}/bias_all"], name=f"{prefix}/Mul"
        ),
        helper.make_node("Unsqueeze", [LEFT_ROWS, f"{prefix}/one_1d"], [f"{prefix}/left_2d"],
                         name=f"{prefix}/Unsqueeze_left"),
        helper.make_node("Cast", [f"{prefix}/left_2d"], [f"{prefix}/left_float"], name=f"{prefix}/Cast_left",
                         to=bias_type),
        helper.make_node(
            "Mul", [f"{prefix}/bias_all", f"{prefix}/left_float"], [f"{prefix}/bias_2d"], name=f"{prefix}/Mul_left"
        ),
        helper.make_node(
            "Unsqueeze", [f"{prefix}/bias_2d", f"{prefix}/axes_1_2"], [f"{prefix}/bias_4d"], name=f"{prefix}/Unsqueeze"
        ),
        helper.make_node("Shape", ["input_ids"], [f"{prefix}/ids_shape"], name=f"{prefix}/Shape_ids"),
        helper.make_node(
            "Gather",
            [f"{prefix}/ids_shape", f"{prefix}/one_1d"],
            [f"{prefix}/sequence"],
            name=f"{prefix}/Gather_seq",
            axis=0,
        ),
        helper.make_node(
            "Concat",
            [f"{prefix}/one_1d", f"{prefix}/one_1d", f"{prefix}/sequence", f"{prefix}/one_1d"],
            [f"{prefix}/bias_shape"],
            name=f"{prefix}/Concat",
            axis=0,
        ),
        helper.make_node("Expand", [f"{prefix}/bias_4d", f"{prefix}/bias_shape"], [bias], name=f"{prefix}/Expand_bias"),
    ]
    _insert_and_feed(graph, attention, nodes, {_GQA_SEQLENS_K: seqlens, _GQA_ATTENTION_BIAS: bias})
    dropped = _remove_dead_nodes(graph)
    log.info(
        "left padding: %d attention nodes take seqlens_k = total - 1 and attention_bias on left-padded rows; "
        "%d nodes dropped",
        len(attention),
        dropped,
    )
    return len(attention)


def position_ids_input(model: onnx.ModelProto) -> int:
    """Give the builder's ``GroupQueryAttention`` graph a ``position_ids`` input, int64 [batch_size,
    sequence_length], that every attention node's rotary reads (the kernel's ``position_ids`` slot), in place.

    The builder drops the input (the kernel derives positions from ``seqlens_k``), and optimum's
    ``ORTModelForCausalLM`` calls a graph without it legacy. The callers' convention is transformers':
    ``cumsum(attention_mask) - 1`` over the new tokens, padding at 0 or 1. The kernel takes them as
    they are for every row without left padding; in the first prompt (no past) it rotates row ``b``'s
    token ``s`` to ``position_ids[0, 0] + s`` (only the first element is read, ContribOperators.md),
    which gives the same logits for any offset since rotary scores depend only on position differences.
    When :func:`left_padding_support` ran (its :data:`LEFT_ROWS` in the graph), a left-padded row's
    keys sit at their column (past + s, pads included): its real tokens get ``position_ids`` plus the
    row's pad count (``total_sequence_length - ReduceSum(attention_mask)``) and its padding tokens their
    column, so decode steps rotate where the prompt did. For the usual ``position_ids`` the kernel
    then sees exactly the positions it derives without them, and the logits are those of the graph
    without the input (bit-identical on onnxruntime 1.32's CPU kernel).

    Returns:
        The number of attention nodes that read ``position_ids``.

    Raises:
        ArtifactError: the graph already has a ``position_ids`` input, no ``attention_mask`` input, or an
            attention node already reads positions.
    """
    graph = model.graph
    names = {i.name for i in graph.input}
    if "position_ids" in names or "attention_mask" not in names:
        raise ArtifactError(f"position_ids support needs attention_mask and no position_ids input, got {sorted(names)}")
    attention = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    if not attention:
        return 0
    for n in attention:
        if len(n.input) > _GQA_POSITION_IDS and n.input[_GQA_POSITION_IDS]:
            raise ArtifactError(f"{n.name} already reads position_ids from {n.input[_GQA_POSITION_IDS]}")
    position = helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch_size", "sequence_length"])
    graph.input.insert([i.name for i in graph.input].index("attention_mask") + 1, position)
    positions, nodes = "position_ids", []
    if any(LEFT_ROWS in n.output for n in graph.node):
        prefix = "/qwen_onnx/position_ids"
        graph.initializer.extend(
            [
                numpy_helper.from_array(np.array([0], dtype=np.int64), f"{prefix}/axis_0"),
                numpy_helper.from_array(np.array([1], dtype=np.int64), f"{prefix}/axis_1"),
                numpy_helper.from_array(np.array(1, dtype=np.int64), f"{prefix}/step"),
            ]
        )
        positions = f"{prefix}/rotary_positions"

        def node(op: str, inputs: list[str], output: str, **attrs) -> str:
            nodes.append(helper.make_node(op, inputs, [f"{prefix}/{output}"], name=f"{prefix}/{output}/{op}", **attrs))
            return f"{prefix}/{output}"

        # total, sequence: int64 [1]; columns: int64 [1, sequence], past .. total - 1
        total = node("Gather", [node("Shape", ["attention_mask"], "mask_shape"), f"{prefix}/axis_1"], "total", axis=0)
        sequence = node("Gather", [node("Shape", ["position_ids"], "ids_shape"), f"{prefix}/axis_1"], "sequence", axis=0)
        past = node("Sub", [total, sequence], "past")
        scalars = [node("Squeeze", [past, f"{prefix}/axis_0"], "past_scalar"),
                   node("Squeeze", [total, f"{prefix}/axis_0"], "total_scalar")]
        columns = node("Unsqueeze", [node("Range", [*scalars, f"{prefix}/step"], "range"), f"{prefix}/axis_0"], "columns")
        # shift: int64 [batch, 1], the pad count on left-padded rows, 0 elsewhere
        real_count = node("ReduceSum", ["attention_mask", f"{prefix}/axis_1"], "real_count", keepdims=1)
        left = node("Cast", [node("Unsqueeze", [LEFT_ROWS, f"{prefix}/axis_1"], "left_2d")], "left_i64",
                    to=TensorProto.INT64)
        shift = node("Mul", [node("Sub", [total, real_count], "pads"), left], "shift")
        # the new tokens' mask: bool [batch, sequence]
        real = node("Cast", [node("Slice", ["attention_mask", past, total, f"{prefix}/axis_1"], "new_mask")], "real",
                    to=TensorProto.BOOL)
        shifted = node("Add", ["position_ids", shift], "shifted")
        nodes.append(helper.make_node("Where", [real, shifted, columns], [positions], name=f"{prefix}/Where"))
    _insert_and_feed(graph, attention, nodes, {_GQA_POSITION_IDS: positions})
    log.info("position_ids: %d attention nodes read them (%d nodes added)", len(attention), len(nodes))
    return len(attention)


def _insert_and_feed(graph: onnx.GraphProto, attention: list, nodes: list, slots: dict[int, str]) -> None:
    """Insert ``nodes`` before the first attention node (topological order kept) and set each attention node's
    inputs at the ``slots`` (``{input index: tensor name}``), padding its optional inputs with empty names."""
    first = list(graph.node).index(attention[0])
    for offset, node in enumerate(nodes):
        graph.node.insert(first + offset, node)
    for n in attention:
        inputs = list(n.input) + [""] * max(0, max(slots) + 1 - len(n.input))
        for index, name in slots.items():
            inputs[index] = name
        del n.input[:]
        n.input.extend(inputs)


def set_layer_windows(model: onnx.ModelProto, windows: list[int]) -> list[int]:
    """Give each layer's ``GroupQueryAttention`` node its own ``local_window_size``, in place.

    onnxruntime-genai's builder (0.13) puts ``config.sliding_window`` on every layer, ignoring
    ``use_sliding_window``, ``max_window_layers`` and ``layer_types`` (onnxruntime-genai#2490): a Qwen2
    with only its later layers windowed then windows all of them.

    Args:
        windows: :func:`qwen_onnx.settings.qwen_config.layer_windows`, one per layer.

    Returns:
        The windows set, in layer order.

    Raises:
        ArtifactError: the graph's attention nodes are not one per layer.
    """
    attention = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    if len(attention) != len(windows):
        raise ArtifactError(f"{len(attention)} GroupQueryAttention nodes for {len(windows)} layers")
    for node, window in zip(attention, windows):
        attrs = [a for a in node.attribute if a.name != "local_window_size"]
        del node.attribute[:]
        node.attribute.extend([*attrs, helper.make_attribute("local_window_size", window)])
    return windows


def set_rotary_caches(model: onnx.ModelProto, config: dict, data_file: Path) -> int | None:
    """Replace the builder's ``cos_cache`` and ``sin_cache`` by transformers' own for a config with a
    static ``rope_scaling``, over :func:`~qwen_onnx.settings.qwen_config.context_length` positions, in place.

    The builder (0.13) sizes the caches to ``max_position_embeddings``, so a scaled model failed past
    its original context (``cos_cache dimension 0 shall not be less than total_sequence_length``).
    The new tensors are appended to ``data_file``, the graph's external data.

    Returns:
        The positions the caches now cover, or None (no ``rope_scaling``: the builder's caches kept).

    Raises:
        ArtifactError: the graph has no ``cos_cache``/``sin_cache`` of the expected width.
    """
    if rope_type(config) == "default":
        return None
    length = context_length(config)
    cos, sin = rotary_caches(config, length)
    tensors = {t.name: t for t in model.graph.initializer if t.name in ("cos_cache", "sin_cache")}
    if set(tensors) != {"cos_cache", "sin_cache"} or list(tensors["cos_cache"].dims)[1:] != [cos.shape[1]]:
        raise ArtifactError(f"the builder graph has no cos_cache/sin_cache [positions, {cos.shape[1]}] to replace")
    with open(data_file, "ab") as out:
        for name, values in (("cos_cache", cos), ("sin_cache", sin)):
            offset = out.tell()
            out.write(values.tobytes())
            tensor = tensors[name]
            tensor.ClearField("raw_data")
            del tensor.dims[:]
            tensor.dims.extend(values.shape)
            tensor.data_type = TensorProto.FLOAT
            del tensor.external_data[:]
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (("location", data_file.name), ("offset", str(offset)), ("length", str(values.nbytes))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
    return length
