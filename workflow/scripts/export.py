"""Snakemake wrapper: fp32 ONNX export through optimum-onnx."""
from qwen_onnx.export import export_onnx
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    export_onnx(snakemake.input.hf, snakemake.output.model_dir, opset=snakemake.params.settings["opset"])
