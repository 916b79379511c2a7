"""The precision a GGUF source stored each weight in, and the weight MatMuls that keeps above 4 bits.

A llama.cpp k-quant mix does not store every tensor at its nominal width: Q4_K_M keeps about
half of the ``attn_v`` and ``ffn_down`` tensors at Q6_K (Q8_0 where the row length is not a
multiple of 256) and the output matrix at Q6_K or Q8_0, the layers picked by llama.cpp's
``llama_tensor_get_type`` (``use_more_bits``). On the embedded Qwen2.5-Coder-0.5B Q4_K_M that is
12 ``attn_v`` at Q8_0, 12 ``ffn_down`` at Q6_K and ``output.weight`` at Q8_0, the other matrices at
Q5_0 and Q4_K. Re-quantizing those tensors to 4 bits throws away precision the source kept, so the
``int4`` stage can keep every MatMul whose source weight had at least ``min_bits`` bits per weight
at 8 bits (:func:`source_precise_nodes`).

Bits per weight are gguf-py's ``GGML_QUANT_SIZES`` (block size and bytes per block of each
``GGMLQuantizationType``): Q8_0 8.5, Q6_K 6.56, Q5_0 5.5, Q4_K 4.5. Names map from Hugging Face to
GGUF with gguf-py's ``get_tensor_name_map`` (the table transformers' GGUF loader uses).
"""

from __future__ import annotations

from typing import Any, Mapping

import onnx

from qwen_onnx.quantize.matmuls import node_role, weight_matmuls
from qwen_onnx.source.gguf_file import FLOAT_TYPES, bits_per_weight

#: Hugging Face parameter names behind each weight-MatMul role of layer ``{i}`` (a fused graph's
#: packed ``qkv_proj`` reads three).
ROLE_PARAMETERS = {
    "qkv_proj": ("model.layers.{i}.self_attn.q_proj.weight", "model.layers.{i}.self_attn.k_proj.weight",
                 "model.layers.{i}.self_attn.v_proj.weight"),
    **{r: (f"model.layers.{{i}}.self_attn.{r}.weight",) for r in ("q_proj", "k_proj", "v_proj", "o_proj")},
    **{r: (f"model.layers.{{i}}.mlp.{r}.weight",) for r in ("gate_proj", "up_proj", "down_proj")},
    "lm_head": ("lm_head.weight",),
}


def source_precise_nodes(graph: onnx.GraphProto, types: Mapping[str, str], min_bits: float) -> list[dict[str, Any]]:
    """The weight MatMuls of ``graph`` whose source weights held at least ``min_bits`` bits per weight.

    A packed MatMul (the fused graph's ``qkv_proj``) counts when any of its parts does: its
    ``v_proj`` at Q8_0 makes the whole packed product 8-bit (on the 0.5B, [896, 1152], 1.0 M weights
    a layer). MatMuls whose parameters have no entry in ``types`` (a float source, an unknown node
    name) and float tensors (F32, F16, BF16: not a width a quantization mix chose) are never picked.

    Args:
        graph: an ONNX graph (weights need not be loaded).
        types: :func:`gguf_weight_types` of the source.
        min_bits: the threshold in bits per weight (6 picks Q6_K and Q8_0, not Q5_0).

    Returns:
        Rows ``{name, layer, role, source_types, bits_per_weight}`` in graph order.
    """
    rows = []
    for node, _ in weight_matmuls(graph):
        layer, role = node_role(node.name)
        if role not in ROLE_PARAMETERS or (layer is None) != (role == "lm_head"):
            continue
        params = [p.format(i=layer) for p in ROLE_PARAMETERS[role]]
        found = {p: types[p] for p in params if types.get(p) not in (None, *FLOAT_TYPES)}
        if not found:
            continue
        bits = max(bits_per_weight(t) for t in found.values())
        if bits >= min_bits:
            rows.append({"name": node.name, "layer": layer, "role": role,
                         "source_types": sorted(set(found.values())), "bits_per_weight": round(bits, 2)})
    return rows
