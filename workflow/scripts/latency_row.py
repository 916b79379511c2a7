"""Snakemake wrapper: one variant's latency report from the timing sitting, with its profile."""
from qwen_onnx.measure.latency_row import latency_from_sitting, untimed_latency
from qwen_onnx.settings.timing import TimingSettings
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    if not snakemake.params.timed:  # left out of the sitting by the config's variants.timed
        untimed_latency(snakemake.wildcards.variant, output=snakemake.output.json)
    else:
        latency_from_sitting(
            snakemake.wildcards.variant,
            snakemake.input.sitting,
            profile=snakemake.input.get("profile") or None,
            provider=TimingSettings.from_config(snakemake.params.settings).provider,
            output=snakemake.output.json,
        )
