"""Snakemake wrapper: resolve the model source to an fp32 Hugging Face folder."""
from qwen_onnx.source.resolve import resolve
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    resolve(snakemake.params.source, snakemake.output.hf, revision=snakemake.params.revision)
