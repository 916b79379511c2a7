"""Snakemake wrapper: onnxruntime quant_pre_process."""
from qwen_onnx.convert.export import preprocess
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    preprocess(
        snakemake.input.model_dir,
        snakemake.output.model_dir,
        skip_symbolic_shape=snakemake.params.settings["skip_symbolic_shape"],
    )
