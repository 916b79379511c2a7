"""Graph inspection that reads ``model.onnx`` without loading weight data (works past 2 GiB).

Initializer sizes come from their dims and dtype, so a 6 GB external data file is never read.
"""

from __future__ import annotations

import collections
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

from qwen_onnx.errors import ArtifactError
from qwen_onnx.measure.inspect_tflite import inspect_tflite, inspect_tflite_markdown
from qwen_onnx.quantize.matmuls import precision_by_role
from qwen_onnx.run.tflite import is_tflite_folder
from qwen_onnx.store.artifacts import (
    DATA_FILE,
    check_external_data,
    folder_bytes,
    require_readable,
)

#: Op types inserted by quantization (QDQ and QOperator forms).
QUANT_OPS = frozenset(
    {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "DynamicQuantizeMatMul",
     "QLinearMatMul", "MatMulIntegerToFloat", "QGemm", "MatMulNBits", "QAttention"}
)


def _dim(d: onnx.TensorShapeProto.Dimension) -> int | str:
    if d.HasField("dim_value"):
        return int(d.dim_value)
    return d.dim_param or "?"


def _value_info(v: onnx.ValueInfoProto) -> dict[str, Any]:
    tensor = v.type.tensor_type
    return {
        "name": v.name,
        "dtype": helper.tensor_dtype_to_np_dtype(tensor.elem_type).name if tensor.elem_type else "unknown",
        "shape": [_dim(d) for d in tensor.shape.dim],
    }


def initializer_bytes(tensor: onnx.TensorProto) -> int:
    """Bytes of an initializer's data computed from dims and dtype (data is not read)."""
    count = int(np.prod(tensor.dims)) if len(tensor.dims) else 1
    if tensor.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
        return (count + 1) // 2
    if tensor.data_type == onnx.TensorProto.STRING:
        return sum(len(s) for s in tensor.string_data)
    return count * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


def load_graph(path: str | os.PathLike) -> onnx.ModelProto:
    """Load an ONNX graph without its weights.

    Raises:
        ArtifactError: the file is missing, unreadable or not ONNX, or its external data file is
            missing or truncated (see :func:`qwen_onnx.store.artifacts.check_external_data`).
        IntegrityError: a file differs from the folder's manifest.
    """
    path = Path(path)
    require_readable(path)
    if path.is_dir():
        path = path / "model.onnx"
    if not path.is_file():
        raise ArtifactError(f"no ONNX file at {path}")
    check_external_data(path)
    return onnx.load(str(path), load_external_data=False)


def matmul_precision(graph: onnx.GraphProto) -> dict[str, dict[str, int]]:
    """The ``MatMulNBits`` nodes per layer kind and option: ``{role: {"bits/block": count}}``, counted by
    :func:`qwen_onnx.quantize.matmuls.precision_by_role` (roles from the node names: ``qkv_proj``, ...,
    ``lm_head``, ``other``); empty for a graph without ``MatMulNBits``."""
    options = {}
    for node in graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            options[node.name] = f"{attrs['bits']}/{attrs['block_size']}"
    return precision_by_role(options)


