"""Snakemake wrapper: latency of one variant: ONNX Runtime with its op profile, or the LiteRT interpreter for tflite."""
from qwen_onnx.latency import measure_latency, measure_tflite_latency
from qwen_onnx.snakemake_support import logged
from qwen_onnx.tflite import is_tflite_folder

with logged(snakemake):
    s = snakemake.params.settings
    protocol = {k: s[k] for k in ("prompt_lengths", "decode_prompt_tokens", "new_tokens", "threads", "warmup", "repeats")}
    if is_tflite_folder(snakemake.input.model_dir):
        measure_tflite_latency(snakemake.input.model_dir, snakemake.input.text, **protocol, output=snakemake.output.json)
    else:
        measure_latency(snakemake.input.model_dir, snakemake.input.text, **protocol, provider=s["provider"],
                        profile=s["profile"], output=snakemake.output.json)
