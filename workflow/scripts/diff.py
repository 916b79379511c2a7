"""Snakemake wrapper: diff of one variant against fp32 (JSON and Markdown)."""
from qwen_onnx.store.artifacts import write_json, write_text
from qwen_onnx.measure.inspect_graph import diff_markdown, diff_models
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    diff = diff_models(snakemake.input.fp32, snakemake.input.model_dir)
    write_json(snakemake.output.json, diff)
    write_text(snakemake.output.markdown, diff_markdown(diff))
