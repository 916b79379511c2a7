"""Snakemake wrapper: latency of PyTorch eager fp32, the baseline."""
from qwen_onnx.latency import measure_torch_latency
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    s = snakemake.params.settings
    measure_torch_latency(
        snakemake.input.hf,
        snakemake.input.text,
        prompt_lengths=s["prompt_lengths"],
        decode_prompt_tokens=s["decode_prompt_tokens"],
        new_tokens=s["new_tokens"],
        threads=s["threads"],
        warmup=s["warmup"],
        repeats=s["repeats"],
        output=snakemake.output.json,
    )
