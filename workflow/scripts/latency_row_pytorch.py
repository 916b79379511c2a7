"""Snakemake wrapper: PyTorch eager fp32's latency report (the baseline), from the timing sitting."""
from qwen_onnx.measure.latency_row import latency_from_sitting
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    latency_from_sitting("pytorch", snakemake.input.sitting, output=snakemake.output.json)
