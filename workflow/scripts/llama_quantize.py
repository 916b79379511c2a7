"""Snakemake wrapper: llama.cpp's own quantizer on one model's hf folder (a same-start peer of the timing
sitting, built as its own job so that the sitting only measures)."""
from qwen_onnx.convert.llama_quantize import llama_quantize
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    llama_quantize(snakemake.input.hf, snakemake.output.model_dir, recipe=snakemake.wildcards.recipe,
                   threads=snakemake.threads)