def inspect_model(path: str | os.PathLike) -> dict[str, Any]:
    """Summary of an ONNX model file.

    Returns:
        ``ir_version``, ``opsets`` (domain → version), ``inputs``/``outputs`` (name, dtype name,
        dims with symbolic names kept), ``nodes``, ``op_types`` (histogram, most common first),
        ``quant_ops`` (histogram of quantization ops), ``matmul_precision`` (:func:`matmul_precision`),
        ``initializers`` (count, bytes per dtype), ``bytes_on_disk`` (graph plus external data).

    Raises:
        ArtifactError: see :func:`load_graph`.
    """
    path = Path(path)
    require_readable(path)
    if path.is_dir():
        path = path / "model.onnx"
    proto = load_graph(path)
    graph = proto.graph
    ops = collections.Counter(n.op_type for n in graph.node)
    per_dtype: dict[str, int] = collections.Counter()
    for tensor in graph.initializer:
        per_dtype[helper.tensor_dtype_to_np_dtype(tensor.data_type).name] += initializer_bytes(tensor)
    largest = sorted(graph.initializer, key=initializer_bytes, reverse=True)[:5]
    return {
        "path": str(path),
        "ir_version": proto.ir_version,
        "opsets": {(o.domain or "ai.onnx"): o.version for o in proto.opset_import},
        "inputs": [_value_info(v) for v in graph.input],
        "outputs": [_value_info(v) for v in graph.output],
        "nodes": len(graph.node),
        "op_types": dict(ops.most_common()),
        "quant_ops": {k: v for k, v in ops.most_common() if k in QUANT_OPS},
        "matmul_precision": matmul_precision(graph),
        "first_nodes": [_node_info(n) for n in graph.node[:5]],
        "last_nodes": [_node_info(n) for n in graph.node[-5:]],
        "initializers": {
            "count": len(graph.initializer),
            "bytes": int(sum(per_dtype.values())),
            "bytes_per_dtype": dict(per_dtype),
            "largest": [_tensor_info(t) for t in largest],
        },
        "key_weights": key_weights(graph),
        "architecture": architecture(graph),
        "bytes_on_disk": folder_bytes(path.parent, (path.name, DATA_FILE)),
    }


def _node_info(node: onnx.NodeProto) -> dict[str, Any]:
    return {"name": node.name, "op_type": node.op_type, "domain": node.domain or "ai.onnx"}


def _tensor_info(tensor: onnx.TensorProto) -> dict[str, Any]:
    return {
        "name": tensor.name,
        "dtype": helper.tensor_dtype_to_np_dtype(tensor.data_type).name,
        "shape": [int(d) for d in tensor.dims],
        "bytes": initializer_bytes(tensor),
    }


#: Key weights of a Qwen decoder, by the node-name prefix that optimum's export gives them.
KEY_WEIGHTS = {
    "embed_tokens": "/model/embed_tokens/",
    "q_proj": "/model/layers.0/self_attn/q_proj/",
    "k_proj": "/model/layers.0/self_attn/k_proj/",
    "v_proj": "/model/layers.0/self_attn/v_proj/",
    "o_proj": "/model/layers.0/self_attn/o_proj/",
    "q_norm": "/model/layers.0/self_attn/q_norm/",
    "k_norm": "/model/layers.0/self_attn/k_norm/",
    "gate_proj": "/model/layers.0/mlp/gate_proj/",
    "up_proj": "/model/layers.0/mlp/up_proj/",
    "down_proj": "/model/layers.0/mlp/down_proj/",
    "input_layernorm": "/model/layers.0/input_layernorm/",
    "post_attention_layernorm": "/model/layers.0/post_attention_layernorm/",
    "final_norm": "/model/norm/",
    "lm_head": "/lm_head/",
}
#: The same weights under onnxruntime-genai's model builder names (the optimized variant), which
#: packs q/k/v into one ``qkv_proj`` where it can (Qwen2); tried when the optimum name is absent.
BUILDER_KEY_WEIGHTS = {
    **{key: prefix.replace("/self_attn/", "/attn/") for key, prefix in KEY_WEIGHTS.items()},
    "qkv_proj": "/model/layers.0/attn/qkv_proj/",
}
_WEIGHT_OPS = {"MatMul", "Gemm", "Gather", "GatherBlockQuantized", "MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
               "MatMulNBits", "Mul", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization",
               "LayerNormalization"}


def _weight_of(graph: onnx.GraphProto, prefix: str, producers: dict, initializers: dict) -> onnx.TensorProto | None:
    """The largest initializer feeding a weight-bearing node under ``prefix`` (through a
    DequantizeLinear for QDQ graphs, or the Identity of a tied table stored once); the layer's norm
    weight for norms."""
    best = None
    for node in graph.node:
        if not node.name.startswith(prefix) or node.op_type not in _WEIGHT_OPS:
            continue
        for name in node.input:
            tensor = initializers.get(name)
            if tensor is None and name in producers and producers[name].op_type in ("DequantizeLinear", "Identity"):
                tensor = initializers.get(producers[name].input[0])
            if tensor is not None and len(tensor.dims) >= 1 and (best is None or initializer_bytes(tensor) > initializer_bytes(best)):
                best = tensor
    return best


