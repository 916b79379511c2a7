"""Snakemake wrapper: onnxruntime-genai's model builder INT4 graph of one model (a peer of the
timing sitting, built as its own job so that the sitting only measures; a failed build is
recorded and the sitting reports the row as skipped with the builder's message)."""
from qwen_onnx.convert.genai_builder import build_genai_int4
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    build_genai_int4(snakemake.input.hf, snakemake.output.model_dir, keep_failure=True)
