"""The OpenVINO rows of the timing sitting, each measured in its own process by :mod:`qwen_onnx.measure.latency`'s
protocol (:func:`qwen_onnx.measure.latency.timing_protocol`, :class:`qwen_onnx.settings.timing.TimingSettings`):

- ``{variant}-openvino``: our variant folder run by OpenVINO's CPU plugin through
  :class:`qwen_onnx.run.openvino.OpenVinoCausalLM` (the same graph, f32 precision hint, the sitting's threads);
- ``openvino-int4``: OpenVINO's own route, optimum-intel's INT4 IR of the Hugging Face folder
  (:mod:`qwen_onnx.convert.openvino_export`) run by openvino-genai's ``LLMPipeline`` as a user runs it (the
  plugin's defaults, the sitting's threads as ``INFERENCE_NUM_THREADS``), with prefix caching off so that
  every prefill computes its whole prompt, as in the other rows.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from qwen_onnx.measure.latency import sitting_measurement
from qwen_onnx.measure.peers_table import OPENVINO_INT4, openvino_row
from qwen_onnx.measure.sitting import ChildCrashed, run_in_child
from qwen_onnx.run.openvino import INSTALL_HINT, PRECISION, OpenVinoCausalLM
from qwen_onnx.run.openvino_ir import is_openvino_ir
from qwen_onnx.settings.timing import TimingSettings
from qwen_onnx.store.artifacts import folder_bytes, read_json
from qwen_onnx.store.provenance import package_version

#: The runtime column of the ``{variant}-openvino`` rows.
VARIANT_RUNTIME = f"OpenVINO CPU, {PRECISION} (qwen-onnx OpenVinoCausalLM)"
#: The runtime column of the ``openvino-int4`` row.
GENAI_RUNTIME = "openvino-genai (LLMPipeline)"
#: How to install openvino-genai (the ``openvino-int4`` row's runtime).
GENAI_INSTALL_HINT = "envs/setup.sh --peers"


def variant_row(folder: str | os.PathLike, tokens: np.ndarray, timing: TimingSettings, *,
                installed: bool) -> dict[str, Any]:
    """The sitting's row of our variant ``folder`` run by OpenVINO (``peer``, ``runtime``, ``path``, ``bytes_on_disk``,
    ``job`` or ``skipped``, and the row's config: :meth:`OpenVinoCausalLM.report` of the graph compiled once in a
    child). Skipped with one line when openvino is not ``installed``, OpenVINO does not compile the graph, or
    the compiling process dies."""
    row = {"peer": openvino_row(Path(folder).name), "runtime": VARIANT_RUNTIME, "path": None, "bytes_on_disk": None}
    if not installed:
        return {**row, "skipped": f"openvino not installed: {INSTALL_HINT}"}
    try:
        report = run_in_child(openvino_report, os.fspath(folder), timing.threads)
    except ChildCrashed as exc:
        return {**row, "skipped": f"OpenVINO crashed compiling {folder}: the process was {exc}"}
    except RuntimeError as exc:  # the child's error, "Type: message"
        return {**row, "skipped": str(exc).removeprefix("RunnerError: ")}
    return {**report, **row, "path": os.fspath(folder), "bytes_on_disk": folder_bytes(folder),
            "job": (measure_openvino, (os.fspath(folder), tokens, timing))}


def genai_row(folder: str | os.PathLike, tokens: np.ndarray, timing: TimingSettings, *,
              installed: bool) -> dict[str, Any]:
    """The sitting's ``openvino-int4`` row: optimum-intel's IR in ``folder`` run by openvino-genai (keys as
    :func:`variant_row`; config :func:`openvino_genai_config`). Skipped with one line when openvino-genai is not
    ``installed``, the export failed (its recorded error), or there is no IR."""
    ir = Path(folder)
    row = {"peer": OPENVINO_INT4, "runtime": GENAI_RUNTIME, "path": None, "bytes_on_disk": None}
    record = read_json(ir / "export.json") if (ir / "export.json").is_file() else {}
    if not installed:
        return {**row, "skipped": f"openvino-genai not installed: {GENAI_INSTALL_HINT}"}
    if record.get("error"):
        return {**row, "skipped": f"export failed: {record['error']}"}
    if not is_openvino_ir(ir):
        return {**row, "skipped": f"no OpenVINO IR at {ir}: the openvino_export stage writes it"}
    return {**openvino_genai_config(ir), **row, "path": os.fspath(ir),
            "bytes_on_disk": sum(p.stat().st_size for p in ir.glob("openvino_model.*")),
            "job": (measure_openvino_genai, (os.fspath(ir), tokens, timing))}


def openvino_report(folder: str, threads: int) -> dict[str, Any]:
    """OpenVINO's report on ``folder`` compiled for the sitting (:meth:`OpenVinoCausalLM.report`)."""
    return OpenVinoCausalLM(folder, threads=threads).report()


