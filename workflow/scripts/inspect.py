"""Snakemake wrapper: graph inspection report (JSON and Markdown)."""
from qwen_onnx.artifacts import write_json, write_text
from qwen_onnx.inspect_graph import inspect_model, to_markdown
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    info = inspect_model(snakemake.input.model_dir)
    write_json(snakemake.output.json, info)
    write_text(snakemake.output.markdown, to_markdown(info))
