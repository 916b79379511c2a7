# qwen-onnx: Qwen checkpoint -> resolved fp32 folder -> fp32 ONNX export -> optimized (GroupQueryAttention) and
# preprocessed graphs -> int8-dynamic, int8-static, int8-mixed, int4, fp16 and tflite variants -> per variant
# inspection, accuracy against PyTorch, HumanEval pass@1 against fp32 and one timing sitting per model -> one report.
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
include: "workflow/rules/sitting.smk"
include: "workflow/rules/task.smk"
include: "workflow/rules/report.smk"


# Seconds-long jobs that only read reports or graph headers: on a cluster they run in the main
# Snakemake process instead of one submission each (about 27 per model).
localrules:
    inspect,
    diff,
    latency_row,
    latency_row_pytorch,
    report,
    task,


rule all:
    default_target: True
    input:
        get_final_targets(),


rule task:
    """HumanEval pass@1 of `task_accuracy.variants` (all 164 problems by default), each paired against fp32, and the report with their rows: `snakemake --cores 4 task`."""
    input:
        get_task_inputs(),
        get_final_targets(),
