"""Snakemake wrapper: accuracy, parity and gate of one variant against PyTorch fp32."""
from qwen_onnx.accuracy import evaluate_accuracy
from qwen_onnx.gates import variant_kind
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    settings = snakemake.params.settings
    evaluate_accuracy(
        snakemake.input.model_dir,
        snakemake.input.hf,
        snakemake.input.text,
        window=settings["window"],
        max_windows=settings["max_windows"],
        kv_decode_steps=settings["kv_decode_steps"],
        generation_tokens=settings["generation_tokens"],
        threads=snakemake.threads,
        gate_limits=snakemake.params.gate,
        gate_kind=variant_kind(snakemake.wildcards.variant),
        fail_on_gate=snakemake.params.fail_on_gate,
        output=snakemake.output.json,
    )
