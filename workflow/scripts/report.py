"""Snakemake wrapper: the combined report (report.md, metrics.csv, metrics.json)."""
import itertools

from qwen_onnx.report import collect_rows, write_report
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    keys = list(itertools.product(snakemake.params.models, snakemake.params.variants))
    entries = [
        (model, variant, i, a, lat)
        for (model, variant), i, a, lat in zip(
            keys, snakemake.input.inspect, snakemake.input.accuracy, snakemake.input.latency
        )
    ]
    rows = collect_rows(entries)
    write_report(rows, snakemake.output.markdown, snakemake.output.csv, snakemake.output.json)
