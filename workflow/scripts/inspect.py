"""Snakemake wrapper: graph inspection report (JSON and Markdown)."""
from pathlib import Path

from qwen_onnx.artifacts import write_json
from qwen_onnx.inspect_graph import inspect_model, to_markdown
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    info = inspect_model(snakemake.input.model_dir)
    write_json(snakemake.output.json, info)
    Path(snakemake.output.markdown).write_text(to_markdown(info), encoding="utf-8")
