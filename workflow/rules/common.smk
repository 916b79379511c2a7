import copy
import re

from snakemake.utils import validate

import qwen_onnx
from qwen_onnx.gates import variant_kind

validate(config, schema="../schemas/config.schema.yaml")

VERSION = qwen_onnx.__version__
RESULTS = config.get("results", "results")
VARIANTS = ["fp32", "preprocessed", "int8-dynamic", "int8-static", "optimized"]
STAGES = [
    "export",
    "preprocess",
    "quantize_dynamic",
    "quantize_static",
    "optimize",
    "evaluation",
    "latency",
]

# Peak RSS per GB of fp32 weights, measured on Qwen2.5-Coder-0.5B (0.49 B parameters, 1.97 GB fp32):
# resolve 3.8 GB, export 6.1 GB, quant_pre_process 8.2 GB, quantize_dynamic 7.9 GB,
# quantize_static about 10 GB, optimize 9.9 GB; accuracy holds PyTorch and ORT at once.
MEM_PER_FP32_GB = {
    "resolve": 2.2,
    "export": 3.3,
    "preprocess": 4.4,
    "quantize_dynamic": 4.3,
    "quantize_static": 5.5,
    "optimize": 5.3,
    "inspect": 0.0,
    "accuracy": 3.5,
    "latency": 2.5,
    "latency_pytorch": 2.0,
}


wildcard_constraints:
    model="|".join(re.escape(m) for m in config["models"]),
    variant="|".join(VARIANTS),


def get_models():
    """Short names of the models to build: `run` from the config, else all configured models."""
    run = config.get("run") or list(config["models"])
    unknown = [m for m in run if m not in config["models"]]
    if unknown:
        raise ValueError(
            f"config `run` names {', '.join(unknown)}, not in `models` ({', '.join(config['models'])})"
        )
    return run


def get_settings(model, section):
    """The global `section` of the config with the model's own override merged over it."""
    merged = copy.deepcopy(config.get(section, {}))
    merged.update(config["models"][model].get(section, {}))
    return merged


def get_mem_mb(stage):
    """Declared memory of a stage's job, in MB, from the model's parameter count."""

    def mem_mb(wildcards):
        fp32_gb = 4.0 * float(config["models"][wildcards.model]["params_billion"])
        return max(1000, int(1024 * (MEM_PER_FP32_GB[stage] * fp32_gb + 0.5)))

    return mem_mb


def get_exclusive_threads(measured):
    """Every core given to Snakemake, so that no other job runs beside a measurement.

    The measured code itself uses `measured` threads. On a cluster executor (no meaningful local
    core count) the job asks for `measured` only.
    """
    cores = workflow.cores
    if isinstance(cores, int) and 0 < cores < 1024:
        return max(measured, cores)
    return measured


def get_latency_threads(wildcards):
    return get_exclusive_threads(get_settings(wildcards.model, "latency")["threads"])


def get_gate(wildcards):
    """The accuracy gate ({figure: limit}) of the variant's kind for this model."""
    gates = get_settings(wildcards.model, "gates")
    return gates.get(variant_kind(wildcards.variant), {})


def get_variant_dir(wildcards):
    return f"{RESULTS}/{wildcards.model}/{wildcards.variant}"


def get_report_inputs(kind):
    """Every (model, variant) report file of one kind: inspect, accuracy or latency."""
    return expand(
        f"{RESULTS}/{{model}}/reports/{{variant}}.{kind}.json",
        model=get_models(),
        variant=VARIANTS,
    )


def get_diff_inputs():
    """The diff against fp32 of every other variant of every model."""
    return expand(
        f"{RESULTS}/{{model}}/reports/{{variant}}.diff.json",
        model=get_models(),
        variant=[v for v in VARIANTS if v != "fp32"],
    )


def get_final_targets():
    return [
        f"{RESULTS}/report.md",
        f"{RESULTS}/report.html",
        f"{RESULTS}/metrics.csv",
        f"{RESULTS}/metrics.json",
    ]