def key_weights(graph: onnx.GraphProto) -> dict[str, dict[str, Any]]:
    """Name, dtype, shape and bytes of the key weights (layer 0 for per-layer ones), found by node
    name; a weight the graph does not have (``q_norm`` before Qwen3) is left out. MatMul weights are
    stored [in_features, out_features]."""
    initializers = {t.name: t for t in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    found = {}
    for key, prefix in BUILDER_KEY_WEIGHTS.items():
        tensor = _weight_of(graph, KEY_WEIGHTS[key], producers, initializers) if key in KEY_WEIGHTS else None
        if tensor is None:
            tensor = _weight_of(graph, prefix, producers, initializers)
        if tensor is not None:
            found[key] = _tensor_info(tensor)
    return found


def _out_features(graph: onnx.GraphProto, weights: dict[str, dict[str, Any]], key: str) -> int | None:
    """Output features of a key weight MatMul: the weight's second dim ([in, out]), or, for
    MatMulNBits (weight packed as uint8 [N, blocks, blob bytes]), its ``N`` attribute
    (onnxruntime contrib op MatMulNBits)."""
    weight = weights.get(key)
    if weight and len(weight["shape"]) == 2:
        return weight["shape"][1]
    for node in graph.node:
        if node.op_type == "MatMulNBits" and node.name.startswith((KEY_WEIGHTS[key], BUILDER_KEY_WEIGHTS[key])):
            return next((int(a.i) for a in node.attribute if a.name == "N"), None)
    return None


#: Ops through which a weight reaches its consumer unchanged in content (a view, a cast, a dequantization).
_PASS_THROUGH = frozenset({"Transpose", "Identity", "Cast", "Reshape", "DequantizeLinear"})


def _source_initializer(graph: onnx.GraphProto, name: str, producers: dict, initializers: dict):
    """The initializer that ``name`` is computed from through :data:`_PASS_THROUGH` ops only, else None."""
    while name not in initializers:
        node = producers.get(name)
        if node is None or node.op_type not in _PASS_THROUGH:
            return None
        name = node.input[0]
    return initializers[name]


def _shared_table(graph: onnx.GraphProto):
    """The one initializer that both the token lookup (``Gather``/``GatherBlockQuantized`` of
    ``input_ids``) and the lm_head (the node producing ``logits``) read, else None."""
    initializers = {t.name: t for t in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    lookup = next((n for n in graph.node if n.op_type in ("Gather", "GatherBlockQuantized")
                   and len(n.input) > 1 and n.input[1] == "input_ids"), None)
    head = producers.get("logits")
    if lookup is None or head is None or len(head.input) < 2:
        return None
    table = _source_initializer(graph, lookup.input[0], producers, initializers)
    weight = _source_initializer(graph, head.input[1], producers, initializers)
    return table if table is not None and weight is not None and table.name == weight.name else None


def _quantized_embedding(graph: onnx.GraphProto) -> tuple[int, int, bool] | None:
    """``(vocab, hidden, shared)`` of a ``GatherBlockQuantized`` embedding (:mod:`qwen_onnx.quantize.embeddings`):
    from its own uint8 table [vocab, hidden × bits / 8], or, when it reads the lm_head's
    ``MatMulNBits`` weight through a Reshape (shared), from that node's ``K`` and ``N``."""
    node = next((n for n in graph.node if n.op_type == "GatherBlockQuantized"), None)
    if node is None:
        return None
    bits = next((int(a.i) for a in node.attribute if a.name == "bits"), 4)
    table = next((t for t in graph.initializer if t.name == node.input[0]), None)
    if table is not None and len(table.dims) == 2:
        return int(table.dims[0]), int(table.dims[1]) * 8 // bits, False
    reshape = next((n for n in graph.node if node.input[0] in n.output), None)
    head = next((n for n in graph.node if n.op_type == "MatMulNBits" and reshape is not None
                 and n.input[1] == reshape.input[0]), None)
    if head is None:
        return None
    attrs = {a.name: int(a.i) for a in head.attribute if a.name in ("K", "N")}
    return attrs["N"], attrs["K"], True


def architecture(graph: onnx.GraphProto) -> dict[str, Any]:
    """The decoder's architecture read back from the graph alone (no config.json, no weight data).

    Returns:
        ``layers`` (``past_key_values`` inputs / 2, else distinct ``/layers.N/`` in node names),
        ``hidden_size`` and ``vocab_size`` (embedding table [vocab, hidden]), ``kv_heads`` and
        ``head_dim`` (``past_key_values.0.key`` is [batch, kv_heads, past, head_dim]),
        ``attention_heads`` (q_proj's output features / head_dim), ``grouped_query_attention``,
        ``intermediate_size`` (gate_proj's output features; for MatMulNBits, its ``N`` attribute), ``tied_embeddings`` (lm_head reads the
        embedding table, its folded transpose or a quantized copy of them), ``qk_norm`` (Qwen3's q/k RMSNorm), ``attention_bias`` (Qwen2's q/k/v bias).
    """
    weights = key_weights(graph)
    pasts = [v for v in graph.input if v.name.startswith("past_key_values.")]
    layer_ids = {int(m.group(1)) for n in graph.node for m in [re.search(r"/layers\.(\d+)/", n.name)] if m}
    arch: dict[str, Any] = {"layers": len(pasts) // 2 if pasts else (max(layer_ids) + 1 if layer_ids else None)}
    embed = weights.get("embed_tokens")
    # a table stored once for a tied lm_head is [hidden, vocab], looked up on axis 1 (qwen_onnx.convert.tied)
    lookup_axis = next((a.i for n in graph.node if n.op_type == "Gather" and n.name.startswith(KEY_WEIGHTS["embed_tokens"])
                        for a in n.attribute if a.name == "axis"), 0)
    quantized_embed = _quantized_embedding(graph)
    if quantized_embed:  # its uint8 table holds hidden × bits / 8 bytes per row
        arch["vocab_size"], arch["hidden_size"] = quantized_embed[:2]
    elif embed and len(embed["shape"]) == 2:
        arch["vocab_size"], arch["hidden_size"] = embed["shape"][::-1] if lookup_axis == 1 else embed["shape"]
    if pasts:
        dims = [_dim(d) for d in pasts[0].type.tensor_type.shape.dim]
        if len(dims) == 4 and isinstance(dims[1], int) and isinstance(dims[3], int):
            arch["kv_heads"], arch["head_dim"] = dims[1], dims[3]
    q_features = _out_features(graph, weights, "q_proj")
    attention = next((n for n in graph.node if n.op_type == "GroupQueryAttention"), None)
    if q_features and arch.get("head_dim"):
        arch["attention_heads"] = q_features // arch["head_dim"]
    elif attention is not None:  # packed qkv_proj: the fused node names its heads
        arch["attention_heads"] = next((int(a.i) for a in attention.attribute if a.name == "num_heads"), None)
    if arch.get("attention_heads"):
        arch["grouped_query_attention"] = arch["attention_heads"] != arch.get("kv_heads")
    intermediate = _out_features(graph, weights, "gate_proj")
    if intermediate:
        arch["intermediate_size"] = intermediate
    head = weights.get("lm_head")
    # tied: lm_head reads the table itself, its folded transpose (onnxruntime names it <table>_transposed),
    # a quantized copy of either (the quantizers append _Q8, _quantized, ...), or no initializer of its
    # own (the export's Transpose of the table)
    table = embed["name"].removesuffix("_transposed") if embed else None
    arch["tied_embeddings"] = bool(head and table and head["name"].startswith(table)) or (head is None and embed is not None)
    shared = _shared_table(graph)
    if shared is not None:  # the builder's layout: Gather(Transpose(lm_head weight)) or one packed table
        arch["tied_embeddings"] = True
        if "vocab_size" not in arch and len(shared.dims) == 2:
            arch["hidden_size"], arch["vocab_size"] = (int(d) for d in shared.dims)
    if quantized_embed:
        arch["tied_embeddings"] = quantized_embed[2]
    arch["qk_norm"] = "q_norm" in weights
    bias_prefixes = (KEY_WEIGHTS["q_proj"], BUILDER_KEY_WEIGHTS["q_proj"], BUILDER_KEY_WEIGHTS["qkv_proj"])
    arch["attention_bias"] = any(n.name.startswith(bias_prefixes) and n.op_type == "Add" for n in graph.node)
    return arch


def inspect_variant(path: str | os.PathLike) -> tuple[dict[str, Any], str]:
    """The inspection report of any variant, the one entry of the CLI and the workflow: a LiteRT
    folder through :func:`qwen_onnx.measure.inspect_tflite.inspect_tflite`, anything else through
    :func:`inspect_model`.

    Args:
        path: a variant folder or its ``model.onnx``.

    Returns:
        ``(info, markdown)``: the JSON report and its Markdown rendering.
    """
    if os.path.isdir(path) and is_tflite_folder(path):
        info = inspect_tflite(path)
        return info, inspect_tflite_markdown(info)
    info = inspect_model(path)
    record = Path(path) / "quantize.json" if os.path.isdir(path) else Path(path).parent / "quantize.json"
    quantized = json.loads(record.read_text(encoding="utf-8")) if record.is_file() else {}
    if search := quantized.get("precision_search"):
        # the int4 precision search's outcome, for the report: per layer kind, bytes, the margin kept
        info["precision_search"] = {k: search[k] for k in ("by_role", "weight_bytes_per_token",
                                                            "weight_bytes_per_token_all_8bit", "chosen", "gate",
                                                            "moves", "of_moves")}
    if origin := quantized.get("weight_origin"):
        info["weight_origin"] = origin  # weights carried over from the source's grid, rounded once, rounded again
    return info, to_markdown(info)


def to_markdown(info: dict[str, Any], top: int = 15) -> str:
    """A short Markdown rendering of :func:`inspect_model`'s result."""
    lines = [
        f"# {info['path']}",
        "",
        f"- IR version {info['ir_version']}, opsets {info['opsets']}",
        f"- {info['nodes']} nodes, {info['initializers']['count']} initializers, "
        f"{info['bytes_on_disk'] / 1e6:.1f} MB on disk",
        f"- initializer bytes per dtype: {info['initializers']['bytes_per_dtype']}",
        "",
        "| input | dtype | shape |",
        "|---|---|---|",
    ]
    lines += [f"| {v['name']} | {v['dtype']} | {v['shape']} |" for v in info["inputs"][:6]]
    if len(info["inputs"]) > 6:
        lines.append(f"| … {len(info['inputs']) - 6} more | | |")
    lines += ["", "| op type | count |", "|---|---|"]
    lines += [f"| {op} | {n} |" for op, n in list(info["op_types"].items())[:top]]
    if info.get("architecture"):
        lines += ["", "Architecture read from the graph: "
                  + ", ".join(f"{k} {v}" for k, v in info["architecture"].items())]
    if info.get("key_weights"):
        lines += ["", "| key weight | name | dtype | shape |", "|---|---|---|---|"]
        lines += [f"| {k} | {w['name']} | {w['dtype']} | {w['shape']} |" for k, w in info["key_weights"].items()]
    if info.get("first_nodes"):
        lines += ["", "First nodes: " + ", ".join(f"{n['op_type']} {n['name']}" for n in info["first_nodes"]),
                  "", "Last nodes: " + ", ".join(f"{n['op_type']} {n['name']}" for n in info["last_nodes"])]
    return "\n".join(lines) + "\n"


#: Op types that graph optimization fuses (onnxruntime contrib ops and ORT's own fusions).
FUSED_OPS = frozenset(
    {"SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "SkipLayerNormalization",
     "RotaryEmbedding", "GroupQueryAttention", "MultiHeadAttention", "Attention", "FusedMatMul", "FusedGemm",
     "FastGelu", "BiasGelu", "QuickGelu", "MatMulNBits", "MatMulIntegerToFloat", "DynamicQuantizeMatMul",
     "NhwcConv", "FusedConv"}
)


def diff_models(a: str | os.PathLike, b: str | os.PathLike) -> dict[str, Any]:
    """What changed from model ``a`` to model ``b`` (for example fp32 to a quantized variant).

    Returns:
        ``nodes`` and ``bytes_on_disk`` of both and their change; ``op_types`` delta
        (op type -> count change, non-zero only); ``fusions`` (fused op types that appear or grow
        in ``b``); ``quantization_ops`` (quantization op types inserted in ``b``, with counts);
        ``removed_op_types`` (op types present in ``a`` only).

    Raises:
        ArtifactError: see :func:`load_graph`.
    """
    ia, ib = inspect_model(a), inspect_model(b)
    ops_a, ops_b = collections.Counter(ia["op_types"]), collections.Counter(ib["op_types"])
    delta = {op: ops_b[op] - ops_a[op] for op in sorted(set(ops_a) | set(ops_b)) if ops_b[op] != ops_a[op]}
    return {
        "a": ia["path"],
        "b": ib["path"],
        "nodes": {"a": ia["nodes"], "b": ib["nodes"], "change": ib["nodes"] - ia["nodes"]},
        "bytes_on_disk": {"a": ia["bytes_on_disk"], "b": ib["bytes_on_disk"],
                          "change": ib["bytes_on_disk"] - ia["bytes_on_disk"]},
        "op_types": dict(sorted(delta.items(), key=lambda kv: -abs(kv[1]))),
        "fusions": {op: n for op, n in delta.items() if op in FUSED_OPS and n > 0},
        "quantization_ops": {op: n for op, n in delta.items() if op in QUANT_OPS and n > 0},
        "removed_op_types": sorted(op for op in ops_a if op not in ops_b),
    }


def diff_markdown(diff: dict[str, Any], top: int = 12) -> str:
    """A short Markdown rendering of :func:`diff_models`'s result."""
    lines = [
        f"# {diff['a']} → {diff['b']}",
        "",
        f"- nodes {diff['nodes']['a']} → {diff['nodes']['b']} ({diff['nodes']['change']:+d})",
        f"- bytes on disk {diff['bytes_on_disk']['a'] / 1e6:.1f} MB → {diff['bytes_on_disk']['b'] / 1e6:.1f} MB",
        f"- fusions: {diff['fusions'] or 'none'}",
        f"- quantization ops inserted: {diff['quantization_ops'] or 'none'}",
        f"- op types removed: {', '.join(diff['removed_op_types']) or 'none'}",
        "",
        "| op type | change |",
        "|---|---|",
    ]
    lines += [f"| {op} | {n:+d} |" for op, n in list(diff["op_types"].items())[:top]]
    return "\n".join(lines) + "\n"


#: The inputs of onnxruntime's contrib ops that hold rotary tables indexed by position
#: (cos_cache, sin_cache): a decode step reads one row of each.
POSITION_TABLE_INPUTS = {"GroupQueryAttention": (7, 8), "RotaryEmbedding": (2, 3)}


def decode_weight_bytes(proto: onnx.ModelProto) -> int:
    """Bytes of weights read to decode one token: every initializer, a table indexed by token or
    position as one row.

    Tables read one row per token count ``bytes / rows``: a ``Gather`` on an initializer (the token
    embedding), a ``GatherBlockQuantized`` on its own quantized table and scales, and the rotary
    tables that ``GroupQueryAttention`` (inputs 7, 8) and ``RotaryEmbedding`` (inputs 2, 3) index by
    position (``cos_cache``/``sin_cache``, ``[max_position, rotary_dim / 2]``; onnxruntime's
    contrib-op schemas). Every other initializer (projections, lm_head, norms, quantization scales)
    is read whole at each decode step. This is the numerator of the decode roofline:
    ``tokens/s <= memory bandwidth / weight bytes per token``.

    Returns:
        bytes (int).
    """
    sizes = {t.name: (initializer_bytes(t), list(t.dims)) for t in proto.graph.initializer}
    gathered = {n.input[0] for n in proto.graph.node if n.op_type == "Gather" and n.input and n.input[0] in sizes}
    gathered |= {name for n in proto.graph.node if n.op_type == "GatherBlockQuantized"
                 for name in (n.input[0], n.input[2], *n.input[3:]) if name in sizes}
    gathered |= {name for n in proto.graph.node if n.op_type in POSITION_TABLE_INPUTS
                 for i in POSITION_TABLE_INPUTS[n.op_type] if i < len(n.input) and (name := n.input[i]) in sizes}
    total = 0
    for name, (size, dims) in sizes.items():
        if name in gathered and dims and dims[0] > 0:
            total += size // dims[0]
        else:
            total += size
    return int(total)
