"""Graph queries on MatMuls: which carry a constant weight (the ones quantization converts), which
multiply two activations (attention products, kept float), and what role a weight MatMul plays.

Nodes are found by what they compute (a MatMul whose second input is a 2-D float initializer), not by
exporter names, so the queries work on optimum's export, the pre-processed graph and the fused
graphs alike; only :func:`node_role` reads names, for reports.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from typing import Iterable, Mapping, Sequence

import onnx

from qwen_onnx.errors import QwenOnnxError

LAYER_PATTERN = re.compile(r"layers\.(\d+)\b")
ROLES = ("qkv_proj", "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")


def check_roles(key: str, roles: Iterable[str] | None, allowed: Sequence[str] = ROLES, fix: str = "") -> None:
    """Raises QwenOnnxError naming the items of setting ``key`` that are not among ``allowed`` MatMul roles
    (:data:`ROLES` by default), the roles to give, and ``fix`` (more of the fix) after them."""
    unknown = [r for r in roles or () if r not in allowed]
    if unknown:
        raise QwenOnnxError(f"{key} names {', '.join(unknown)}; give roles among {', '.join(allowed)}{fix}")


def graph_maps(graph: onnx.GraphProto) -> tuple[dict[str, onnx.TensorProto], dict[str, onnx.NodeProto],
                                                 dict[str, list[onnx.NodeProto]]]:
    """``(initializers, producers, consumers)`` of ``graph``: initializer by name, the node that
    writes each tensor, and the nodes that read each tensor (in graph order)."""
    initializers = {t.name: t for t in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    return initializers, producers, consumers


def weight_matmuls(graph: onnx.GraphProto) -> list[tuple[onnx.NodeProto, onnx.TensorProto]]:
    """MatMul nodes whose second input is a 2-D float initializer, with that initializer, in graph order."""
    initializers = {t.name: t for t in graph.initializer}
    found = []
    for node in graph.node:
        if node.op_type != "MatMul" or len(node.input) < 2:
            continue
        weight = initializers.get(node.input[1])
        if weight is not None and len(weight.dims) == 2 and weight.data_type == onnx.TensorProto.FLOAT:
            found.append((node, weight))
    return found


def node_role(name: str) -> tuple[int | None, str]:
    """``(layer, role)`` from an exporter node name such as ``/model/layers.3/mlp/down_proj/MatMul``.

    ``role`` is one of qkv_proj (the fused graph's packed projection), q_proj, k_proj, v_proj,
    o_proj, gate_proj, up_proj, down_proj, lm_head, or ``other``; ``layer`` is None outside the decoder layers.
    """
    match = LAYER_PATTERN.search(name)
    layer = int(match.group(1)) if match else None
    role = next((r for r in ROLES if r in name), "other")
    return layer, role


def weight_matmul_names(path: str | os.PathLike) -> list[str]:
    """Names of the MatMul nodes whose second input is a 2-D float initializer (the weights)."""
    return [node.name for node, _ in weight_matmuls(onnx.load(str(path), load_external_data=False).graph)]


def activation_matmuls(path: str | os.PathLike) -> list[str]:
    """Names of MatMul nodes whose second input is not a constant weight.

    These are the attention score and context products (Q·Kᵀ, softmax·V) and the rotary
    embedding's frequency product. onnxruntime's ``MatMulConstBOnly`` option is honoured by its
    QOperator and dynamic quantizers but not by the QDQ quantizer (onnxruntime 1.32), so the static
    variant passes these names in ``nodes_to_exclude`` to keep them float.
    """
    graph = onnx.load(str(path), load_external_data=False).graph
    constants = {t.name for t in graph.initializer}
    constants |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    return [n.name for n in graph.node if n.op_type == "MatMul" and n.input[1] not in constants]


def precision_by_role(precision: Mapping[str, str]) -> dict[str, dict[str, int]]:
    """How many MatMuls of each layer kind (``q_proj``, ``down_proj``, ``lm_head`` ...) got each
    option: ``{role: {option key: count}}``, for the report's one line per layer kind."""
    out: dict[str, Counter] = {}
    for name, key in precision.items():
        role = node_role(name)[1]
        out.setdefault(role, Counter())[key] += 1
    return {role: dict(sorted(c.items())) for role, c in sorted(out.items())}
