"""Decode-shaped MatMulNBits time per precision option: which (bits, block) is fastest per weight on the
CPU at hand, for the precision search's time cost (:func:`kernel_costs`) and the ``lab.kernels`` table.

A decode step multiplies one token's activations by every weight matrix, so its time is the sum, over
the weight MatMuls, of what onnxruntime's ``MatMulNBits`` kernel takes for an [1, K] x [K, N] product at
that MatMul's option. This module times exactly that, without the model's weights: for each option it
builds one graph of ``layers`` decoder layers' weight MatMuls (a Qwen2.5 layer's shapes: packed q/k/v, o,
gate, up, down, from the sizes or read from a graph), random packed weights, scales and zero points (a
kernel's speed does not depend on the values), and times ``session.run`` over all of them at M = 1. The
weights of all layers together are far larger than the last-level cache, as a real model's are.

Each measurement runs in a fresh process, the options in turns with the order rotating
(:func:`qwen_onnx.measure.sitting.interleaved_rounds`); a figure is the median over the rounds.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from typing import Any, Sequence

import numpy as np
import onnx

from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.measure.sitting import interleaved_rounds
from qwen_onnx.quantize.matmuls import node_role, weight_matmuls
from qwen_onnx.run.machine import cpu_model, int8_kernel, isa_name
from qwen_onnx.store.artifacts import model_path, write_json
from qwen_onnx.store.provenance import library_versions

#: (bits, block, accuracy_level) options timed by default: the int4 stage's and the precision search's.
OPTIONS: tuple[tuple[int, int, int], ...] = ((8, 128, 4), (8, 32, 4), (4, 16, 4), (4, 32, 4), (4, 64, 4), (4, 128, 4),
                                              (4, 32, 0))


def layer_shapes(hidden: int, intermediate: int, kv_width: int) -> list[tuple[int, int]]:
    """(K, N) of one decoder layer's weight MatMuls in the fused graph: qkv_proj, o_proj, gate_proj,
    up_proj, down_proj."""
    return [(hidden, hidden + 2 * kv_width), (hidden, hidden), (hidden, intermediate), (hidden, intermediate),
            (intermediate, hidden)]


def graph_layer_shapes(model_dir: str | os.PathLike) -> tuple[list[tuple[int, int]], int]:
    """(K, N) of the first decoder layer's weight MatMuls in the graph at ``model_dir`` (a variant folder or
    ``model.onnx``), in graph order (a Qwen decoder's layers all have the same shapes), and the number of
    decoder layers.

    Raises:
        QwenOnnxError: the graph has no weight MatMul inside a decoder layer (``layers.N`` in its name).
    """
    graph = onnx.load(str(model_path(model_dir)), load_external_data=False).graph
    layers = [(node_role(node.name)[0], tuple(int(d) for d in tensor.dims)) for node, tensor in weight_matmuls(graph)]
    first = min((layer for layer, _ in layers if layer is not None), default=None)
    if first is None:
        raise QwenOnnxError(f"{model_dir} has no float weight MatMul inside a decoder layer (a node name with "
                            "layers.N); time kernels on a float variant's graph (fp32, optimized)")
    return [shape for layer, shape in layers if layer == first], len({layer for layer, _ in layers if layer is not None})


def check_kernel_options(options: Sequence[tuple[int, int, int]]) -> None:
    """Raises QwenOnnxError naming an option MatMulNBits lacks (bits other than 4 or 8, a block that is not
    a power of two of at least 16, an accuracy_level outside 0-4), or no option at all."""
    if not options:
        raise QwenOnnxError("no option given; name at least one as BITS/BLOCK[/LEVEL]")
    for bits, block, level in options:
        if bits not in (4, 8) or block < 16 or block & (block - 1) or level not in (0, 1, 2, 3, 4):
            raise QwenOnnxError(f"MatMulNBits has no option {bits}/{block}/{level}: bits 4 or 8, a block that is a "
                                "power of two of at least 16, accuracy_level 0-4")


def time_option(bits: int, block: int, level: int, shapes: Sequence[tuple[int, int]], layers: int, threads: int,
                runs: int) -> dict[str, float]:
    """One process: build the graph of ``layers`` x ``shapes`` MatMulNBits at one option, time ``runs`` runs."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, initializers, outputs, inputs = [], [], [], {}
    stored = weights = 0
    for layer in range(layers):
        for j, (k, n) in enumerate(shapes):
            blocks = -(-k // block)
            name = f"l{layer}_{j}"
            packed = rng.integers(0, 256, size=(n, blocks, block * bits // 8), dtype=np.uint8)
            scales = (rng.random(n * blocks, dtype=np.float32) * 0.01 + 0.001).astype(np.float32)
            zero_points = rng.integers(0, 256, size=(n * -(-blocks * bits // 8),), dtype=np.uint8)
            initializers += [numpy_helper.from_array(packed, f"{name}_b"), numpy_helper.from_array(scales, f"{name}_s"),
                             numpy_helper.from_array(zero_points, f"{name}_z")]
            stored += packed.nbytes + scales.nbytes + zero_points.nbytes
            weights += k * n
            inputs.setdefault(k, f"a{k}")
            nodes.append(helper.make_node("MatMulNBits", [inputs[k], f"{name}_b", f"{name}_s", f"{name}_z"], [f"{name}_y"],
                                          domain="com.microsoft", K=k, N=n, bits=bits, block_size=block,
                                          accuracy_level=level))
            outputs.append(helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [1, n]))
    graph = helper.make_graph(nodes, "decode_matmuls", [helper.make_tensor_value_info(a, TensorProto.FLOAT, [1, k])
                                                        for k, a in inputs.items()], outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    with tempfile.TemporaryDirectory(prefix="qwen-onnx-kernels-") as folder:
        path = os.path.join(folder, "model.onnx")
        onnx.save(model, path, save_as_external_data=True, location="model.onnx_data")
        del model, graph, initializers
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        feeds = {a: rng.standard_normal((1, k)).astype(np.float32) for k, a in inputs.items()}
        for _ in range(3):
            session.run(None, feeds)
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            session.run(None, feeds)
            times.append(time.perf_counter() - started)
    seconds = statistics.median(times)
    return {"ms": 1000.0 * seconds, "ns_per_weight": 1e9 * seconds / weights, "gb_s": stored / seconds / 1e9,
            "stored_mb": stored / 1e6, "weights": weights}


def compare_kernels(
    options: Sequence[tuple[int, int, int]] = OPTIONS,
    *,
    hidden: int = 896,
    intermediate: int = 4864,
    kv_width: int = 128,
    shapes: Sequence[tuple[int, int]] | None = None,
    layers: int = 24,
    threads: int = 2,
    rounds: int = 3,
    runs: int = 40,
    output: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Time every option's decode-shaped MatMulNBits products in turns (module docstring).

    Args:
        options: (bits, block, accuracy_level) triples; the first is the baseline of ``time_vs_first``.
        hidden, intermediate, kv_width: the layer's sizes (defaults: Qwen2.5-0.5B; 1.5B: 1536, 8960, 256).
        shapes: one layer's (K, N) instead of the sizes (:func:`graph_layer_shapes`).
        layers: decoder layers' MatMuls in the graph.
        threads: onnxruntime intra-op threads.
        rounds: measurements of each option, each in its own process.
        runs: timed runs inside each measurement (their median is the measurement's figure).

    Returns:
        ``options``: per option ``bits``, ``block``, ``accuracy_level``, ``ms`` (median over the rounds of
        one pass over every MatMul, milliseconds), ``ns_per_weight``, ``gb_s`` (bytes stored: packed
        weights, float32 scales and zero points, over the time), ``stored_mb``, ``time_vs_first`` and
        ``rounds_ms``; ``cpu``, ``isa`` and ``int8_kernel`` (read from this machine's CPU flags), the
        settings and library versions.

    Raises:
        QwenOnnxError: no option, an option MatMulNBits does not have (bits other than 4 or 8, a block
            that is not a power of two of at least 16), or fewer than one round or run.
    """
    check_kernel_options(options)
    if rounds < 1 or runs < 1:
        raise QwenOnnxError(f"need at least one round and one run, got {rounds} and {runs}")
    shapes = list(shapes) if shapes is not None else layer_shapes(hidden, intermediate, kv_width)
    jobs = [(f"{b}/{s} level {lv}", time_option, (b, s, lv, shapes, layers, threads, runs)) for b, s, lv in options]
    per_round = interleaved_rounds(jobs, rounds)
    rows = []
    for (bits, block, level), figures in zip(options, per_round):
        ms = [f["ms"] for f in figures]
        median = statistics.median(ms)
        first = figures[0]
        rows.append({"bits": bits, "block": block, "accuracy_level": level, "ms": median,
                     "ns_per_weight": 1e6 * median / first["weights"], "gb_s": first["stored_mb"] / median,
                     "stored_mb": first["stored_mb"], "rounds_ms": ms})
    for row in rows:
        row["time_vs_first"] = row["ms"] / rows[0]["ms"]
    result = {"options": rows, "cpu": cpu_model(), "isa": isa_name(), "int8_kernel": int8_kernel(),
              "shapes_per_layer": shapes, "layers": layers, "threads": threads, "rounds": rounds, "runs": runs,
              "process_per_measurement": True, "library_versions": library_versions()}
    if output is not None:
        write_json(output, result)
    return result


#: Weights in each of :func:`kernel_costs`' graphs at most (the model's own layers, fewer when they hold more):
#: 0.5 G, 16x an EPYC's 32 MiB last-level cache at 8 bits, so the kernels stream from memory as a whole
#: model's do. On the 1.5B's
#: shapes (AVX-512 VNNI, 2026-12-06) 4 layers (0.19 G) timed 4-bit at block 32 at 0.66x of 8-bit, 28 layers
#: (the whole model) at 0.77x; 8-bit took the same time per weight in both.
COST_WEIGHTS = 500_000_000


def kernel_costs(model_dir: str | os.PathLike, options: Sequence[tuple[int, int]], *, accuracy_level: int = 4,
                 threads: int = 2, rounds: int = 3, runs: int = 20, weights: int = COST_WEIGHTS) -> dict[str, Any]:
    """Decode time per weight of each (bits, block) option on this CPU, on the graph's own layer shapes:
    the precision search's cost when it is priced by time (``quantize_int4.search_cost: time``).

    :func:`compare_kernels` on :func:`graph_layer_shapes` of ``model_dir``: the model's own layers, or as
    many as hold ``weights`` weights when that is fewer (at least one).

    Returns:
        ``ns_per_weight``: ``{"bits/block": nanoseconds per weight}`` at M = 1 (a decode step's products),
        ``time_vs_first``: each option's time over ``options[0]``'s, and what ran: ``cpu``, ``isa``,
        ``int8_kernel``, ``threads``, ``rounds``, ``runs``, ``layers``, ``shapes_per_layer``,
        ``rounds_ms`` per option and ``seconds`` (wall time of the measurement).

    Raises:
        QwenOnnxError: as :func:`graph_layer_shapes` and :func:`compare_kernels`.
    """
    started = time.time()
    shapes, model_layers = graph_layer_shapes(model_dir)
    layers = max(1, min(model_layers, -(-weights // sum(k * n for k, n in shapes))))
    result = compare_kernels([(bits, block, accuracy_level) for bits, block in options], shapes=shapes, layers=layers,
                             threads=threads, rounds=rounds, runs=runs)
    keys = [f"{row['bits']}/{row['block']}" for row in result["options"]]
    return {"ns_per_weight": {k: row["ns_per_weight"] for k, row in zip(keys, result["options"])},
            "time_vs_first": {k: row["time_vs_first"] for k, row in zip(keys, result["options"])},
            "rounds_ms": {k: row["rounds_ms"] for k, row in zip(keys, result["options"])},
            "accuracy_level": accuracy_level,
            **{k: result[k] for k in ("cpu", "isa", "int8_kernel", "threads", "rounds", "runs", "layers",
                                      "shapes_per_layer")},
            "seconds": round(time.time() - started, 1)}
