import copy
import os
import importlib.util
import re
import sys
import types

import yaml

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

import qwen_onnx
import qwen_onnx.store.staging
from qwen_onnx.store.task_results import current_task_files
import qwen_onnx.settings.options
import qwen_onnx.settings.variants
import qwen_onnx.convert.openvino_export
import qwen_onnx.convert.llama_quantize
from qwen_onnx.settings.gates import DEFAULT_GATES, DEFAULT_TASK_GATE, variant_kind
from qwen_onnx.source.resolve import hub_snapshot_revision, source_files
from qwen_onnx.convert.tflite import conversion_rss_gib, tflite_skip_reason
from qwen_onnx.settings.defaults import HUMANEVAL_SIZE

# --config values nested in a mapping arrive as strings (export='{opset: 18}'): typed by the schema
with open(
    f"{workflow.current_basedir}/../schemas/config.schema.yaml", encoding="utf-8"
) as schema_file:
    qwen_onnx.settings.options.typed_config(config, yaml.safe_load(schema_file))

# A model's own stage sections override the global ones key by key, at every depth; keep them as written, since
# validation fills schema defaults into them too (which would override the global values).
MODEL_OVERRIDES = copy.deepcopy(config.get("models", {}))

# Numbers out of range answered in one line naming the range and the fix, as the CLI does (then the
# schema): a WorkflowError, so Snakemake reports it as it reports the schema's, and -n, --lint and every
# API caller get an error instead of an exit from inside the parse.
try:
    qwen_onnx.settings.options.check_config(config)
except qwen_onnx.settings.options.OptionError as exc:
    raise WorkflowError(f"qwen-onnx config: {exc}") from None
validate(config, schema="../schemas/config.schema.yaml")

VERSION = qwen_onnx.__version__
# The priority of the rules that build a variant and gate it (resolve to quantize, reference, accuracy): among
# ready jobs Snakemake starts these before the measuring ones (the sitting, profiles, peers), so each model's
# verified variants are on disk first (the report's pipeline section says when the first one was).
BUILD_PRIORITY = 10
RESULTS = config.get("results", "results")


onstart:
    # temporary files of jobs killed in an earlier run (SIGKILL, OOM killer, power cut) go first;
    # here, not at parse time, so that -n, --lint and every cluster job's own parse write nothing
    qwen_onnx.store.staging.sweep_tree(RESULTS)


VARIANTS = list(
    qwen_onnx.settings.variants.NAMES
)  # the variant registry, src/qwen_onnx/settings/variants.py

