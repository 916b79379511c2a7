"""Snakemake wrapper: graph inspection report (JSON and Markdown) of an ONNX or tflite variant."""
from qwen_onnx.store.artifacts import write_json, write_text
from qwen_onnx.measure.inspect_graph import inspect_variant
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    info, markdown = inspect_variant(snakemake.input.model_dir)
    write_json(snakemake.output.json, info)
    write_text(snakemake.output.markdown, markdown)
