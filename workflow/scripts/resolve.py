"""Snakemake wrapper: resolve the model source to an fp32 Hugging Face folder."""
from qwen_onnx.snakemake_support import logged
from qwen_onnx.source.resolve import resolve

with logged(snakemake):
    resolve(snakemake.params.source, snakemake.output.hf, revision=snakemake.params.revision)
