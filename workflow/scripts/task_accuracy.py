"""Snakemake wrapper: HumanEval pass@1 of one variant, paired against the fp32 variant's on the same problems."""
from qwen_onnx.measure.task_accuracy import task_accuracy
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    settings = snakemake.params.settings
    task_accuracy(
        snakemake.input.model_dir,
        snakemake.input.hf,
        reference=snakemake.input.reference or None,  # none for fp32: the reference itself
        problems=settings["problems"],
        max_new_tokens=settings["max_new_tokens"],
        timeout_s=settings["timeout_s"],
        memory_mb=settings["memory_mb"],
        threads=snakemake.threads,
        gate_limits=snakemake.params.gate,
        fail_on_gate=snakemake.params.fail_on_gate,
        name=snakemake.wildcards.variant,
        output=snakemake.output.json,
    )
