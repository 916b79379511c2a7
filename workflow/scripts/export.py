"""Snakemake wrapper: fp32 ONNX export through optimum-onnx or torch.onnx (export.exporter)."""
from qwen_onnx.convert.export import export_onnx
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    settings = snakemake.params.settings
    export_onnx(snakemake.input.hf, snakemake.output.model_dir, opset=settings["opset"], exporter=settings["exporter"])
