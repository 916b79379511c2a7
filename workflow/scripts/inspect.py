"""Snakemake wrapper: graph inspection report (JSON and Markdown) of an ONNX or tflite variant."""
from qwen_onnx.artifacts import write_json, write_text
from qwen_onnx.inspect_graph import inspect_model, to_markdown
from qwen_onnx.snakemake_support import logged
from qwen_onnx.tflite import inspect_tflite, inspect_tflite_markdown, is_tflite_folder

with logged(snakemake):
    folder = snakemake.input.model_dir
    tflite = is_tflite_folder(folder)
    info = inspect_tflite(folder) if tflite else inspect_model(folder)
    write_json(snakemake.output.json, info)
    write_text(snakemake.output.markdown, (inspect_tflite_markdown if tflite else to_markdown)(info))
