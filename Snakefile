# qwen-onnx: Qwen checkpoint -> fp32 ONNX -> preprocessed -> INT8 dynamic / static -> optimized -> reports.
# This file only wires things together; see workflow/rules/ and the qwen_onnx package.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/resolve.smk"
include: "workflow/rules/export.smk"
include: "workflow/rules/quantize.smk"
include: "workflow/rules/optimize.smk"
include: "workflow/rules/float16.smk"
include: "workflow/rules/tflite.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/peers.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        get_final_targets(),
