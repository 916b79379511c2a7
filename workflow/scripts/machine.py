"""Snakemake wrapper: describe the machine and measure its memory bandwidth."""
from qwen_onnx.store.artifacts import write_json
from qwen_onnx.run.machine import describe_machine
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    write_json(snakemake.output.json, describe_machine(snakemake.params.threads))
