"""A float start no quantizer has seen: a resolved checkpoint whose weights, dequantized from a GGUF's blocks,
get noise of a quarter of their block's step, so that no quantizer re-finds the source's grid.

A checkpoint resolved from a GGUF holds weights on that file's grids (:mod:`qwen_onnx.quantize.source_grid`):
a quantizer started there can land back on the grid it came from, and llama.cpp's own Q4_K_M did
(docs/peers.md, "Same start"). Here every 2-D weight found on a grid gets Gaussian noise of standard
deviation ``fraction x`` its block's step (:attr:`~qwen_onnx.quantize.source_grid.SourceGrid.scale`, one
value per block of 16 or 32 inputs, at most the tensor's 99th percentile of them; none on a block of one
value), from a fixed seed; other tensors (norms, biases, float weights) are
copied as they are. The folder is a Hugging Face checkpoint any stage reads (``source:`` in a config).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

from lab.command import run_command
from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.quantize.source_grid import weight_grid
from qwen_onnx.store.artifacts import require_hf_checkpoint, write_json

#: Noise per weight, as a fraction of its block's step.
FRACTION = 0.25


def noised_start(hf_dir: str | Path, output: str | Path, fraction: float = FRACTION, seed: int = 0) -> dict[str, Any]:
    """Write ``hf_dir``'s checkpoint to ``output`` with the weights on a source grid noised (module docstring).

    Returns:
        ``{"noised": {tensor: grid option}, "kept": [tensor names], "fraction", "seed"}``, also written to
        ``output/noised.json``.

    Raises:
        QwenOnnxError: ``hf_dir`` is no Hugging Face checkpoint with one ``model.safetensors``, ``output``
            exists, or no weight sits on a grid (a float source: nothing to noise).
    """
    from safetensors.numpy import load_file, save_file

    hf_dir, output = require_hf_checkpoint(hf_dir), Path(output)
    weights = hf_dir / "model.safetensors"
    if not weights.is_file():
        raise QwenOnnxError(f"{hf_dir} has no single model.safetensors; use the resolve stage's hf folder")
    if output.exists():
        raise QwenOnnxError(f"{output} exists; remove it or name another folder")
    rng = np.random.default_rng(seed)
    tensors = load_file(str(weights))
    noised, kept = {}, []
    for name, value in tensors.items():
        grid = weight_grid(np.ascontiguousarray(value.T)) if value.ndim == 2 else None
        if grid is None:
            kept.append(name)
            continue
        # a block of one value has no step of its own (the grid's scale there is a placeholder): no noise; a block of
        # two or three levels far apart (zeros and one outlier) may show a gap of many steps as its step: capped at
        # the tensor's 99th percentile of block steps
        constant = grid.codes.min(-1) == grid.codes.max(-1)
        cap = np.percentile(grid.scale[~constant], 99) if (~constant).any() else 0.0
        block_step = np.where(constant, 0.0, np.minimum(grid.scale, cap))
        step = np.repeat(block_step, grid.block, axis=1)  # [out, in]: each input's step
        tensors[name] = (value + rng.standard_normal(value.shape).astype(np.float32) * fraction * step).astype(
            value.dtype)
        noised[name] = f"{grid.bits}/{grid.block}"
    if not noised:
        raise QwenOnnxError(f"no weight of {hf_dir} sits on a source grid: a float start already")
    staging = output.with_name(output.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(hf_dir, staging, ignore=shutil.ignore_patterns("model.safetensors", "manifest.json", "source.json"))
    save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
    record = {"source": str(hf_dir), "fraction": fraction, "seed": seed, "noised": noised, "kept": kept}
    write_json(staging / "noised.json", record)
    staging.rename(output)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("hf_dir", help="a resolved checkpoint (results/MODEL/hf) from a GGUF source")
    parser.add_argument("output", help="the noised checkpoint's folder (must not exist)")
    parser.add_argument("--fraction", type=float, default=FRACTION, help="noise standard deviation per block step")
    parser.add_argument("--seed", type=int, default=0)

    def run(a):
        record = noised_start(a.hf_dir, a.output, a.fraction, a.seed)
        return {"noised": len(record["noised"]), "kept": len(record["kept"]), "output": a.output}

    return run_command("noised_start", parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