# Declared memory: 1000 MB plus this many MB per MB of fp32 weights (4 bytes x params_billion).
# Peak RSS measured (/usr/bin/time and the getrusage line at the end of each rule's log), 0.5B
# (1.97 GB fp32) / 1.5B (6.17 GB fp32): resolve 3.8 / 8.3 GB, export 6.0 / 12.7 GB, preprocess
# 2.8 / 7.3 GB, sensitivity 2.9 / 7.4 GB, quantize_dynamic 1.7 / 3.5 GB, quantize_static 3.4 /
# 8.0 GB, optimize 2.7 / 7.1 GB, accuracy 5.2 / 9.6 GB, latency 2.8 / 7.2 GB, quantize_int4
# 1.5 GB on the 0.5B (k_quant, /usr/bin/time; 1.5B not measured, declared like quantize_dynamic). Every declared
# optimize (the model builder) 3.5 / 6.8 GB. With IO binding and the new session settings the fp32
# and optimized latency jobs peaked at 5.2 GB on the 0.5B (int8/int4: 2.1 GB): latency and peers
# (whose children load one variant at a time) declared 2.7 per fp32 GB; the fp16 variant's latency job
# peaked at 6.9 GB on the 0.5B (probably float32 copies of the float16 weights made at load for the CPU
# kernels), so latency declares 3.3 per fp32 GB (7.6 GB for the 0.5B). Every declared
# value is above the measured peak for both sizes (by 15% or more); with the 23,622 MB (22 GiB) cap of the
# workflow profile a 1.5B export runs alone.
MEM_PER_FP32_GB = {  # GiB of peak RSS per GB of fp32 weights
    "resolve": 2.2,
    "export": 3.3,
    "preprocess": 1.8,
    "quantize_dynamic": 1.3,
    "quantize_static": 2.2,
    "quantize_mixed": 2.2,
    # the precision search (the default) holds every weight's 4-bit blocks at two block sizes beside one
    # candidate's session: 5.0 / 9.2 GiB measured on the 0.5B / 1.5B (/usr/bin/time, 2026-12-05, 492df53 and 9581a0f)
    "quantize_int4": 2.5,
    "sensitivity": 1.8,
    "optimize": 1.8,
    # fp32 graph and weights in memory, then their float16 copy and its serialisation: 6.5 GB measured
    # on the 0.5B (/usr/bin/time), 7.4 GB declared
    "float16": 3.3,
    # PyTorch fp32 (eager) + one window's logits: 3.5 GB measured on the 0.5B (1.97 GB fp32), 4.6 GB declared
    "reference": 1.8,
    # one profiled session of the variant (the fp16 variant's is the largest)
    "profile": 3.3,
    # the timing sitting: its children load one variant at a time, the fp16 one the largest
    # (15.2 GB on the 1.5B in a latency job, commit c64be30, 2026-12-02: 2.5 per fp32 GB), and the genai builder
    "sitting": 3.3,
    # the model builder again (as optimize: 3.5 / 6.8 GB), writing 4-bit MatMulNBits
    "genai_builder": 1.8,
    # optimum-intel's export in its own interpreter (torch's fp32 model, its OpenVINO conversion, NNCF): 3.4 GiB
    # measured on the 0.5B (/usr/bin/time, 2026-12-04), 5.2 GB declared
    "openvino_export": 2.0,
    # llama.cpp's quantizer: the float32 GGUF written from the hf folder (gguf-py holds every tensor until it
    # writes), then llama_model_quantize reading it memory-mapped
    "llama_quantize": 1.6,
}

# Declared run time (Snakemake's `runtime` resource, minutes; a cluster executor's time limit,
# SLURM's --time): 10 minutes plus 5x the wall time measured on the 2-core build machine per GB
# of fp32 weights, the larger of the 0.5B and 1.5B figures (benchmarks/*.tsv of a run
# before 2026-12-01): export 45 s (0.5B) / 401 s (1.5B), resolve 61 / 210 s, quantize_int4 56 / 250 s,
# accuracy 143 / 135 s, peers 378 s (0.5B). Local runs ignore it.
RUNTIME_MIN_PER_FP32_GB = {
    "resolve": 0.6,
    "export": 1.1,
    "preprocess": 0.2,
    "quantize_dynamic": 0.2,
    "quantize_static": 0.3,
    "quantize_mixed": 0.3,
    "quantize_int4": 5.2,  # the precision search: 7.9 / 31.5 min on the 0.5B / 1.5B (Xeon, 2026-12-05)
    "sensitivity": 0.4,
    "optimize": 0.3,
    "float16": 0.4,  # 44 s on the 0.5B
    "reference": 2.0,  # 6.6 min on the 0.5B at load ~7 (3.3 per GB): PyTorch logits and greedy generation
    "accuracy": 1.3,
    "profile": 0.5,  # one profiled session: a prefill and 16 decode steps
    # every variant, PyTorch and the peers, 3 rounds: 12 + 18 minutes (0.5B, 1.5B), commit c64be30, 2026-12-02,
    # for 5 of the 8 variants
    "sitting": 6.0,
    "genai_builder": 0.5,  # the builder's INT4 graph: the model builder as optimize, plus 4-bit RTN
    "openvino_export": 1.1,  # optimum-intel's export and NNCF's data-free INT4: 106 s on the 0.5B (busy machine)
    "llama_quantize": 0.5,  # writing the float32 GGUF, then llama.cpp's k-quant search
    "tflite": 0.9,  # 104 s for the 0.5B with litert-torch 0.10 (0.88 min per fp32 GB)
}

# The tflite conversion's memory is declared from its own measurement instead (get_tflite_mem_mb):
# litert-torch's estimated peak, params_billion x tflite.rss_gib_per_billion_params (26 GiB: 12,871 MiB
# measured on the 0.5B, commit c20bf2a, 2026-12-02), 15% headroom, and at least the 1.2 GiB measured converting the tiny test models
# (the tensorflow and litert-torch imports).
TFLITE_MIN_RSS_GIB = 1.2


