"""The machine a run measures on: CPU model, cores, memory, and its memory bandwidth.

Bandwidth follows the convention of McCalpin's STREAM benchmark "Copy" kernel
(https://www.cs.virginia.edu/stream/ref.html): a copy of ``n`` bytes counts ``2 n`` bytes moved
(one read, one write); arrays are far larger than the last-level cache; the best of several
repetitions is reported. Threads copy disjoint arrays at once (numpy releases the GIL in
``copyto``), so the figure is the bandwidth that ``threads`` decode threads can draw.
"""

from __future__ import annotations

import os
import platform
import re
import threading
import time
from typing import Any, Iterable

import numpy as np
import psutil

from qwen_onnx.store.provenance import library_versions


def vm_hwm_mib() -> float | None:
    """This process's peak resident set size in MiB, ``VmHWM`` of ``/proc/self/status`` (since start, or since
    the peak was last reset through ``/proc/self/clear_refs``); None where that file is not available."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return None


def peak_rss_mib() -> float:
    """Peak resident set size of this process in MiB: ``VmHWM`` of ``/proc/self/status`` on Linux, else
    ``getrusage``'s ``ru_maxrss`` (KiB on Linux, bytes on macOS).

    ``ru_maxrss`` survives ``execve`` on Linux (``getrusage(2)``: the kernel keeps the larger of the old and
    the new image's peak), so a measuring process started by ``multiprocessing``'s spawn (fork, then exec)
    reported at least its parent's peak: every row of a sitting read the sitting process's 1,484 MiB on
    the 0.5B. ``VmHWM`` belongs to the process's own address space, made anew by exec.
    """
    peak = vm_hwm_mib()
    if peak is not None:
        return peak
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024.0 * 1024.0) if sys.platform == "darwin" else peak / 1024.0


def cpu_model() -> str:
    """The CPU model name from ``/proc/cpuinfo`` (Linux), else ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


#: The CPU features that decide which SIMD kernels onnxruntime's MLAS and ggml run (``/proc/cpuinfo`` names).
ISA_FLAGS = ("avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512vl", "avx512_vbmi",
             "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


def _all_cpu_flags() -> set[str]:
    """Every flag of the first CPU in ``/proc/cpuinfo`` (empty where there is no such file)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_flags() -> list[str]:
    """SIMD features relevant to the INT8 and float kernels that the CPU reports (:data:`ISA_FLAGS`)."""
    flags = _all_cpu_flags()
    return [w for w in ISA_FLAGS if w in flags]


def isa_name(flags: Iterable[str] | None = None) -> str:
    """The instruction set a figure was measured on, in one short name: ``AVX-512 VNNI + AMX``,
    ``AVX-512 VNNI``, ``AVX-512``, ``AVX-VNNI``, ``AVX2``, ``SSE`` (x86-64) or the machine name
    (other architectures).

    Args:
        flags: ``/proc/cpuinfo`` flag names; None reads this machine's.
    """
    f = set(_all_cpu_flags() if flags is None else flags)
    if "avx2" not in f and "avx512f" not in f:
        return "SSE" if platform.machine() in ("x86_64", "AMD64") or "sse4_2" in f else platform.machine()
    if "avx512f" in f and "avx512bw" in f:
        name = "AVX-512 VNNI" if "avx512_vnni" in f else "AVX-512"
        return name + " + AMX" if "amx_int8" in f else name
    return "AVX-VNNI" if "avx_vnni" in f else "AVX2"


def int8_kernel(flags: Iterable[str] | None = None) -> str:
    """The U8S8 integer GEMM path onnxruntime's MLAS takes on a CPU with ``flags``, and whether its
    int16 intermediate sums saturate.

    MLAS picks its QGEMM kernel from the CPU features at start-up (onnxruntime
    ``core/mlas/lib/platform.cpp``): AMX tiles (``amx_int8``), ``VPDPBUSD`` with AVX-512 VNNI or
    AVX-VNNI (exact int32 sums), otherwise ``VPMADDUBSW`` on AVX-512BW or AVX2, which adds each pair
    of u8 x s8 products into a saturating int16 (onnxruntime's quantization docs, "When to use
    reduce_range and per-channel quantization").

    Args:
        flags: ``/proc/cpuinfo`` flag names; None reads this machine's.
    """
    f = set(_all_cpu_flags() if flags is None else flags)
    if "amx_int8" in f and "amx_tile" in f:
        return "AMX (TDPBUSD, exact int32)"
    if "avx512_vnni" in f and "avx512bw" in f:
        return "AVX-512 VNNI (VPDPBUSD, exact int32)"
    if "avx_vnni" in f:
        return "AVX-VNNI (VPDPBUSD, exact int32)"
    if "avx512bw" in f:
        return "AVX-512BW (VPMADDUBSW, saturating int16 pairs)"
    if "avx2" in f:
        return "AVX2 (VPMADDUBSW, saturating int16 pairs)"
    return "SSE/scalar"


def saturating_int8(flags: Iterable[str] | None = None) -> bool:
    """Whether MLAS's U8S8 GEMM on this CPU adds product pairs into saturating int16 (:func:`int8_kernel`)."""
    return "saturating" in int8_kernel(flags)


def machine_isa() -> dict[str, Any]:
    """What an accuracy or speed figure ran on: ``cpu_model``, ``isa`` (:func:`isa_name`),
    ``int8_kernel`` (:func:`int8_kernel`), read off this machine when the figure is made."""
    return {"cpu_model": cpu_model(), "isa": isa_name(), "int8_kernel": int8_kernel()}


def ggml_cmake_args(flags: Iterable[str] | None = None, machine: str | None = None) -> str:
    """CMake flags for building llama.cpp (llama-cpp-python) for the CPU at hand.

    x86-64: ``GGML_NATIVE=OFF`` with exactly the SIMD levels the CPU has (AVX2/FMA/F16C, AVX-512 and
    its VNNI/VBMI/BF16 extensions), and never AMX: ggml's AMX weight repacking crashed llama-cpp-python
    0.3.36 on a Xeon with AMX (segmentation fault on load). Other architectures: ``GGML_NATIVE=ON``
    (ggml's default).

    Args:
        flags: ``/proc/cpuinfo`` flag names; None reads this machine's.
        machine: ``platform.machine()``; None reads this machine's.

    Returns:
        The ``CMAKE_ARGS`` value, for example ``-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON
        -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON`` on an AVX2-only CPU.
    """
    f = set(_all_cpu_flags() if flags is None else flags)
    machine = platform.machine() if machine is None else machine
    if machine not in ("x86_64", "AMD64"):
        return "-DGGML_NATIVE=ON"
    args = ["-DGGML_NATIVE=OFF"]
    for flag, option in (("avx", "AVX"), ("avx2", "AVX2"), ("fma", "FMA"), ("f16c", "F16C"), ("bmi2", "BMI2")):
        args.append(f"-DGGML_{option}={'ON' if flag in f else 'OFF'}")
    avx512 = {"avx512f", "avx512bw", "avx512vl"} <= f
    args.append(f"-DGGML_AVX512={'ON' if avx512 else 'OFF'}")
    for flag, option in (("avx512_vnni", "AVX512_VNNI"), ("avx512_vbmi", "AVX512_VBMI"), ("avx512_bf16", "AVX512_BF16")):
        args.append(f"-DGGML_{option}={'ON' if avx512 and flag in f else 'OFF'}")
    args.append(f"-DGGML_AVX_VNNI={'ON' if 'avx_vnni' in f else 'OFF'}")
    args += ["-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
    return " ".join(args)


def ggml_missing_features(system_info: str, flags: Iterable[str] | None = None) -> list[str]:
    """The SIMD features a llama.cpp build uses (``llama_print_system_info()``: ``AVX512 = 1 | ...``)
    that this CPU lacks: a non-empty list means the build dies with SIGILL here.

    Args:
        system_info: ggml's system info string.
        flags: ``/proc/cpuinfo`` flag names; None reads this machine's.
    """
    f = set(_all_cpu_flags() if flags is None else flags)
    needs = {"AVX": {"avx"}, "AVX2": {"avx2"}, "FMA": {"fma"}, "F16C": {"f16c"}, "BMI2": {"bmi2"},
             "AVX512": {"avx512f"}, "AVX512_VBMI": {"avx512_vbmi"}, "AVX512_VNNI": {"avx512_vnni"},
             "AVX512_BF16": {"avx512_bf16"}, "AVX_VNNI": {"avx_vnni"}, "AMX_INT8": {"amx_int8"}}
    used = {name for name, value in re.findall(r"([A-Z0-9_]+) = (\d)", system_info) if value == "1"}
    return sorted(name for name in used if name in needs and not needs[name] <= f)


def memory_bandwidth_gb_s(threads: int = 2, mib_per_thread: int = 256, repeats: int = 5) -> float:
    """Best-of-``repeats`` copy bandwidth in GB/s (10^9 bytes/s), STREAM Copy convention.

    Args:
        threads: threads copying at once, each its own pair of arrays.
        mib_per_thread: size of each source array in MiB (keep far above the L3 cache).
        repeats: timed repetitions after one warm-up.
    """
    n = mib_per_thread * (1 << 20) // 8
    sources = [np.ones(n, dtype=np.float64) for _ in range(threads)]
    targets = [np.empty_like(s) for s in sources]
    best = float("inf")
    for attempt in range(repeats + 1):
        barrier = threading.Barrier(threads + 1)

        def copy(i: int) -> None:
            barrier.wait()
            np.copyto(targets[i], sources[i])

        workers = [threading.Thread(target=copy, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        barrier.wait()
        started = time.perf_counter()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - started
        if attempt:  # the first pass faults the pages in
            best = min(best, elapsed)
    moved = 2 * threads * n * 8
    return moved / best / 1e9


def describe_machine(threads: int = 2) -> dict[str, Any]:
    """CPU model and flags, logical/physical cores, total memory (GiB), measured bandwidth (GB/s)."""
    return {
        "cpu_model": cpu_model(),
        "cpu_flags": cpu_flags(),
        "isa": isa_name(),
        "int8_kernel": int8_kernel(),
        "logical_cores": psutil.cpu_count(logical=True),
        "physical_cores": psutil.cpu_count(logical=False),
        "affinity_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": round(psutil.virtual_memory().total / (1 << 30), 1),
        "bandwidth_threads": threads,
        "memory_bandwidth_gb_s": round(memory_bandwidth_gb_s(threads), 2),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "library_versions": library_versions(),
    }


# --- other load on the machine while a measurement runs ------------------------------------------

#: A measurement counts as taken beside other load ("busy") when processes outside the measuring
#: process tree used more than this many cores on average while it ran, or the hypervisor stole
#: more than :data:`BUSY_STEAL_PCT` percent of the CPU time. On the idle 2-core VM the system's own
#: daemons used under 0.03 cores (:func:`load_snapshot`; docs/timing.md).
BUSY_OTHER_CORES = 0.15
BUSY_STEAL_PCT = 5.0


def _steal_and_total() -> tuple[int, int]:
    """Summed steal and total jiffies of all CPUs (``/proc/stat``'s ``cpu`` line; zeros elsewhere)."""
    try:
        with open("/proc/stat", encoding="utf-8") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def _own_tree() -> set[int]:
    me = psutil.Process()
    return {me.pid, *(p.pid for p in me.children(recursive=True))}


def load_snapshot() -> dict[str, Any]:
    """CPU seconds of every process outside this process and its children, the steal counters and
    the load average, at one instant: the two ends of a window for :func:`load_between`."""
    own = _own_tree()
    cpu: dict[tuple[int, float], float] = {}
    for proc in psutil.process_iter(["pid", "create_time", "cpu_times"]):
        info = proc.info
        if info["pid"] in own or info["cpu_times"] is None:
            continue
        times = info["cpu_times"]
        cpu[(info["pid"], info["create_time"])] = times.user + times.system
    steal, total = _steal_and_total()
    return {"time": time.monotonic(), "others_cpu_s": cpu, "steal": steal, "total": total,
            "load_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def load_between(start: dict[str, Any], end: dict[str, Any]) -> dict[str, Any]:
    """The other load on the machine between two :func:`load_snapshot` calls.

    Returns:
        ``others_cores``: CPU seconds used by processes outside the measuring tree per second of
        wall time (a process started in between counts from zero; one that ended in between is
        missed); ``steal_pct``: percent of CPU time the hypervisor gave to other guests;
        ``load_1m``: the 1-minute load average at the end (it counts the measurement itself);
        ``seconds``: the window; ``busy``: either figure above :data:`BUSY_OTHER_CORES` /
        :data:`BUSY_STEAL_PCT`.
    """
    seconds = max(end["time"] - start["time"], 1e-9)
    used = sum(max(0.0, t - start["others_cpu_s"].get(key, 0.0)) for key, t in end["others_cpu_s"].items())
    total = end["total"] - start["total"]
    steal_pct = 100.0 * (end["steal"] - start["steal"]) / total if total > 0 else 0.0
    others = used / seconds
    return {"others_cores": round(others, 3), "steal_pct": round(steal_pct, 2), "load_1m": end["load_1m"],
            "seconds": round(seconds, 2), "busy": others > BUSY_OTHER_CORES or steal_pct > BUSY_STEAL_PCT}


def measure_load(seconds: float = 1.0) -> dict[str, Any]:
    """:func:`load_between` over ``seconds`` of this process sleeping: is the machine free now?"""
    start = load_snapshot()
    time.sleep(seconds)
    return load_between(start, load_snapshot())
