"""What each workflow job declares to a scheduler: its memory (Snakemake's ``mem_mb``, MB of 10^6 bytes) and its
run time (``runtime``, minutes), from the model's parameter count.

The workflow (``workflow/rules/common.smk``) asks this module for every job's resources; a local run caps the
sum of ``mem_mb`` of the jobs running together (``profiles/default``), a cluster executor passes both to its
scheduler (SLURM's ``--mem`` and ``--time``). A job's memory is a line in the model's fp32 GB, an intercept (the
interpreter, its libraries, the buffers that do not grow with the model) and a slope, fitted through the largest
peak resident sets of the embedded 0.5B and 1.5B over the published runs (``python -m lab.memory_fit``), with
:data:`HEADROOM` over it; run times are per GB of fp32 weights. The measurements behind both are in
docs/cluster.md ("Peak RSS per job", "Run time per job").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: MB (10^6 bytes, Snakemake's ``mem_mb``) per GiB (the unit of the peaks measured).
MB_PER_GIB = 2**30 / 10**6

#: Peak resident set by stage: (GiB, GiB per GB of fp32 weights), rounded up from ``python -m lab.memory_fit``.
MEM_GIB: Mapping[str, tuple[float, float]] = {
    "resolve": (2.0, 1.2),
    "export": (2.3, 2.1),
    "preprocess": (0.8, 1.1),
    "quantize_dynamic": (1.0, 0.4),
    "quantize_static": (0.9, 1.1),
    "quantize_mixed": (0.8, 1.1),
    "quantize_int4": (0.4, 2.0),  # every weight's 4-bit blocks at two block sizes beside one candidate's session
    "sensitivity": (1.3, 1.0),
    "optimize": (1.7, 1.2),
    "float16": (1.3, 2.6),  # the fp32 graph, its float16 copy and its serialisation
    "reference": (2.6, 0.9),  # PyTorch fp32 (eager) and one window's logits
    "profile": (0.8, 1.2),  # one profiled session of the variant (fp32's is the largest)
    "sitting": (3.6, 1.2),  # its children load one variant at a time: the slope of fp32's profiled session
    "genai_builder": (2.3, 2.4),  # the model builder, writing 4-bit MatMulNBits
    "openvino_export": (1.2, 1.2),  # optimum-intel's export in its own interpreter: torch fp32, the conversion, NNCF
    "llama_quantize": (2.7, 1.1),  # gguf-py holds every tensor of the float32 GGUF until it writes
}

#: Jobs that hold one variant's (or peer's) session, by what the session holds (:func:`session_kind`). One line
#: for all would make a quantized 1.5B session declare a float one's memory. tflite's only from the 0.5B.
SESSION_MEM_GIB: Mapping[str, Mapping[str, tuple[float, float]]] = {
    "accuracy": {"float": (2.2, 1.1), "tflite": (0.8, 3.0), "quantized": (2.1, 0.8)},
    "task_accuracy": {"float": (1.4, 1.1), "tflite": (0.8, 2.7), "quantized": (0.9, 0.3)},
}
#: The variants whose sessions hold float weights.
FLOAT_SESSIONS = ("fp32", "preprocessed", "optimized", "fp16")

#: GiB that GPTQ's Hessians add to the int4 job (``quantize_int4.gptq_updates``): float32 [K, K] per MatMul
#: input, at most :data:`qwen_onnx.quantize.gptq.BUDGET_BYTES` (3 GiB) at a time, plus the float64 inverse
#: Cholesky factor of the widest input.
GPTQ_GIB = 3.5
#: ... with ``gptq_roles: [lm_head]``: one hidden x hidden Hessian and its factor.
GPTQ_LM_HEAD_GIB = 0.5

#: The tflite conversion's least declared peak, GiB (the tensorflow and litert-torch imports); above it the
#: estimate of :func:`qwen_onnx.convert.tflite.conversion_rss_gib`.
TFLITE_MIN_RSS_GIB = 1.2
#: Headroom over a measured or estimated peak.
HEADROOM = 1.15

#: Minutes of wall time per GB of fp32 weights on a 2-core machine, by stage; a job declares 10 minutes plus
#: 5 times this (:func:`runtime_min`).
RUNTIME_MIN_PER_FP32_GB: Mapping[str, float] = {
    "resolve": 0.6,
    "export": 1.1,
    "preprocess": 0.2,
    "quantize_dynamic": 0.2,
    "quantize_static": 0.3,
    "quantize_mixed": 0.3,
    "quantize_int4": 5.2,  # the precision search
    "sensitivity": 0.4,
    "optimize": 0.3,
    "float16": 0.4,
    "reference": 2.0,  # PyTorch logits and greedy generation
    "accuracy": 1.3,
    "profile": 0.5,  # one profiled session: a prefill and 16 decode steps
    "sitting": 6.0,  # every timed variant, PyTorch and the peers, 3 rounds
    "genai_builder": 0.5,
    "openvino_export": 1.1,
    "llama_quantize": 0.5,
    "tflite": 0.9,
}
#: Seconds per HumanEval problem per GB of fp32 weights of the slowest shipped variant (a prompt's prefill and
#: an average answer's decode); a task_accuracy job declares 10 minutes plus 5 times its problems' worth.
TASK_SECONDS_PER_PROBLEM_PER_FP32_GB = 5.1


def fp32_gb(params_billion: float) -> float:
    """GB of a model's fp32 weights: 4 bytes per parameter."""
    return 4.0 * float(params_billion)


