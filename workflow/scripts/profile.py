"""Snakemake wrapper: ONNX Runtime's time per op type on one variant."""
from qwen_onnx.measure.profile import profile_variant
from qwen_onnx.settings.timing import TimingSettings
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    profile_variant(
        snakemake.input.model_dir,
        snakemake.input.text,
        TimingSettings.from_config(snakemake.params.settings),
        output=snakemake.output.json,
    )
