"""Snakemake wrapper: latency of one variant."""
from qwen_onnx.latency import measure_latency
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    settings = snakemake.params.settings
    measure_latency(
        snakemake.input.model_dir,
        snakemake.input.text,
        prompt_tokens=settings["prompt_tokens"],
        new_tokens=settings["new_tokens"],
        threads=settings["threads"],
        provider=settings["provider"],
        warmup=settings["warmup"],
        repeats=settings["repeats"],
        output=snakemake.output.json,
    )
