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
import qwen_onnx.settings.resources as resources
from qwen_onnx.store.task_results import current_task_files
import qwen_onnx.settings.options
import qwen_onnx.settings.variants
import qwen_onnx.convert.openvino_export
import qwen_onnx.run.tflite_env
import qwen_onnx.convert.llama_quantize
from qwen_onnx.settings.gates import DEFAULT_GATES, DEFAULT_TASK_GATE, variant_kind
from qwen_onnx.source.resolve import hub_snapshot_revision, source_files
from qwen_onnx.convert.tflite import conversion_rss_gib, tflite_skip_reason
from qwen_onnx.settings.defaults import HUMANEVAL_SIZE
from qwen_onnx.settings.timing import TimingSettings

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
# Above the other builds: each model's critical path, resolve -> optimize -> quantize_int4 (the longest job, its
# precision search) -> sitting. At the same priority as the rest, the 1.5B's int4 stage waited half an hour behind
# shorter builds while its input was ready, and the sittings with it; with the int4 stage alone above them, the
# 1.5B's optimize waited behind the 0.5B's builds instead (a rule's priority is not passed to its inputs), so its
# inputs share it (docs/measurements.md, "The span against the core bound").
CRITICAL_PRIORITY = 20
RESULTS = config.get("results", "results")
# The TFLite environment (.venv-tflite, envs/setup.sh): the jobs that convert, run or read the tflite variant do
# that work in its interpreter when LiteRT is not in their own environment (qwen_onnx.run.tflite_env). Named from
# the workflow's folder, as the OpenVINO export's interpreter, in every process that parses this file (a cluster
# job's own parse included), so that the job's scripts inherit it; a value set by the user wins.
TFLITE_PYTHON = str(qwen_onnx.run.tflite_env.tflite_python(workflow.basedir))
os.environ.setdefault(qwen_onnx.run.tflite_env.PYTHON_VARIABLE, TFLITE_PYTHON)


onstart:
    # temporary files of jobs killed in an earlier run (SIGKILL, OOM killer, power cut) go first;
    # here, not at parse time, so that -n, --lint and every cluster job's own parse write nothing
    qwen_onnx.store.staging.sweep_tree(RESULTS)


VARIANTS = list(
    qwen_onnx.settings.variants.NAMES
)  # the variant registry, src/qwen_onnx/settings/variants.py


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


def get_timing(model=None):
    """The timing settings (`latency` section) of a model, its own override merged over the global section; no
    model: the global section."""
    return TimingSettings.from_config(
        get_settings(model, "latency") if model else config["latency"]
    )


def get_reference_settings(model):
    """The evaluation settings that change the reference stage's output (the rest are the accuracy rule's)."""
    settings = get_settings(model, "evaluation")
    return {
        k: settings[k] for k in ("text", "window", "max_windows", "generation_tokens")
    }


def get_mem_mb(stage):
    """Declared memory of a stage's job, MB (qwen_onnx.settings.resources.mem_mb): from the model's
    parameter count, the kind of session a job holds, and GPTQ's Hessians for the int4 stage.
    """

    def mem_mb(wildcards):
        name = getattr(wildcards, "variant", None) or getattr(wildcards, "peer", "")
        return resources.mem_mb(
            stage,
            config["models"][wildcards.model]["params_billion"],
            session=name,
            int4_settings=(
                get_settings(wildcards.model, "quantize_int4")
                if stage == "quantize_int4"
                else None
            ),
        )

    return mem_mb


def get_runtime(stage):
    """Declared run time of a stage's job, minutes (qwen_onnx.settings.resources.runtime_min)."""

    def runtime(wildcards):
        return resources.runtime_min(
            stage, config["models"][wildcards.model]["params_billion"]
        )

    return runtime


def get_tflite_mem_mb(wildcards):
    """Declared memory of a model's tflite job, MB, from litert-torch's estimated peak."""
    settings = get_settings(wildcards.model, "tflite")
    return resources.tflite_mem_mb(
        conversion_rss_gib(
            config["models"][wildcards.model]["params_billion"],
            settings["rss_gib_per_billion_params"],
        )
    )


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
    return get_exclusive_threads(get_timing(wildcards.model).threads)


def get_peers_threads(wildcards):
    return get_exclusive_threads(get_timing(wildcards.model).threads)


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


def get_task_runtime(wildcards):
    """Declared run time of a task_accuracy job, minutes, from the problem count and the model's size."""
    return resources.task_runtime_min(
        task_problem_count(get_task_settings(wildcards.model)["problems"]),
        config["models"][wildcards.model]["params_billion"],
    )


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
            for stage in [
                *resources.MEM_GIB,
                *resources.SESSION_MEM_GIB,
            ]
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
