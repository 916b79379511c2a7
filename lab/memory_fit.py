"""Each stage's declared memory fitted on the peaks of published runs: an intercept and a slope per fp32 GB.

    python -m lab.memory_fit docs/measurements/2026-12-07-epyc-avx512vnni-*.md

Reads the pipeline tables of measurement pages (``qwen-onnx publish``'s "| model | job | wall s | CPU s | peak RSS
MiB | critical path |") and measures nothing. Per stage of ``MEM_GIB`` and ``SESSION_MEM_GIB`` (and, for accuracy, per kind of session,
:func:`qwen_onnx.settings.resources.session_kind`) it takes the largest peak of each model over the pages, takes
off GPTQ's Hessians where the model's int4 job had them on (``--gptq MODEL``), and fits the line through the two
models' peaks against their fp32 GB (:func:`qwen_onnx.settings.resources.fp32_gb`), its slope at least
:data:`MIN_SLOPE` and the line under neither peak. It prints the table that ``MEM_GIB`` in
``qwen_onnx.settings.resources`` is rounded up from, with the current declarations beside the peaks.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from qwen_onnx.settings import resources

#: The pipeline table's header in a published page.
HEADER = "| model | job | wall s | CPU s | peak RSS MiB | critical path |"
#: The least slope fitted, GiB per fp32 GB: a job holds its model's weights at least once in some precision.
MIN_SLOPE = 0.25
#: Parameters (billions) of the models the pages name, as ``config.yaml`` gives them.
PARAMS_BILLION = {"qwen2.5-coder-0.5b": 0.49, "qwen2.5-coder-1.5b": 1.54}
#: A variant of each kind of session.
KIND_NAME = {"float": "fp32", "quantized": "int4", "tflite": "tflite"}


def stage_key(job: str) -> str:
    """The key a job's peak is fitted under: its rule, and for accuracy the kind of session (``accuracy:float``)."""
    stage, _, name = job.partition(".")
    return f"{stage}:{resources.session_kind(name)}" if stage in resources.SESSION_MEM_GIB else stage


def read_peaks(pages: Sequence[Path]) -> dict[str, dict[str, float]]:
    """The largest peak RSS (MiB) of each stage key and model over the pipeline tables of ``pages``."""
    peaks: dict[str, dict[str, float]] = {}
    for page in pages:
        lines = page.read_text().splitlines()
        if HEADER not in lines:
            continue
        for line in lines[lines.index(HEADER) + 2:]:
            if not line.startswith("|"):
                break
            model, job, _, _, peak, _ = (cell.strip() for cell in line.strip("|").split("|"))
            stage = job.split(".")[0]
            if model in PARAMS_BILLION and peak and (stage in resources.MEM_GIB or stage in resources.SESSION_MEM_GIB):
                key = stage_key(job)
                peaks.setdefault(key, {})[model] = max(peaks.get(key, {}).get(model, 0.0), float(peak))
    return peaks


def fit(peaks_gib: Mapping[str, float], least_slope: float = MIN_SLOPE) -> tuple[float, float]:
    """(intercept GiB, slope GiB per fp32 GB) of the line through the models' peaks (GiB), as the docstring says."""
    (m0, p0), (m1, p1) = sorted(peaks_gib.items(), key=lambda kv: PARAMS_BILLION[kv[0]])
    x0, x1 = resources.fp32_gb(PARAMS_BILLION[m0]), resources.fp32_gb(PARAMS_BILLION[m1])
    slope = max((p1 - p0) / (x1 - x0), least_slope)
    return max(p0 - slope * x0, p1 - slope * x1), slope


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="+", type=Path)
    parser.add_argument("--gptq", action="append", default=["qwen2.5-coder-0.5b"],
                        help="a model whose int4 job ran GPTQ's updates (its Hessians are taken off the peak)")
    args = parser.parse_args(argv)
    peaks = read_peaks(args.pages)
    print("| stage | 0.5B peak MiB | 1.5B peak MiB | intercept GiB | GiB per fp32 GB | declared now 0.5B / 1.5B MB |")
    print("|---|---|---|---|---|---|")
    for key, by_model in sorted(peaks.items()):
        gib = {m: p / 1024 - (resources.GPTQ_GIB if key == "quantize_int4" and m in args.gptq else 0.0)
               for m, p in by_model.items()}
        stage, _, kind = key.partition(":")
        try:
            now = " / ".join(f"{resources.mem_mb(stage, PARAMS_BILLION[m], session=KIND_NAME.get(kind, '')):,}" for m in sorted(by_model))
        except KeyError:
            now = ""
        cells = [f"{by_model[m]:,.0f}" if m in by_model else "–" for m in PARAMS_BILLION]
        least = fit({m: p / 1024 for m, p in peaks["profile"].items()})[1] if key == "sitting" else MIN_SLOPE
        line = " | ".join(f"{v:.2f}" for v in fit(gib, least)) if len(gib) == 2 else "– | –"
        print(f"| {key} | {' | '.join(cells)} | {line} | {now} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

