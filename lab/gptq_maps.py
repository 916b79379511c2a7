"""GPTQ's updates on the k-quant grid against the block search alone, on fixed int4 precision maps of one model.

For each precision map and each count of calibration windows, the int4 variant is built twice from the run's
``optimized`` graph, by :func:`qwen_onnx.quantize.int4.quantize_int4_variant` as the int4 stage builds it: with
``k_quant_int`` and its activation importance alone, and with GPTQ's updates on the same grid
(:class:`qwen_onnx.quantize.gptq.Hessians` of the same windows). Each is scored against the run's PyTorch
reference by the accuracy stage's own code (:func:`qwen_onnx.measure.accuracy.accuracy_from_reference`: the
evaluation windows the report scores), then deleted.

Maps: ``shipped`` (the run's searched int4, from its ``quantize.json``), ``mlp-attention-4bit`` (every
MatMul 4-bit at block 32 but the lm_head, 8-bit at block 128) and ``all-4bit`` (the lm_head 4-bit too).
Weight bytes per token are :func:`qwen_onnx.quantize.precision_search.weight_bytes`. Accuracy figures are
deterministic; the seconds are the build's on the machine at hand.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from dataclasses import fields
from pathlib import Path

import onnx

from lab.command import run_command
from qwen_onnx.measure.accuracy import accuracy_from_reference
from qwen_onnx.quantize.gptq import Hessians
from qwen_onnx.quantize.int4 import Int4Settings, importance_windows, quantize_int4_variant
from qwen_onnx.quantize.matmuls import weight_matmuls
from qwen_onnx.quantize.precision_search import weight_bytes
from qwen_onnx.run.machine import machine_isa
from qwen_onnx.settings.gates import default_gate
from qwen_onnx.store.artifacts import read_json

MAPS = ("shipped", "mlp-attention-4bit", "all-4bit")


def precision_maps(run: Path) -> dict[str, dict[str, str]]:
    """The maps of the module docstring, ``{map: {MatMul name: "bits/block"}}``, from the run's int4 ``quantize.json``."""
    shipped = read_json(run / "int4" / "quantize.json")
    head = shipped["lm_head"]
    return {
        "shipped": shipped["precision"],
        "mlp-attention-4bit": {n: "8/128" if n == head else "4/32" for n in shipped["precision"]},
        "all-4bit": {n: "4/32" for n in shipped["precision"]},
    }


def run(a: argparse.Namespace) -> dict:
    results = Path(a.results)
    source = results / "optimized"
    graph = onnx.load(str(source / "model.onnx"), load_external_data=False).graph
    matmuls = weight_matmuls(graph)
    sizes = {node.name: int(tensor.dims[0]) * int(tensor.dims[1]) for node, tensor in matmuls}
    maps = precision_maps(results)
    known = {f.name for f in fields(Int4Settings)}
    base = Int4Settings(**{k: v for k, v in read_json(results / "int4" / "quantize.json")["settings"].items()
                           if k in known})
    work = Path(a.work_dir)
    rows = []
    for count in a.windows:
        settings = Int4Settings(**{**vars(base), "importance_samples": count, "search": False})
        windows = importance_windows(source, settings)
        hessians = Hessians(source, windows, matmuls)
        importance = hessians.importance()
        for name in a.maps:
            for gptq in (False, True):
                folder = work / f"int4-{name}-{count}-{'gptq' if gptq else 'kquant'}"
                started = time.time()
                quantize_int4_variant(source, folder, Int4Settings(**{**vars(settings), "gptq_updates": gptq}),
                                      source_info=results / "hf" / "source.json", precision=maps[name],
                                      importance=importance, hessians=hessians if gptq else None)
                seconds = time.time() - started
                figures = accuracy_from_reference(folder, results / "reference", gate_limits=default_gate("int4"),
                                                  gate_kind="int4")
                rows.append({"map": name, "windows": count, "gptq_updates": gptq,
                             "weight_mb_per_token": round(weight_bytes(maps[name], sizes) / 1e6, 1),
                             **{k: figures[k] for k in ("ppl_delta_pct", "kl_mean", "top1_pct", "gate")},
                             "build_s": round(seconds, 1)})
                print(rows[-1], file=sys.stderr, flush=True)
                shutil.rmtree(folder)
    return {"isa": machine_isa(), "rows": rows}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="GPTQ's updates against the k-quant block search alone, on fixed int4 maps")
    p.add_argument("results", help="results/MODEL of a finished run (optimized, int4, hf, reference)")
    p.add_argument("--work-dir", required=True, help="where each variant is built, then deleted")
    p.add_argument("--windows", type=int, nargs="+", default=[16, 64], help="calibration windows of 128 tokens")
    p.add_argument("--maps", nargs="+", choices=MAPS, default=list(MAPS))
    return p


def main(argv: list[str] | None = None) -> int:
    return run_command("lab.gptq_maps", build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