def measure_openvino(folder: str, tokens: np.ndarray, timing: TimingSettings) -> dict[str, Any]:
    """Our variant run by OpenVINO's CPU plugin at ``timing.threads``: prefill = one ``forward`` of the prompt ids,
    decode = :meth:`OpenVinoCausalLM.greedy` (the cache fed back as arrays each step); load = ``read_model`` plus
    ``compile_model``."""
    model = OpenVinoCausalLM(folder, threads=timing.threads)

    def generate(prompt, count, steps):
        return model.greedy(prompt, count, timings=steps)[1]

    return sitting_measurement(lambda ids: model.forward(ids.reshape(1, -1)), generate, tokens, timing,
                               model.load_seconds)


def _pipeline(folder: str, threads: int):
    import openvino_genai as ov_genai

    scheduler = ov_genai.SchedulerConfig()
    scheduler.enable_prefix_caching = False  # every prefill computes its whole prompt
    return ov_genai.LLMPipeline(folder, "CPU", scheduler_config=scheduler, INFERENCE_NUM_THREADS=int(threads))


def measure_openvino_genai(folder: str, tokens: np.ndarray, timing: TimingSettings) -> dict[str, Any]:
    """optimum-intel's IR run by openvino-genai's ``LLMPipeline`` on the prompt ids (``TokenizedInputs``, so its
    tokenizer is not used): prefill = a generation of one token (the prompt's prefill and the first argmax),
    decode = a greedy generation of ``count`` tokens (``ignore_eos``), each step timed between two calls of a
    streamer's ``write``, the TTFT from the call to the first ``write``; load = ``LLMPipeline``'s construction;
    ``timing.threads`` as ``INFERENCE_NUM_THREADS``."""
    import openvino as ov
    import openvino_genai as ov_genai

    started = time.perf_counter()
    pipe = _pipeline(folder, timing.threads)
    load_s = time.perf_counter() - started

    class Clock(ov_genai.StreamerBase):
        def __init__(self):
            super().__init__()
            self.times: list[float] = []

        def write(self, token):
            self.times.append(time.perf_counter())
            return ov_genai.StreamingStatus.RUNNING

        def end(self):
            pass

    def inputs(ids: np.ndarray):
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(1, -1)
        return ov_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))

    def greedy(count: int):
        return ov_genai.GenerationConfig(max_new_tokens=count, min_new_tokens=count, ignore_eos=True, do_sample=False)

    def prefill(ids):
        pipe.generate(inputs(ids), greedy(1))

    def generate(prompt, count, steps):
        clock = Clock()
        begin = time.perf_counter()
        pipe.generate(inputs(prompt), greedy(count), clock)
        steps.extend(b - a for a, b in zip(clock.times, clock.times[1:]))
        return clock.times[0] - begin

    return sitting_measurement(prefill, generate, tokens, timing, load_s)


def openvino_genai_config(folder: str | Path) -> dict[str, Any]:
    """What the ``openvino-int4`` row runs: openvino-genai's and OpenVINO's versions, the CPU plugin's default
    precision and KV cache precision (the pipeline keeps them), the settings passed, and the export's record
    (optimum-intel's command, the export environment's versions, NNCF's bit-width table)."""
    import openvino

    core = openvino.Core()
    export = read_json(Path(folder) / "export.json") if (Path(folder) / "export.json").is_file() else {}
    return {
        "openvino_genai": package_version("openvino-genai"),
        "openvino": openvino.get_version(),
        "plugin_default_precision": core.get_property("CPU", "INFERENCE_PRECISION_HINT").to_string(),
        "plugin_kv_cache_precision": core.get_property("CPU", "KV_CACHE_PRECISION").to_string(),
        "settings": "LLMPipeline(folder, 'CPU', INFERENCE_NUM_THREADS=threads), its default attention backend, "
                    "prefix caching off; greedy, ignore_eos; the prompt given as token ids",
        "export": {k: export.get(k) for k in ("command", "versions", "weight_compression")},
    }
