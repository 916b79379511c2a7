"""Extract one decoder layer of an exported Qwen graph as a small standalone ONNX model, and draw it.

The layer is every node whose name lies under ``/model/layers.{N}/`` (optimum's export names them
after the PyTorch modules), plus the quantization nodes that feed them. Its inputs are the tensors
those nodes read but do not produce (hidden states, attention mask pieces, rotary cos/sin, the
layer's ``past_key_values.N.*``); its outputs are the tensors they produce that the rest of the
graph reads (the residual stream, ``present.N.*``). Types and shapes come from ONNX shape
inference on the weight-less graph; weights are read one tensor at a time, so a 6 GB model is
never loaded whole. The picture is a layered drawing (nodes by topological generation) made with
networkx and matplotlib.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import onnx
from onnx import helper, numpy_helper

from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.store.artifacts import MODEL_FILE, check_external_data, write_json
from qwen_onnx.store.hub_cache import reads_variant

log = logging.getLogger(__name__)


def _layer_nodes(graph: onnx.GraphProto, layer: int) -> list[onnx.NodeProto]:
    prefix = f"/model/layers.{layer}/"
    chosen = [n for n in graph.node if n.name.startswith(prefix)]
    if not chosen:
        layers = sorted({int(n.name.split("/model/layers.")[1].split("/")[0]) for n in graph.node
                         if n.name.startswith("/model/layers.")})
        raise QwenOnnxError(
            f"no node named {prefix}* in the graph; layers found: "
            f"{f'0..{layers[-1]}' if layers else 'none (not an optimum export of a Qwen decoder?)'}"
        )
    # constants and quantization nodes that feed the layer (their names do not carry its prefix)
    producers = {o: n for n in graph.node for o in n.output}
    names = {n.name for n in chosen}
    frontier = list(chosen)
    while frontier:
        node = frontier.pop()
        for tensor in node.input:
            producer = producers.get(tensor)
            if producer is not None and producer.name not in names and producer.op_type in (
                    "DequantizeLinear", "QuantizeLinear", "DynamicQuantizeLinear", "Constant"):
                names.add(producer.name)
                chosen.append(producer)
                frontier.append(producer)
    order = {n.name: i for i, n in enumerate(graph.node)}
    return sorted(chosen, key=lambda n: order[n.name])


@reads_variant("model")
def extract_layer(model: str | os.PathLike, layer: int, output_dir: str | os.PathLike, *, picture: str = "svg") -> dict[str, Any]:
    """Write ``output_dir/layer{N}.onnx`` (weights inline, opens in Netron) and ``layer{N}.{svg|png}``.

    Args:
        model: ``model.onnx`` or its variant folder.
        layer: decoder layer index.
        output_dir: folder to write to (created).
        picture: ``svg`` or ``png``.

    Returns:
        ``nodes``, ``inputs``, ``outputs`` (names), ``initializers``, ``bytes`` of the ONNX file and
        the paths written (also saved as ``layer{N}.json``).

    Raises:
        QwenOnnxError: no such layer, or an unsupported picture format.
        ArtifactError: the model or its external data is missing.
    """
    if picture not in ("svg", "png"):
        raise QwenOnnxError(f"picture format {picture!r} unsupported; use svg or png")
    path = Path(model)
    path = path / MODEL_FILE if path.is_dir() else path
    check_external_data(path)
    proto = onnx.load(str(path), load_external_data=False)
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False)
    except Exception:  # shape inference is a nicety for the inputs' types
        inferred = proto
    graph = inferred.graph
    nodes = _layer_nodes(graph, layer)
    produced = {o for n in nodes for o in n.output if o}
    initializers = {t.name: t for t in graph.initializer}
    consumed = [i for n in nodes for i in n.input if i]
    outside_consumers = {i for n in graph.node if n not in nodes for i in n.input}
    graph_outputs = {o.name for o in graph.output}
    value_info = {v.name: v for v in [*graph.value_info, *graph.input, *graph.output]}

    def typed(name: str) -> onnx.ValueInfoProto:
        if name in value_info:
            info = onnx.ValueInfoProto()
            info.CopyFrom(value_info[name])
            return info
        return helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None)

    inputs = list(dict.fromkeys(i for i in consumed if i not in produced and i not in initializers))
    outputs = [o for n in nodes for o in n.output if o and (o in outside_consumers or o in graph_outputs)]
    weights = []
    for name in dict.fromkeys(i for i in consumed if i in initializers):
        tensor = initializers[name]
        array = numpy_helper.to_array(tensor, base_dir=str(path.parent))  # one tensor in memory at a time
        weights.append(numpy_helper.from_array(array, name))
    sub = helper.make_graph(nodes, f"layer{layer}", [typed(i) for i in inputs], [typed(o) for o in outputs], weights)
    standalone = helper.make_model(sub, opset_imports=list(proto.opset_import), ir_version=proto.ir_version,
                                   producer_name="qwen-onnx extract")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    onnx_path = out / f"layer{layer}.onnx"
    onnx.save_model(standalone, str(onnx_path))
    picture_path = out / f"layer{layer}.{picture}"
    draw_graph(sub, picture_path, title=f"{path.parent.name} layer {layer}")
    info = {
        "model": str(path),
        "layer": layer,
        "nodes": len(nodes),
        "inputs": inputs,
        "outputs": outputs,
        "initializers": len(weights),
        "bytes": onnx_path.stat().st_size,
        "onnx": str(onnx_path),
        "picture": str(picture_path),
    }
    write_json(out / f"layer{layer}.json", info)
    return info


def draw_graph(graph: onnx.GraphProto, path: str | os.PathLike, title: str = "") -> None:
    """Draw ``graph``'s nodes top to bottom by topological generation, edges for tensors."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx

    g = nx.DiGraph()
    producers = {}
    for i, node in enumerate(graph.node):
        key = f"n{i}"
        g.add_node(key, label=node.op_type)
        for o in node.output:
            producers[o] = key
    for i, node in enumerate(graph.node):
        for tensor in node.input:
            if tensor in producers:
                g.add_edge(producers[tensor], f"n{i}")
    generations = list(nx.topological_generations(g))
    width = max(len(gen) for gen in generations)
    pos = {}
    for depth, gen in enumerate(generations):
        for j, key in enumerate(sorted(gen, key=lambda k: int(k[1:]))):
            pos[key] = ((j - (len(gen) - 1) / 2) * 1.6, -depth)
    fig, ax = plt.subplots(figsize=(max(8, 1.7 * width), max(6, 0.55 * len(generations))), dpi=100)
    nx.draw_networkx_edges(g, pos, ax=ax, arrows=True, arrowsize=8, edge_color="#999999", width=0.7)
    colors = ["#f4c7a1" if "Quant" in g.nodes[k]["label"] else "#b8d4f0" if "MatMul" in g.nodes[k]["label"]
              else "#dddddd" for k in g.nodes]
    nx.draw_networkx_nodes(g, pos, ax=ax, node_size=900, node_shape="s", node_color=colors)
    nx.draw_networkx_labels(g, pos, labels={k: g.nodes[k]["label"] for k in g.nodes}, font_size=6, ax=ax)
    ax.set_title(title)
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
