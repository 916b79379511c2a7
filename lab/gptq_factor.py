"""GPTQ's inverse-Hessian factor: ``qwen_onnx.quantize.gptq.inverse_cholesky`` (the reference code's three steps,
``cholesky(cholesky_inverse(cholesky(H)), upper=True)``, in float32 as the reference code) against the same
steps in float64 (as this project computed them before), on random Hessians of a decoder's MatMul input widths:
seconds per factor and the largest difference to the float64 factor, in interleaved rounds, each call in its
own process."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Sequence

import numpy as np

from lab.command import run_command
from qwen_onnx.measure.sitting import interleaved_rounds
from qwen_onnx.quantize.gptq import DAMPING, inverse_cholesky
from qwen_onnx.run.machine import machine_isa

METHODS = ("inverse_cholesky", "three_step_float64")


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
    busy = sum(1 for job in loads for call in job if call["before"]["busy"] or call["during"]["busy"])
    return {"isa": machine_isa(), "threads": threads, "rounds": rounds, "rows": rows,
            "calls_beside_other_load": busy}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.gptq_factor", description=__doc__)
    parser.add_argument("widths", nargs="*", type=int, default=[1536, 4864, 8960],
                        help="Hessian widths K (default: the 1.5B's attention/MLP input, the 0.5B's and the 1.5B's "
                             "down_proj input)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    return run_command("lab.gptq_factor", parser, lambda a: compare(a.widths, a.rounds, a.threads), argv)


if __name__ == "__main__":
    sys.exit(main())
