"""Snakemake wrapper: latency and ONNX Runtime profile of one variant."""
from qwen_onnx.latency import measure_latency
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    s = snakemake.params.settings
    measure_latency(
        snakemake.input.model_dir,
        snakemake.input.text,
        prompt_lengths=s["prompt_lengths"],
        decode_prompt_tokens=s["decode_prompt_tokens"],
        new_tokens=s["new_tokens"],
        threads=s["threads"],
        provider=s["provider"],
        warmup=s["warmup"],
        repeats=s["repeats"],
        profile=s["profile"],
        output=snakemake.output.json,
    )