wildcard_constraints:
    model="|".join(re.escape(m) for m in config["models"]),
    variant="|".join(VARIANTS),


def get_models():
    """Short names of the models to build: `run` from the config (checked above), else all configured models."""
    return config.get("run") or list(config["models"])


def get_settings(model, section):
    """The global `section` of the config with the model's own override merged over it."""
    return qwen_onnx.settings.options.model_section(
        config, MODEL_OVERRIDES, model, section
    )


def get_reference_settings(model):
    """The evaluation settings that change the reference stage's output (the rest are the accuracy rule's)."""
    settings = get_settings(model, "evaluation")
    return {
        k: settings[k] for k in ("text", "window", "max_windows", "generation_tokens")
    }


# Snakemake's mem_mb is in MB (10^6 bytes; it derives mem_mib from it); the peaks above are GiB
# (peak RSS in MiB / 1024), so each declared value is converted.
MB_PER_GIB = 2**30 / 10**6


# accuracy and task_accuracy hold one variant's (or peer's) session, whose memory follows the weights it
# runs: GiB per fp32 GB by that session's kind. Peak RSS of the main command at 3bb6b35 (2026-12-05, MiB,
# 0.5B / 1.5B): accuracy fp16 4198 / 8797, fp32 3858 / 7858, tflite 6677 / -, our INT8 and int4 run by
# OpenVINO 3493 / 6650, the other quantized variants and the peers at most 2674 / 3888; task_accuracy
# fp32 3058 / 7207, tflite 6122 / -, INT8 and int4 at most 1411 / 2614 (fp16, opt-in: 3.6 GB on the
# 0.5B). Each factor declares 15% or more above both. One factor for every session, as before, made
# each 1.5B job declare 16.8 GB: two of them never ran beside each other under the 22 GiB cap.
SESSION_MEM_PER_FP32_GB = {
    "accuracy": {"float": 2.0, "tflite": 3.4, "quantized": 1.6},
    "task_accuracy": {"float": 1.6, "tflite": 3.1, "quantized": 0.5},
}
FLOAT_SESSIONS = ("fp32", "preprocessed", "optimized", "fp16")


def session_kind(wildcards):
    """`float`, `tflite` or `quantized`: what a job's variant or peer holds in memory (a variant run
    by OpenVINO, VARIANT-openvino, as the variant)."""
    name = getattr(wildcards, "variant", None) or getattr(wildcards, "peer", "")
    name = name.removesuffix("-openvino")
    return (
        "tflite"
        if name == "tflite"
        else "float" if name in FLOAT_SESSIONS else "quantized"
    )


# GPTQ's Hessians (quantize_int4.gptq_updates): float32 [K, K] per MatMul input, at most
# qwen_onnx.quantize.gptq.BUDGET_BYTES (3 GiB) held at a time, plus the float64 arrays of the
# inverse Cholesky factor of the widest input (1.8 GiB at the 1.5B's 8960), whatever the model's size.
# Measured with them: 7,223 MiB on the 0.5B (one group), 13,178 MiB on the 1.5B (four), against about
# 5.0 and 10.7 GiB without (the main command at 1173653, AMD EPYC AVX-512 VNNI, 2026-12-05).
GPTQ_GIB = 3.5
# ... and with gptq_roles: [lm_head] one hidden x hidden Hessian (9 MiB at the 1.5B's 1536) and its float64
# factor: what the lm_head's GPTQ holds beside its weight is about what the block search holds instead.
GPTQ_LM_HEAD_GIB = 0.5


def gptq_gib(settings):
    """GiB that GPTQ's Hessians add to a model's int4 job, from its quantize_int4 settings."""
    if not (
        settings.get("gptq_updates") and settings.get("algorithm") == "k_quant_int"
    ):
        return 0.0
    roles = settings.get("gptq_roles")
    return (
        GPTQ_LM_HEAD_GIB
        if roles is not None and set(roles) <= {"lm_head"}
        else GPTQ_GIB
    )


