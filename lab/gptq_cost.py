"""What GPTQ's updates cost per MatMul, in interleaved rounds, each call in its own process.

- The inverse-Hessian factor: ``qwen_onnx.quantize.gptq.inverse_cholesky`` (one Cholesky factorization of the
  reversed Hessian and a triangular solve, float32) against the reference code's three steps
  (``cholesky(cholesky_inverse(cholesky(H)), upper=True)``, in float64 as this project computed it before, and
  in float32 as the reference code does), on random Hessians of a decoder's MatMul input widths: seconds per
  factor and the largest difference to the float64 factor.
- The updates: ``gptq_blocks`` at 4 bits, block 32, on one thread and on ``--threads`` (the output columns
  split), on random weights of a decoder's MatMul shapes: seconds per weight.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Sequence

import numpy as np

from lab.command import run_command
from qwen_onnx.measure.sitting import interleaved_rounds
from qwen_onnx.quantize.gptq import DAMPING, gptq_blocks, inverse_cholesky
from qwen_onnx.run.machine import machine_isa

METHODS = ("inverse_cholesky", "three_step_float64", "three_step_float32")


def random_hessian(width: int, tokens: int = 2048, seed: int = 0) -> np.ndarray:
    """``mean(x x^T)`` float32 [width, width] of correlated inputs with a few channels 30x stronger, as a
    decoder's MatMul inputs are (Qwen's massive activations)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, width), dtype=np.float32)
    x[:, :8] *= 30
    x = x + 0.5 * np.roll(x, 1, axis=1)  # neighbouring channels correlated
    return x.T @ x / tokens


def three_step(hessian: np.ndarray, dtype: str) -> np.ndarray:
    """The reference code's factor: the dampened Hessian's Cholesky factor, ``cholesky_inverse``, then the upper
    Cholesky factor of that inverse, in ``dtype``; float32 [K, K]."""
    import torch

    h = torch.from_numpy(np.array(hessian, dtype=dtype))
    diagonal = torch.diagonal(h)
    diagonal[diagonal == 0] = 1.0
    diagonal += DAMPING * torch.mean(diagonal)
    lower = torch.linalg.cholesky(h)
    return torch.linalg.cholesky(torch.cholesky_inverse(lower), upper=True).to(torch.float32).numpy()


def time_factor(method: str, width: int, threads: int) -> dict[str, float]:
    """One call of ``method`` on :func:`random_hessian` of ``width``: seconds, and the largest difference to the
    float64 three-step factor relative to its largest entry."""
    import torch

    torch.set_num_threads(threads)
    hessian = random_hessian(width)
    started = time.perf_counter()
    factor = inverse_cholesky(hessian) if method == "inverse_cholesky" else three_step(hessian, method[-7:])
    seconds = time.perf_counter() - started
    reference = factor if method == "three_step_float64" else three_step(hessian, "float64")
    return {"seconds": seconds, "relative_difference": float(np.abs(factor - reference).max() / np.abs(reference).max())}


def time_updates(k: int, n: int, threads: int) -> float:
    """Seconds of one :func:`~qwen_onnx.quantize.gptq.gptq_blocks` call at 4 bits, block 32, on a random weight
    float32 [k, n] with :func:`random_hessian` of ``k`` (its factor computed before the clock starts)."""
    import torch

    torch.set_num_threads(threads)
    hessian = random_hessian(k)
    factor = inverse_cholesky(hessian)
    weight = np.random.default_rng(1).normal(scale=0.02, size=(k, n)).astype(np.float32)
    started = time.perf_counter()
    gptq_blocks(weight, hessian, 4, 32, np.diag(hessian).copy(), threads, factor)
    return time.perf_counter() - started


def compare_updates(shapes: Sequence[tuple[int, int]], rounds: int = 3, threads: int = 2) -> dict[str, Any]:
    """Median seconds of :func:`time_updates` per shape ``(K, N)`` on 1 and ``threads`` threads over ``rounds``
    interleaved rounds, each call in a fresh process; ``speedup`` is the 1-thread median over the other."""
    jobs = [(f"{k}x{n}@{t}", time_updates, (k, n, t)) for k, n in shapes for t in (1, threads)]
    loads: list[list[dict[str, Any]]] = []
    results = interleaved_rounds(jobs, rounds, loads=loads)
    rows = []
    for i, (k, n) in enumerate(shapes):
        one, many = statistics.median(results[2 * i]), statistics.median(results[2 * i + 1])
        rows.append({"k": k, "n": n, "median_seconds": {"1": one, str(threads): many}, "speedup": one / many})
    return {"isa": machine_isa(), "threads": threads, "rounds": rounds, "rows": rows,
            "calls_beside_other_load": _busy(loads)}


def _busy(loads: list[list[dict[str, Any]]]) -> int:
    return sum(1 for job in loads for call in job if call["before"]["busy"] or call["during"]["busy"])


def compare(widths: Sequence[int], rounds: int = 3, threads: int = 2) -> dict[str, Any]:
    """Median seconds per factor of each method and width over ``rounds`` interleaved rounds, each call in a fresh
    process; ``speedup`` is the float64 three-step median over ``inverse_cholesky``'s, and
    ``calls_beside_other_load`` counts the calls the machine was busy around
    (:func:`qwen_onnx.measure.sitting.interleaved_rounds`' load records)."""
    jobs = [(f"{method}@{width}", time_factor, (method, width, threads)) for width in widths for method in METHODS]
    loads: list[list[dict[str, Any]]] = []
    results = interleaved_rounds(jobs, rounds, loads=loads)
    rows = []
    for width in widths:
        figures = {method: results[i] for i, (label, _, _) in enumerate(jobs) if label.endswith(f"@{width}")
                   for method in [label.split("@")[0]]}
        median = {method: statistics.median(f["seconds"] for f in calls) for method, calls in figures.items()}
        rows.append({"width": width, "median_seconds": median,
                     "speedup": median["three_step_float64"] / median["inverse_cholesky"],
                     "relative_difference": max(f["relative_difference"] for f in figures["inverse_cholesky"])})
    return {"isa": machine_isa(), "threads": threads, "rounds": rounds, "rows": rows,
            "calls_beside_other_load": _busy(loads)}


def _shape(text: str) -> tuple[int, int]:
    k, n = text.split("x")
    return int(k), int(n)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.gptq_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--widths", nargs="*", type=int, default=[1536, 4864, 8960],
                        help="Hessian widths K of the factor (default: the 1.5B's attention/MLP input, the 0.5B's "
                             "and the 1.5B's down_proj input; none: skip)")
    parser.add_argument("--shapes", nargs="*", type=_shape, default=[(4864, 896), (896, 4864)],
                        help="weight shapes KxN of the updates (default: the 0.5B's down_proj and gate_proj; none: "
                             "skip)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)

    def run(a: argparse.Namespace) -> dict[str, Any]:
        return {"factor": compare(a.widths, a.rounds, a.threads) if a.widths else None,
                "updates": compare_updates(a.shapes, a.rounds, a.threads) if a.shapes else None}

    return run_command("lab.gptq_cost", parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
