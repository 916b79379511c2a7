"""The CPU at hand: instruction-set names, onnxruntime's INT8 kernel path, llama.cpp build flags per
CPU, a build that would die with SIGILL, a crashed measuring child named by its signal, the other
load on the machine while a figure is measured, and gate margins."""

import os
import subprocess
import sys
import time

import pytest
from child_jobs import SIGILL, die_by_signal, raise_value_error, square, told_busy

from qwen_onnx.measure.peers_table import _median_row
from qwen_onnx.measure.sitting import ChildCrashed, exit_cause, interleaved_rounds, run_in_child
from qwen_onnx.run.machine import (
    ggml_cmake_args,
    ggml_missing_features,
    int8_kernel,
    isa_name,
    load_snapshot,
    measure_load,
    saturating_int8,
)
from qwen_onnx.settings.gates import gate_margins

# /proc/cpuinfo flags (the SIMD part) of the project's machines
EPYC_AVX2 = {"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2", "vaes", "sha_ni"}
XEON_AMX = EPYC_AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512_vbmi", "avx512_vnni", "avx512_bf16",
                        "amx_tile", "amx_int8", "amx_bf16"}
SKYLAKE_X = EPYC_AVX2 | {"avx512f", "avx512bw", "avx512vl"}
# llama_print_system_info() of llama-cpp-python 0.3.36 built with the earlier fixed AVX-512 flags
AVX512_BUILD_INFO = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | "
                     "AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |")


def test_isa_and_int8_kernel_of_each_machine():
    assert isa_name(EPYC_AVX2) == "AVX2"
    assert isa_name(XEON_AMX) == "AVX-512 VNNI + AMX"
    assert isa_name(SKYLAKE_X) == "AVX-512"
    assert int8_kernel(EPYC_AVX2) == "AVX2 (VPMADDUBSW, saturating int16 pairs)"
    assert int8_kernel(SKYLAKE_X) == "AVX-512BW (VPMADDUBSW, saturating int16 pairs)"
    assert int8_kernel(XEON_AMX) == "AMX (TDPBUSD, exact int32)"
    assert saturating_int8(EPYC_AVX2) and not saturating_int8(XEON_AMX)
    assert saturating_int8(EPYC_AVX2 | {"avx_vnni"}) is False