def get_mem_mb(stage):
    """Declared memory of a stage's job, in MB, from the model's parameter count (and, for the jobs
    that hold one session, its kind: SESSION_MEM_PER_FP32_GB; for the int4 stage, GPTQ's Hessians).
    """

    def mem_mb(wildcards):
        fp32_gb = 4.0 * float(config["models"][wildcards.model]["params_billion"])
        per_gb = (
            SESSION_MEM_PER_FP32_GB[stage][session_kind(wildcards)]
            if stage in SESSION_MEM_PER_FP32_GB
            else MEM_PER_FP32_GB[stage]
        )
        int4 = (
            get_settings(wildcards.model, "quantize_int4")
            if stage == "quantize_int4"
            else {}
        )
        hessians = gptq_gib(int4)
        return int(1000 + MB_PER_GIB * (per_gb * fp32_gb + hessians))

    return mem_mb


def get_runtime(stage):
    """Declared run time of a stage's job, in minutes, from the model's parameter count."""

    def runtime(wildcards):
        fp32_gb = 4.0 * float(config["models"][wildcards.model]["params_billion"])
        return int(10 + 5 * RUNTIME_MIN_PER_FP32_GB[stage] * fp32_gb)

    return runtime


def get_tflite_mem_mb(wildcards):
    """Declared memory of a model's tflite job, in MB (see TFLITE_MIN_RSS_GIB above)."""
    settings = get_settings(wildcards.model, "tflite")
    gib = conversion_rss_gib(
        config["models"][wildcards.model]["params_billion"],
        settings["rss_gib_per_billion_params"],
    )
    return int(MB_PER_GIB * 1.15 * max(gib, TFLITE_MIN_RSS_GIB))


def get_tflite_settings(model):
    """The model's params_billion and tflite section: the inputs of the skip decision."""
    return {
        "params_billion": config["models"][model]["params_billion"],
        **get_settings(model, "tflite"),
    }


def tflite_scheduled(model):
    """Whether the workflow builds the model's tflite variant: enabled and within the memory
    budget (qwen_onnx.convert.tflite.tflite_skip_reason, which the report also reads).
    """
    settings = get_tflite_settings(model)
    return tflite_skip_reason(model, settings.pop("params_billion"), settings) is None


def get_built_variants(model):
    """The variants the config's `variants.built` asks for, in the registry's (the report's) order."""
    built = get_settings(model, "variants")["built"]
    return [v for v in VARIANTS if v in built]


def get_model_variants(model):
    """The variants built for a model: `variants.built`, tflite only when scheduled."""
    return [
        v for v in get_built_variants(model) if v != "tflite" or tflite_scheduled(model)
    ]


def get_timed_variants(model):
    """The variants of the model's timing sitting: the built ones that `variants.timed` names."""
    timed = get_settings(model, "variants")["timed"]
    return [v for v in get_model_variants(model) if v in timed]


def get_conda_env(wildcards):
    """A job's conda environment (--software-deployment-method conda): envs/tflite.yaml, which is
    envs/qwen-onnx.yaml plus litert-torch and ai-edge-litert, for a job that runs the tflite variant
    (its inspect, accuracy and latency jobs; peers when the model has one)."""
    variant = wildcards.get("variant")
    tflite = (
        variant == "tflite"
        if variant is not None
        else tflite_scheduled(wildcards.model)
    )
    return f"../../envs/{'tflite' if tflite else 'qwen-onnx'}.yaml"


def get_optimize_input(wildcards):
    """The optimize rule's input: the hf folder for the builder method, the fp32 variant otherwise."""
    method = get_settings(wildcards.model, "optimize").get("method", "builder")
    return f"{RESULTS}/{wildcards.model}/{'hf' if method == 'builder' else 'fp32'}"


def get_quantize_input(wildcards):
    """The float graph that sensitivity and every quantization start from: the optimized (fused)
    variant, or the pre-processed one when `optimize.quantize_fused` is false."""
    fused = get_settings(wildcards.model, "optimize").get("quantize_fused", True)
    return f"{RESULTS}/{wildcards.model}/{'optimized' if fused else 'preprocessed'}"


def get_sensitivity_input(section):
    """The model's sensitivity report, when the quantization `section` picks sensitive nodes from it."""

    def sensitivity(wildcards):
        sensitive = get_settings(wildcards.model, section).get("sensitive") or {}
        if int(sensitive.get("max_nodes", 0)) > 0:
            return f"{RESULTS}/{wildcards.model}/reports/sensitivity.json"
        return []

    return sensitivity