def session_kind(name: str) -> str:
    """``float``, ``tflite`` or ``quantized``: what the session of a variant or peer ``name`` holds in memory (a
    variant run by OpenVINO, ``VARIANT-openvino``, as the variant)."""
    name = name.removesuffix("-openvino")
    return "tflite" if name == "tflite" else "float" if name in FLOAT_SESSIONS else "quantized"


def gptq_gib(int4_settings: Mapping[str, Any]) -> float:
    """GiB that GPTQ's Hessians add to a model's int4 job, from its ``quantize_int4`` settings."""
    if not (int4_settings.get("gptq_updates") and int4_settings.get("algorithm") == "k_quant_int"):
        return 0.0
    roles = int4_settings.get("gptq_roles")
    return GPTQ_LM_HEAD_GIB if roles is not None and set(roles) <= {"lm_head"} else GPTQ_GIB


def mem_mb(stage: str, params_billion: float, *, session: str = "", int4_settings: Mapping[str, Any] | None = None
           ) -> int:
    """Declared memory of a stage's job, MB: :data:`HEADROOM` times its line (:data:`MEM_GIB`) at the model's fp32
    GB, plus GPTQ's Hessians for an int4 job that has them.

    Args:
        stage: the rule (a key of :data:`MEM_GIB` or :data:`SESSION_MEM_GIB`).
        params_billion: the model's parameter count, billions.
        session: for a session stage, the variant or peer it runs (:func:`session_kind`).
        int4_settings: for ``quantize_int4``, its settings (GPTQ's Hessians: :func:`gptq_gib`).

    Raises:
        KeyError: a stage this module has no factor for.
    """
    intercept, slope = (SESSION_MEM_GIB[stage][session_kind(session)] if stage in SESSION_MEM_GIB
                        else MEM_GIB[stage])
    hessians = gptq_gib(int4_settings or {}) if stage == "quantize_int4" else 0.0
    return int(MB_PER_GIB * (HEADROOM * (intercept + slope * fp32_gb(params_billion)) + hessians))


def tflite_mem_mb(conversion_gib: float) -> int:
    """Declared memory of a tflite conversion, MB, from its estimated peak (GiB), with :data:`HEADROOM`."""
    return int(MB_PER_GIB * HEADROOM * max(float(conversion_gib), TFLITE_MIN_RSS_GIB))


def runtime_min(stage: str, params_billion: float) -> int:
    """Declared run time of a stage's job, minutes: 10 plus 5 times :data:`RUNTIME_MIN_PER_FP32_GB`'s share.

    Raises:
        KeyError: a stage this module has no factor for.
    """
    return int(10 + 5 * RUNTIME_MIN_PER_FP32_GB[stage] * fp32_gb(params_billion))


def task_runtime_min(problems: int, params_billion: float) -> int:
    """Declared run time of a task_accuracy job on ``problems`` HumanEval problems, minutes."""
    return int(10 + 5 * problems * TASK_SECONDS_PER_PROBLEM_PER_FP32_GB * fp32_gb(params_billion) / 60)