def test_llama_cpp_flags_follow_the_cpu_and_never_take_amx():
    avx2 = ggml_cmake_args(EPYC_AVX2, "x86_64").split()
    assert "-DGGML_NATIVE=OFF" in avx2 and "-DGGML_AVX2=ON" in avx2 and "-DGGML_FMA=ON" in avx2
    assert "-DGGML_AVX512=OFF" in avx2 and "-DGGML_AVX512_VNNI=OFF" in avx2
    xeon = ggml_cmake_args(XEON_AMX, "x86_64").split()
    assert {"-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON", "-DGGML_AVX512_VBMI=ON"} <= set(xeon)
    assert {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF"} <= set(xeon)
    assert ggml_cmake_args(set(), "x86_64").split()[:3] == ["-DGGML_NATIVE=OFF", "-DGGML_AVX=OFF", "-DGGML_AVX2=OFF"]
    assert ggml_cmake_args(set(), "aarch64") == "-DGGML_NATIVE=ON"


def test_an_avx512_build_is_named_unusable_on_an_avx2_cpu():
    assert ggml_missing_features(AVX512_BUILD_INFO, EPYC_AVX2) == ["AVX512", "AVX512_BF16", "AVX512_VBMI", "AVX512_VNNI"]
    assert ggml_missing_features(AVX512_BUILD_INFO, XEON_AMX) == []
    avx2_build = AVX512_BUILD_INFO.replace("AVX512 = 1", "AVX512 = 0").replace("_VBMI = 1", "_VBMI = 0") \
        .replace("_VNNI = 1", "_VNNI = 0").replace("_BF16 = 1", "_BF16 = 0")
    assert ggml_missing_features(avx2_build, EPYC_AVX2) == []


def test_a_child_killed_by_sigill_is_named_with_its_signal_and_cause():
    assert exit_cause(-SIGILL) == ("killed by SIGILL (illegal instruction: built for an instruction set this CPU "
                                   "lacks)")
    assert exit_cause(-9).startswith("killed by SIGKILL (killed from outside")
    assert exit_cause(3) == "exit status 3"
    assert run_in_child(square, 7) == 49
    with pytest.raises(ChildCrashed, match="killed by SIGILL"):
        run_in_child(die_by_signal, SIGILL)
    with pytest.raises(RuntimeError, match="ValueError: bad input"):
        run_in_child(raise_value_error, "bad input")


def test_interleaved_rounds_record_a_crash_and_keep_measuring_the_others():
    failures, loads = {}, []
    per_job = interleaved_rounds([("ok", square, (3,)), ("crashes", die_by_signal, (SIGILL,))], 2,
                                 failures=failures, loads=loads)
    assert per_job == [[9, 9], []]
    assert failures == {1: "the process was killed by SIGILL (illegal instruction: built for an instruction set "
                           "this CPU lacks)"}
    assert [record["round"] for record in loads[0]] == [1, 2] and loads[1] == []
    assert {"others_cores", "steal_pct", "busy"} <= set(loads[0][0]["during"])


def _spin_outside_this_tree(seconds: float) -> None:
    """A busy loop that is not a child of this process (its parent shell exits at once)."""
    subprocess.run(["sh", "-c", f"timeout {seconds} sh -c 'while :; do :; done' >/dev/null 2>&1 &"], check=True)


def test_a_busy_process_beside_the_measurement_is_seen():
    _spin_outside_this_tree(4)
    time.sleep(0.3)
    load = measure_load(1.5)
    assert load["busy"] and load["others_cores"] > 0.5, load
    assert load["seconds"] == pytest.approx(1.5, abs=0.3)


def test_the_measuring_tree_is_not_other_load():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        time.sleep(0.2)
        pids = {pid for pid, _ in load_snapshot()["others_cpu_s"]}
        assert child.pid not in pids and os.getpid() not in pids
        assert os.getppid() in pids  # the parent (a shell, Snakemake) is not the measurement
    finally:
        child.kill()
        child.wait()


def test_a_function_is_told_when_the_cores_were_busy():
    _spin_outside_this_tree(6)
    time.sleep(0.3)
    loads = []
    (figures,) = interleaved_rounds([("told", told_busy, ())], 1, loads=loads, load_watch_s=0.5)
    assert figures == [{"decode_tok_s": 1.0, "cores_busy": True}]
    assert loads[0][0]["busy"] and loads[0][0]["cores_busy_setting"] is True
    assert loads[0][0]["before"]["seconds"] == pytest.approx(0.5, abs=0.2)  # latency.load_watch_s


def test_rows_take_medians_over_idle_rounds_only():
    figures = [{"decode_tok_s": 10.0, "ttft_ms": 50.0}, {"decode_tok_s": 4.0, "ttft_ms": 200.0},
               {"decode_tok_s": 12.0, "ttft_ms": 40.0}]
    idle = {"busy": False, "during": {"others_cores": 0.01}}
    busy = {"busy": True, "during": {"others_cores": 0.93}}
    loads = [{**idle, "round": 1}, {**busy, "round": 2}, {**idle, "round": 3}]
    row = _median_row(figures, loads)
    assert row["decode_tok_s"] == 11.0 and row["ttft_ms"] == 45.0
    assert row["rounds_decode_tok_s"] == [10.0, 4.0, 12.0] and row["rounds_busy"] == [2] and not row["busy"]
    assert row["load_note"] == "median of 2 idle rounds; round(s) 2 ran beside other load and are left out"
    every = _median_row(figures, [{**busy, "round": r} for r in (1, 2, 3)])
    assert every["busy"] and every["decode_tok_s"] == 10.0
    assert every["load_note"] == "BUSY: every round ran beside other load (up to 0.93 cores)"
    assert _median_row(figures, [{**idle, "round": r} for r in (1, 2, 3)])["load_note"] == "idle"


def test_a_pass_within_the_margin_is_marginal():
    limits = {"ppl_delta_pct": 3.0, "top1_pct": 90, "kl_mean": 0.1}
    # the 0.5B int4 on the AVX2 EPYC: top-1 exactly on the gate
    assert gate_margins({"ppl_delta_pct": 2.67, "top1_pct": 90.0, "kl_mean": 0.0324}, limits) == [
        "top1_pct 90 within 1 point of >= 90"]
    assert gate_margins({"ppl_delta_pct": 2.8, "top1_pct": 92.0, "kl_mean": 0.0324}, limits) == [
        "ppl_delta_pct 2.8 within 10% of <= 3"]
    assert gate_margins({"ppl_delta_pct": 1.35, "top1_pct": 93.5, "kl_mean": 0.02}, limits) == []
    assert gate_margins({"ppl_delta_pct": 1.0, "top1_pct": 95, "kl_mean": 0.095}, limits) == [
        "kl_mean 0.095 within 10% of <= 0.1"]
    # a float gate's 99.5% leaves half a point of room: 100% is not marginal, 99.52% is
    assert gate_margins({"top1_pct": 100.0}, {"top1_pct": 99.5}) == []
    assert gate_margins({"top1_pct": 99.52}, {"top1_pct": 99.5}) == ["top1_pct 99.52 within 0.05 point of >= 99.5"]


def test_transformers_is_imported_without_tensorflow_or_jax():
    code = ("import sys\nfrom qwen_onnx.quiet import quiet_third_party; quiet_third_party()\n"
            "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
            "import transformers.models.qwen2.modeling_qwen2\n"
            "print(sorted(m for m in ('tensorflow', 'jax', 'flax', 'torch') if m in sys.modules))")
    env = {k: v for k, v in os.environ.items() if k not in ("USE_TF", "USE_FLAX")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == "['torch']"


def test_litert_torch_imports_quietly_and_says_what_it_filtered():
    from qwen_onnx.run.tflite_env import litert_here, tflite_python

    python = sys.executable if litert_here(converter=True) else str(tflite_python())  # .venv-tflite: .venv has none
    if not os.path.isfile(python):
        pytest.skip(f"no TFLite environment ({python}): envs/setup.sh makes .venv-tflite")
    code = ("import logging; logging.basicConfig(level=logging.DEBUG, format='%(levelname)s %(name)s: %(message)s')\n"
            "from qwen_onnx.quiet import quiet_third_party; quiet_third_party()\n"
            "import litert_torch")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rest = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("DEBUG qwen_onnx: filtered"))
    assert "Failed to load" not in rest and "rebuild TensorFlow" not in rest and "register_constant" not in rest, rest
    assert "DEBUG qwen_onnx: filtered torchao notices (torchao's CUDA kernels (MX-FP8, CUTLASS), unused on the CPU)" \
        in done.stderr


def test_a_spawned_process_reports_its_own_peak_rss_not_its_parents():
    """getrusage's ru_maxrss survives exec on Linux: a child spawned after the parent held 600 MiB read
    600 MiB whatever it used itself; VmHWM is the child's own (a bare interpreter: under 200 MiB)."""
    import multiprocessing
    import sys

    import numpy as np

    from qwen_onnx.run.machine import peak_rss_mib

    if not sys.platform.startswith("linux"):
        pytest.skip("VmHWM is Linux's")
    held = np.ones(600 * 2**20 // 8)  # 600 MiB touched in this process
    assert peak_rss_mib() > 600
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        child = pool.apply(peak_rss_mib)
    del held
    assert 5 < child < 200