def get_int4_calibration_input(wildcards):
    """The calibration text of the int4 stage, when it calibrates (gptq, k_quant_int's importance)."""
    settings = get_settings(wildcards.model, "quantize_int4")
    calibrates = settings["algorithm"] == "gptq" or (
        settings["algorithm"] == "k_quant_int" and settings["importance_samples"] > 0
    )
    return settings["calibration_text"] if calibrates else []


# The measuring jobs (sitting, profile, machine) run alone on their node under SLURM (sbatch
# --exclusive): declared in the rules, not in profiles/slurm, because a command-line
# --set-resources replaces the profile's whole set-resources (snakemake#3429) and with it this.
# Other executors ignore the key; locally get_exclusive_threads gives the same.
MEASURING_NODE = "--exclusive"


def get_exclusive_threads(measured):
    """Every core given to Snakemake, so that no other job runs beside a measurement.

    The measured code itself uses `measured` threads. On a cluster executor, and in the job that
    a cluster runs (`--mode remote`, `--cores all` of whatever node it lands on), the job asks for
    `measured` only: exclusivity is the scheduler's (docs/cluster.md), and
    `workflow.cores` is undefined there without --cores.
    """
    if workflow.non_local_exec or workflow.remote_exec:
        return measured
    cores = workflow.resource_settings.cores
    if isinstance(cores, int) and 0 < cores < 1024:
        return max(measured, cores)
    return measured


def get_latency_threads(wildcards):
    return get_exclusive_threads(get_settings(wildcards.model, "latency")["threads"])


def get_peers_threads(wildcards):
    return get_exclusive_threads(get_settings(wildcards.model, "latency")["threads"])


def get_peers_variant_dirs(wildcards):
    """The ONNX variant folders of the model's timing sitting (`variants.timed`; the tflite folder
    comes as an input of its own, get_peers_tflite_input)."""
    onnx = {v.name for v in qwen_onnx.settings.variants.VARIANTS if v.format == "onnx"}
    return [
        f"{RESULTS}/{wildcards.model}/{v}"
        for v in get_timed_variants(wildcards.model)
        if v in onnx
    ]


def is_timed(wildcards):
    """Whether the variant is a row of its model's timing sitting (`variants.timed`)."""
    return wildcards.variant in get_timed_variants(wildcards.model)


def get_latency_row_input(wildcards):
    """A timed variant's row comes from the sitting, with its profile; an untimed one reads nothing."""
    if not is_timed(wildcards):
        return {}
    return {"sitting": f"{RESULTS}/{wildcards.model}/reports/peers.json"} | (
        {"profile": get_profile_input(wildcards)}
        if get_profile_input(wildcards)
        else {}
    )


def get_profile_input(wildcards):
    """A variant's ONNX Runtime profile (none for tflite: LiteRT has no per-op profile here)."""
    if qwen_onnx.settings.variants.variant(wildcards.variant).format != "onnx":
        return []
    return f"{RESULTS}/{wildcards.model}/reports/{wildcards.variant}.profile.json"


def get_peers_tflite_input(wildcards):
    """The model's tflite folder, measured by the sitting stage when the workflow builds and times it."""
    if "tflite" in get_timed_variants(wildcards.model):
        return f"{RESULTS}/{wildcards.model}/tflite"
    return []


def get_peers_genai_input(wildcards):
    """The builder's INT4 graph (rule genai_builder) when the sitting has a builder row; without
    onnxruntime-genai in this environment the sitting stage records the row as skipped instead.
    """
    peers = get_settings(wildcards.model, "peers")
    wanted = peers["enabled"] and (peers["genai_builder"] or peers["genai_builder_ort"])
    if wanted and importlib.util.find_spec("onnxruntime_genai") is not None:
        return f"{RESULTS}/{wildcards.model}/peers/genai-builder-int4"
    return []


# The accuracy_peer rule's peers: llama.cpp, the builder's graph, and any ONNX variant run by OpenVINO.
ONNX_VARIANTS = [
    v.name for v in qwen_onnx.settings.variants.VARIANTS if v.format == "onnx"
]
LLAMA_RECIPE_WILDCARD = "|".join(qwen_onnx.convert.llama_quantize.RECIPES)
ACCURACY_PEER_WILDCARD = "|".join(
    [
        "llama\\.cpp",
        *(f"llama\\.cpp-{r}" for r in qwen_onnx.convert.llama_quantize.RECIPES),
        "genai-builder-int4",
        "openvino-int4",
        *(re.escape(v) + "-openvino" for v in ONNX_VARIANTS),
    ]
)


