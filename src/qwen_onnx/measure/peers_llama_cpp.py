"""The timing sitting's llama.cpp rows: llama-cpp-python's timing of a GGUF file (run in its own process by the
sitting, :mod:`qwen_onnx.measure.peers`) and what its build runs (ggml's own system info)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from qwen_onnx.measure.latency import sitting_measurement
from qwen_onnx.measure.sitting import exit_cause
from qwen_onnx.run.machine import ggml_missing_features
from qwen_onnx.settings.timing import TimingSettings

#: Where ``envs/setup.sh --peers`` records the CMAKE_ARGS it built llama-cpp-python with
#: (:func:`qwen_onnx.run.machine.ggml_cmake_args` of the CPU at setup, or ``LLAMA_CMAKE_ARGS``).
LLAMA_CPP_STAMP = "llama-cpp-cmake-args"


def llama_n_ctx(timing: TimingSettings) -> int:
    """The context llama.cpp is given for ``timing``'s prompts, tokens: the longest prompt, the new tokens and 16
    to spare."""
    return timing.longest_prompt + timing.new_tokens + 16


def measure_llama_cpp(gguf: str, tokens: np.ndarray, timing: TimingSettings) -> dict[str, Any]:
    """llama-cpp-python on ``gguf``: prefill = ``Llama.eval`` of the prompt ids, decode = one
    ``eval`` of the argmax token per step, both after a ``reset`` (the KV cache is cleared past
    the kept tokens, so nothing is reused between runs); ``timing.threads`` as ``n_threads`` and
    ``n_threads_batch``."""
    import llama_cpp

    started = time.perf_counter()
    llm = llama_cpp.Llama(model_path=gguf, n_ctx=llama_n_ctx(timing), n_batch=512, n_threads=timing.threads,
                          n_threads_batch=timing.threads, verbose=False)
    load_s = time.perf_counter() - started

    def last_argmax() -> int:
        return int(np.argmax(llm.scores[llm.n_tokens - 1]))

    def prefill(ids):
        llm.reset()
        llm.eval(ids.tolist())

    def generate(prompt, count, steps):
        llm.reset()
        begin = time.perf_counter()
        llm.eval(prompt.tolist())
        token = last_argmax()
        ttft = time.perf_counter() - begin
        for _ in range(count - 1):
            step = time.perf_counter()
            llm.eval([token])
            token = last_argmax()
            steps.append(time.perf_counter() - step)
        return ttft

    return sitting_measurement(prefill, generate, tokens, timing, load_s)


def gguf_layout(path: str | Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{tensor name: (GGML type name, shape)}`` of a GGUF file, read from its header by gguf-py's
    ``GGUFReader`` (memory-mapped: the tensor data is not read)."""
    from gguf import GGUFReader

    return {t.name: (t.tensor_type.name, tuple(int(d) for d in t.shape)) for t in GGUFReader(str(path)).tensors}


def same_kernels(gguf: str | Path, other: str | Path) -> bool:
    """Whether two GGUF files hold the same tensors, and as many tensors of each GGML type and shape
    (:func:`gguf_layout`): a decode step or a prefill then runs the same kernels over the same bytes in both,
    in another order of layers at most, so one's speed is the other's. llama.cpp's Q4_K_M quantizer on the
    embedded models' checkpoint puts its Q6_K ffn_down and Q8_0 attn_v in other layers than the source Q4_K_M
    file does, as many of each. Their values, and so their accuracy, differ."""
    return same_kernel_mix(gguf_layout(gguf), gguf_layout(other))


def same_kernel_mix(layout: Mapping[str, tuple[str, tuple[int, ...]]],
                    other: Mapping[str, tuple[str, tuple[int, ...]]]) -> bool:
    """:func:`same_kernels` of two :func:`gguf_layout` results: the same tensor names, and the same
    multiset of (GGML type, shape)."""
    return layout.keys() == other.keys() and sorted(layout.values()) == sorted(other.values())


def llama_cpp_config() -> dict[str, Any]:
    """What the llama.cpp row runs: the package version and ggml's own CPU feature report
    (``llama_print_system_info``), read in a child process so that a broken build cannot take this
    one down; the CMAKE_ARGS ``envs/setup.sh --peers`` recorded; the features the build uses that
    this CPU lacks (``missing_cpu_features``: such a build dies with SIGILL); the context settings."""
    code = ("import llama_cpp, json; print(json.dumps({'version': llama_cpp.__version__, "
            "'system_info': llama_cpp.llama_print_system_info().decode()}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode == 0 and done.stdout.strip():
        info = json.loads(done.stdout.strip().splitlines()[-1])
        info["missing_cpu_features"] = ggml_missing_features(info["system_info"])
    else:
        info = {"error": f"{exit_cause(done.returncode)}: {(done.stderr or '').strip()[-300:]}"}
    stamp = Path(sys.prefix) / LLAMA_CPP_STAMP
    return {**info, "setup_cmake_args": stamp.read_text(encoding="utf-8").strip() if stamp.is_file() else None,
            "n_batch": 512, "mmap": True, "kv_cache": "llama.cpp default (f16)",
            "sampling": "argmax of Llama.scores (greedy)"}
