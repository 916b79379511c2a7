"""Decode- and prefill-shaped MatMulNBits throughput per precision option: which (bits, block,
accuracy_level) is fastest per weight on the CPU at hand.

A decode step multiplies one token's activations by every weight matrix, so its time is the sum, over
the weight MatMuls, of what onnxruntime's ``MatMulNBits`` kernel takes for an [1, K] x [K, N] product at
that MatMul's option. This tool times exactly that, without a model: for each option it builds one
graph of ``layers`` decoder layers' weight MatMuls (the shapes of a Qwen2.5 layer of the given hidden and
intermediate sizes: packed q/k/v, o, gate, up, down), random packed weights, scales and zero points (a
kernel's speed does not depend on the values), and times ``session.run`` over all of them at M = 1. The
weights of all layers together are far larger than the last-level cache, as a real model's are.
``tokens`` > 1 times the prefill shape instead, [tokens, K] x [K, N], where the kernel is bound by
arithmetic rather than by bytes; the option ``fp32`` times a float ``MatMul`` of the same shapes, the
optimized graph's kernel, as the baseline a quantized prefill is compared with.

Each measurement runs in a fresh process, the options in turns with the order rotating
(:func:`qwen_onnx.measure.sitting.interleaved_rounds`); a figure is the median over the rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Sequence

import numpy as np

from lab.command import run_command
from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.measure.sitting import interleaved_rounds
from qwen_onnx.run.machine import cpu_model, int8_kernel, isa_name
from qwen_onnx.store.artifacts import write_json
from qwen_onnx.store.provenance import library_versions

#: (bits, block, accuracy_level) options timed by default: the int4 stage's and the precision search's.
OPTIONS: tuple[tuple[int, int, int], ...] = ((8, 128, 4), (8, 32, 4), (4, 16, 4), (4, 32, 4), (4, 64, 4), (4, 128, 4),
                                              (4, 32, 0))


def layer_shapes(hidden: int, intermediate: int, kv_width: int) -> list[tuple[int, int]]:
    """(K, N) of one decoder layer's weight MatMuls in the fused graph: qkv_proj, o_proj, gate_proj,
    up_proj, down_proj."""
    return [(hidden, hidden + 2 * kv_width), (hidden, hidden), (hidden, intermediate), (hidden, intermediate),
            (intermediate, hidden)]


#: The float baseline's option triple (``fp32`` on the command line): a plain ``MatMul`` of float32 weights.
FLOAT = (32, 0, 0)


def _time_option(bits: int, block: int, level: int, shapes: Sequence[tuple[int, int]], layers: int, threads: int,
                 runs: int, tokens: int = 1) -> dict[str, float]:
    """One process: build the graph of ``layers`` x ``shapes`` MatMulNBits at one option (a float MatMul for
    :data:`FLOAT`) with ``tokens`` rows of activations, time ``runs`` runs."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, initializers, outputs, inputs = [], [], [], {}
    stored = weights = 0
    for layer in range(layers):
        for j, (k, n) in enumerate(shapes):
            name = f"l{layer}_{j}"
            weights += k * n
            inputs.setdefault(k, f"a{k}")
            outputs.append(helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [tokens, n]))
            if (bits, block, level) == FLOAT:
                weight = rng.standard_normal((k, n), dtype=np.float32) * 0.02
                initializers.append(numpy_helper.from_array(weight, f"{name}_w"))
                stored += weight.nbytes
                nodes.append(helper.make_node("MatMul", [inputs[k], f"{name}_w"], [f"{name}_y"]))
                continue
            blocks = -(-k // block)
            packed = rng.integers(0, 256, size=(n, blocks, block * bits // 8), dtype=np.uint8)
            scales = (rng.random(n * blocks, dtype=np.float32) * 0.01 + 0.001).astype(np.float32)
            zero_points = rng.integers(0, 256, size=(n * -(-blocks * bits // 8),), dtype=np.uint8)
            initializers += [numpy_helper.from_array(packed, f"{name}_b"), numpy_helper.from_array(scales, f"{name}_s"),
                             numpy_helper.from_array(zero_points, f"{name}_z")]
            stored += packed.nbytes + scales.nbytes + zero_points.nbytes
            nodes.append(helper.make_node("MatMulNBits", [inputs[k], f"{name}_b", f"{name}_s", f"{name}_z"], [f"{name}_y"],
                                          domain="com.microsoft", K=k, N=n, bits=bits, block_size=block,
                                          accuracy_level=level))
    graph = helper.make_graph(nodes, "weight_matmuls", [helper.make_tensor_value_info(a, TensorProto.FLOAT, [tokens, k])
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
        feeds = {a: rng.standard_normal((tokens, k)).astype(np.float32) for k, a in inputs.items()}
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
    layers: int = 24,
    threads: int = 2,
    rounds: int = 3,
    runs: int = 40,
    tokens: int = 1,
    output: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Time every option's MatMulNBits products in turns (module docstring).

    Args:
        options: (bits, block, accuracy_level) triples, or :data:`FLOAT` for a float32 ``MatMul``; the
            first is the baseline of ``time_vs_first``.
        hidden, intermediate, kv_width: the layer's sizes (defaults: Qwen2.5-0.5B; 1.5B: 1536, 8960, 256).
        layers: decoder layers' MatMuls in the graph.
        threads: onnxruntime intra-op threads.
        rounds: measurements of each option, each in its own process.
        runs: timed runs inside each measurement (their median is the measurement's figure).
        tokens: rows of activations, M: 1 for decode, the prompt length for prefill.

    Returns:
        ``options``: per option ``bits``, ``block``, ``accuracy_level``, ``ms`` (median over the rounds of
        one pass over every MatMul, milliseconds), ``ns_per_weight``, ``gb_s`` (bytes stored: packed
        weights, float32 scales and zero points, over the time), ``gflop_s`` (2 x weights x tokens over
        the time), ``stored_mb``, ``time_vs_first`` and ``rounds_ms``; ``cpu``, ``isa`` and ``int8_kernel``
        (read from this machine's CPU flags), the settings and library versions.

    Raises:
        QwenOnnxError: no option, an option MatMulNBits does not have (bits other than 4 or 8, a block
            that is not a power of two of at least 16), or fewer than one round, run or token.
    """
    if not options:
        raise QwenOnnxError("no option given; name at least one as BITS/BLOCK[/LEVEL]")
    for bits, block, level in options:
        if (bits, block, level) == FLOAT:
            continue
        if bits not in (4, 8) or block < 16 or block & (block - 1) or level not in (0, 1, 2, 3, 4):
            raise QwenOnnxError(f"MatMulNBits has no option {bits}/{block}/{level}: bits 4 or 8, a block that is a "
                                "power of two of at least 16, accuracy_level 0-4")
    if rounds < 1 or runs < 1 or tokens < 1:
        raise QwenOnnxError(f"need at least one round, run and token, got {rounds}, {runs} and {tokens}")
    shapes = layer_shapes(hidden, intermediate, kv_width)
    jobs = [("fp32" if (b, s, lv) == FLOAT else f"{b}/{s} level {lv}", _time_option,
             (b, s, lv, shapes, layers, threads, runs, tokens)) for b, s, lv in options]
    per_round = interleaved_rounds(jobs, rounds)
    rows = []
    for (bits, block, level), figures in zip(options, per_round):
        ms = [f["ms"] for f in figures]
        median = statistics.median(ms)
        first = figures[0]
        rows.append({"bits": bits, "block": block, "accuracy_level": level, "ms": median,
                     "ns_per_weight": 1e6 * median / first["weights"], "gb_s": first["stored_mb"] / median,
                     "gflop_s": 2e-6 * first["weights"] * tokens / median,
                     "stored_mb": first["stored_mb"], "rounds_ms": ms})
    for row in rows:
        row["time_vs_first"] = row["ms"] / rows[0]["ms"]
    result = {"options": rows, "cpu": cpu_model(), "isa": isa_name(), "int8_kernel": int8_kernel(),
              "shapes_per_layer": shapes, "layers": layers, "tokens": tokens, "threads": threads, "rounds": rounds,
              "runs": runs,
              "process_per_measurement": True, "library_versions": library_versions()}
    if output is not None:
        write_json(output, result)
    return result


def parse_option(text: str) -> tuple[int, int, int]:
    """``"4/32"`` or ``"4/32/0"`` -> (bits, block, accuracy_level), the level 4 by default; ``"fp32"`` ->
    :data:`FLOAT`."""
    if text == "fp32":
        return FLOAT
    parts = text.split("/")
    if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not BITS/BLOCK[/LEVEL] or fp32, e.g. 4/32 or 4/32/0")
    bits, block, level = (*map(int, parts), 4)[:3]
    return bits, block, level


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="MatMulNBits time per precision option, decode- or prefill-shaped, "
                                            "measured in turns")
    p.add_argument("options", nargs="*", type=parse_option, default=list(OPTIONS),
                   help="BITS/BLOCK[/LEVEL] options or fp32 (a float MatMul), the first the baseline "
                        "(default: %(default)s)")
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--intermediate", type=int, default=4864)
    p.add_argument("--kv-width", type=int, default=128, help="key (= value) projection width: kv heads x head size")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", type=int, default=40)
    p.add_argument("--tokens", type=int, default=1, help="rows of activations: 1 for decode, e.g. 512 for prefill")
    p.add_argument("-o", "--output", default=None)
    return p


def run(a: argparse.Namespace) -> dict:
    """The command: :func:`compare_kernels` with the parsed options."""
    return compare_kernels(a.options, hidden=a.hidden, intermediate=a.intermediate, kv_width=a.kv_width,
                           layers=a.layers, threads=a.threads, rounds=a.rounds, runs=a.runs, tokens=a.tokens,
                           output=a.output)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m lab.kernels --help`` from the repository root; 2 and one line on bad input."""
    return run_command("lab.kernels", build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