def get_openvino_variants(model):
    """Our variants the model's timing sitting also runs with OpenVINO (`peers.openvino_variants`):
    the built ONNX ones, in the order listed, when the peers are enabled."""
    peers = get_settings(model, "peers")
    if not peers["enabled"]:
        return []
    built = get_model_variants(model)
    return [v for v in peers["openvino_variants"] if v in built and v in ONNX_VARIANTS]


def get_peers_openvino_dirs(wildcards):
    """The variant folders the sitting runs with OpenVINO as well (rows VARIANT-openvino)."""
    return [
        f"{RESULTS}/{wildcards.model}/{v}"
        for v in get_openvino_variants(wildcards.model)
    ]


def openvino_peer_variant(peer):
    """The variant of an OpenVINO peer (int4-openvino -> int4), None for the other peers."""
    return peer[: -len("-openvino")] if peer.endswith("-openvino") else None


def get_accuracy_peer_variant_input(wildcards):
    """An OpenVINO peer's variant folder (none for llama.cpp and the builder's graph)."""
    variant = openvino_peer_variant(wildcards.peer)
    return [] if variant is None else f"{RESULTS}/{wildcards.model}/{variant}"


def get_accuracy_peer_gate(wildcards):
    """A peer's gate: an OpenVINO row's is its variant's kind (int4's for int4-openvino), the others' int4."""
    variant = openvino_peer_variant(wildcards.peer)
    kind = "int4" if variant is None else variant_kind(variant)
    return get_settings(wildcards.model, "gates").get(kind, DEFAULT_GATES[kind])


def get_peers_openvino_ir_input(wildcards):
    """optimum-intel's INT4 IR (rule openvino_export) when the sitting has the openvino-int4 row."""
    peers = get_settings(wildcards.model, "peers")
    if peers["enabled"] and peers["openvino_int4"]:
        return f"{RESULTS}/{wildcards.model}/peers/openvino-int4"
    return []


def get_accuracy_peer_openvino_ir_input(wildcards):
    """optimum-intel's INT4 IR for the openvino-int4 peer's accuracy (none for the other peers)."""
    if wildcards.peer != "openvino-int4":
        return []
    return get_peers_openvino_ir_input(wildcards)


def get_peers_llama_cpp_dirs(wildcards):
    """llama.cpp's own quantizations of the hf folder (rule llama_quantize, peers.llama_cpp_recipes) when the
    peers are enabled and llama-cpp-python is installed here (else the sitting has no such rows).
    """
    peers = get_settings(wildcards.model, "peers")
    if not peers["enabled"] or importlib.util.find_spec("llama_cpp") is None:
        return []
    return [
        f"{RESULTS}/{wildcards.model}/peers/llama.cpp-{r}"
        for r in peers["llama_cpp_recipes"]
    ]


def get_accuracy_peer_llama_cpp_input(wildcards):
    """A same-start llama.cpp peer's folder (llama.cpp-RECIPE; none for the other peers)."""
    prefix = "llama.cpp-"
    if not wildcards.peer.startswith(prefix):
        return []
    return f"{RESULTS}/{wildcards.model}/peers/{wildcards.peer}"


def get_accuracy_peer_genai_input(wildcards):
    """The builder's INT4 graph for the genai-builder-int4 peer's accuracy (none for llama.cpp)."""
    if wildcards.peer != "genai-builder-int4":
        return []
    return get_peers_genai_input(wildcards)


