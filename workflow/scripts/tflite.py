"""Snakemake wrapper: the tflite variant (LiteRT through litert-torch: prefill and decode signatures, fixed KV cache)."""
from qwen_onnx.snakemake_support import logged
from qwen_onnx.convert.tflite import convert_tflite

with logged(snakemake):
    settings = snakemake.params.settings
    convert_tflite(
        snakemake.input.hf,
        snakemake.output.model_dir,
        prefill_length=settings["prefill_length"],
        kv_cache_length=settings["kv_cache_length"],
        quantize=settings["quantize"],
        weight_only_roles=settings["weight_only_roles"],
    )
