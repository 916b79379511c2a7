"""Snakemake wrapper: the fp16 variant (onnxruntime float16 conversion, float32 I/O and KV cache)."""
from qwen_onnx.convert.float16 import convert_float16_variant
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    settings = snakemake.params.settings
    convert_float16_variant(
        snakemake.input.model_dir,
        snakemake.output.model_dir,
        blocked_ops=settings["blocked_ops"],
        blocked_nodes=settings["blocked_nodes"],
    )