def get_peer_accuracy_inputs():
    """Every model's peers' accuracy files: llama.cpp when enabled, the builder's graph when it is built,
    optimum-intel's IR, each variant run by OpenVINO."""
    out = []
    for model in get_models():
        peers = get_settings(model, "peers")
        if not peers["enabled"]:
            continue
        if peers["llama_cpp"]:
            out.append(f"{RESULTS}/{model}/reports/llama.cpp.accuracy.json")
        for folder in get_peers_llama_cpp_dirs(types.SimpleNamespace(model=model)):
            out.append(
                f"{RESULTS}/{model}/reports/{folder.rsplit('/', 1)[1]}.accuracy.json"
            )
        if get_peers_genai_input(types.SimpleNamespace(model=model)):
            out.append(f"{RESULTS}/{model}/reports/genai-builder-int4.accuracy.json")
        if get_peers_openvino_ir_input(types.SimpleNamespace(model=model)):
            out.append(f"{RESULTS}/{model}/reports/openvino-int4.accuracy.json")
        for variant in get_openvino_variants(model):
            out.append(f"{RESULTS}/{model}/reports/{variant}-openvino.accuracy.json")
    return out


def get_peers_inputs():
    """Every model's timing sitting (reports/peers.json)."""
    return expand(f"{RESULTS}/{{model}}/reports/peers.json", model=get_models())


def get_gate(wildcards):
    """The accuracy gate ({figure: limit}) of the variant's kind for this model (the defaults of
    qwen_onnx.settings.gates.DEFAULT_GATES when the config leaves the kind out); the tflite variant's kind
    follows tflite.quantize (qwen_onnx.settings.gates.tflite_gate_kind)."""
    gates = get_settings(wildcards.model, "gates")
    kind = variant_kind(
        wildcards.variant, get_settings(wildcards.model, "tflite")["quantize"]
    )
    return gates.get(kind, DEFAULT_GATES[kind])


def get_task_settings(model):
    """The task_accuracy settings that change a task.json (problems, generation and sandbox limits)."""
    settings = get_settings(model, "task_accuracy")
    return {
        k: settings[k] for k in ("problems", "max_new_tokens", "timeout_s", "memory_mb")
    }


def task_problem_count(problems):
    """How many HumanEval problems a task_accuracy.problems value names (`all`, a count or task ids)."""
    if isinstance(problems, (list, tuple)):
        return len(problems)
    if str(problems).strip().lower() == "all":
        return HUMANEVAL_SIZE
    return int(problems)


# Declared run time of a task_accuracy job: 10 minutes plus 5x the seconds per problem of the slowest shipped
# variant per GB of fp32 weights: fp16 on the 0.5B (1.97 GB fp32), a 320-token prompt's prefill (1.85 s) and the
# 104 tokens of an average answer at 12.6 tokens/s, 10.1 s or 5.1 s per GB (the 1.5B: 27 s, 4.4 s per GB); speeds
# from the idle timing sitting of 2026-12-04 (docs/measurements), lengths from the int8-dynamic 0.5B's answers
# to all 164 problems.
TASK_SECONDS_PER_PROBLEM_PER_FP32_GB = 5.1


def get_task_runtime(wildcards):
    """Declared run time of a task_accuracy job, minutes, from the problem count and the model's size."""
    fp32_gb = 4.0 * float(config["models"][wildcards.model]["params_billion"])
    problems = task_problem_count(get_task_settings(wildcards.model)["problems"])
    return int(10 + 5 * problems * TASK_SECONDS_PER_PROBLEM_PER_FP32_GB * fp32_gb / 60)


def get_task_reference(wildcards):
    """The reference's task results a variant is paired against: the fp32 variant's (none for fp32 itself)."""
    if wildcards.variant == "fp32":
        return []
    return f"{RESULTS}/{wildcards.model}/reports/fp32.task.json"


def get_task_gate(wildcards):
    """The task gate's limits for this model: the config's gates.task over qwen_onnx.settings.gates.DEFAULT_TASK_GATE;
    none for fp32, the reference, so that a changed gate reruns only the paired jobs.
    """
    if wildcards.get("variant") == "fp32":
        return {}
    return task_gate(wildcards.model)


def task_gate(model):
    """The task gate of a model's paired variants: gates.task over DEFAULT_TASK_GATE."""
    return {**DEFAULT_TASK_GATE, **get_settings(model, "gates").get("task", {})}


def get_task_inputs():
    """Every model's task results: the fp32 reference, the configured variants the workflow builds, the peers asked for."""
    out = []
    for model in get_models():
        settings = get_settings(model, "task_accuracy")
        if not settings["enabled"]:
            continue
        built = get_model_variants(model)
        variants = ["fp32", *(v for v in settings["variants"] if v != "fp32")]
        out += [
            f"{RESULTS}/{model}/reports/{v}.task.json" for v in variants if v in built
        ]
        out += [f"{RESULTS}/{model}/reports/{p}.task.json" for p in settings["peers"]]
    return out


def task_requested():
    """Whether this run names the `task` target (HumanEval is not part of the default run); known once the DAG
    is built, so only input and params functions may ask."""
    return "task" in getattr(workflow.dag_settings, "targets", ())


def task_results_on_disk():
    """Without the `task` target: the task results an earlier `task` run left, split into the current ones and a
    note for each other (qwen_onnx.store.task_results.current_task_files), so a default run never reruns HumanEval.
    """
    paths = [path for path in get_task_inputs() if os.path.exists(path)]
    settings = {m: get_task_settings(m) for m in get_models()}
    gates = {m: task_gate(m) for m in get_models()}
    return current_task_files(paths, settings, gates, VERSION)


def get_report_task_inputs():
    """The task results the report shows: all of them when the run names the `task` target, else the current
    ones an earlier `task` run left."""
    return get_task_inputs() if task_requested() else task_results_on_disk()[0]


def get_report_task_notes():
    """The report's line for each task result on disk that is no longer current (none with the `task` target)."""
    return [] if task_requested() else task_results_on_disk()[1]


def get_task_peer_genai_input(wildcards):
    """The builder's INT4 graph for the genai-builder-int4 peer's task accuracy, when onnxruntime-genai can build it."""
    if (
        wildcards.peer == "genai-builder-int4"
        and importlib.util.find_spec("onnxruntime_genai") is not None
    ):
        return f"{RESULTS}/{wildcards.model}/peers/genai-builder-int4"
    return []


def get_variant_dir(wildcards):
    return f"{RESULTS}/{wildcards.model}/{wildcards.variant}"


def get_report_inputs(kind):
    """Every (model, variant) report file of one kind: inspect, accuracy or latency, in
    (model, variant) order, each model's built variants only (get_model_variants)."""
    return [
        f"{RESULTS}/{model}/reports/{variant}.{kind}.json"
        for model in get_models()
        for variant in get_model_variants(model)
    ]


def get_diff_inputs():
    """The diff against fp32 of every other ONNX variant of every model (not tflite: no ONNX graph)."""
    return [
        f"{RESULTS}/{model}/reports/{variant}.diff.json"
        for model in get_models()
        for variant in get_model_variants(model)
        if variant in qwen_onnx.settings.variants.DIFFED
    ]


def get_final_targets():
    return [
        f"{RESULTS}/report.md",
        f"{RESULTS}/report.html",
        f"{RESULTS}/metrics.csv",
        f"{RESULTS}/metrics.json",
    ]


def memory_over_cap():
    """The jobs whose declared memory exceeds this run's `mem_mb` cap (profiles/default's 23,622
    MB, or --resources mem_mb=N), as one warning line each: Snakemake runs such a job as if it
    needed just the cap, without a word, and on a machine of that size it is then likely killed
    for memory. Cluster runs are not capped this way (each job asks its node for its own memory).
    """
    if workflow.non_local_exec or workflow.remote_exec:
        return []
    cap = getattr(workflow.global_resources.get("mem_mb"), "value", None)
    if not isinstance(cap, int):
        return []
    lines = []
    for model in get_models():
        # a float session: the session stages' largest but tflite's
        wildcards = types.SimpleNamespace(model=model, variant="fp32")
        over = {
            stage: get_mem_mb(stage)(wildcards)
            for stage in [*MEM_PER_FP32_GB, *SESSION_MEM_PER_FP32_GB]
        }
        over = {stage: mb for stage, mb in over.items() if mb > cap}
        if over:
            worst = max(over, key=over.get)
            lines.append(
                f"qwen-onnx: {model} (params_billion {config['models'][model]['params_billion']}) declares more memory "
                f"than this run's mem_mb cap of {cap:,} MB in {len(over)} stages ({worst} {over[worst]:,} MB); "
                "Snakemake would run them as if they needed the cap: use a machine with more memory "
                "(--resources mem_mb=N) or a cluster (profiles/slurm)"
            )
    return lines


for _line in memory_over_cap():
    sys.stderr.write(_line + "\n")
