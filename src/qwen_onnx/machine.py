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
import threading
import time
from typing import Any, Callable

import numpy as np
import psutil

from .artifacts import library_versions


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


def cpu_flags() -> list[str]:
    """SIMD features relevant to INT8 kernels that the CPU reports (``avx2``, ``avx512_vnni``, ``amx_int8``...)."""
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "amx_bf16")
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return [w for w in wanted if w in flags]
    except OSError:
        pass
    return []


def _best_pass(threads: int, work: Callable[[int], Any], repeats: int) -> float:
    """Seconds of the fastest of ``repeats`` passes in which ``threads`` threads run ``work(i)`` at
    once (after one untimed pass, which faults the pages in)."""
    best = float("inf")
    for attempt in range(repeats + 1):
        barrier = threading.Barrier(threads + 1)

        def run(i: int) -> None:
            barrier.wait()
            work(i)

        workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        barrier.wait()
        started = time.perf_counter()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - started
        if attempt:
            best = min(best, elapsed)
    return best


def memory_bandwidth_gb_s(threads: int = 2, mib_per_thread: int = 256, repeats: int = 5) -> float:
    """Best-of-``repeats`` copy bandwidth in GB/s (10^9 bytes/s), STREAM Copy convention (bytes
    read plus bytes written, McCalpin's STREAM benchmark).

    Args:
        threads: threads copying at once, each its own pair of arrays.
        mib_per_thread: size of each source array in MiB (keep far above the L3 cache).
        repeats: timed repetitions after one warm-up.
    """
    n = mib_per_thread * (1 << 20) // 8
    sources = [np.ones(n, dtype=np.float64) for _ in range(threads)]
    targets = [np.empty_like(s) for s in sources]
    best = _best_pass(threads, lambda i: np.copyto(targets[i], sources[i]), repeats)
    return 2 * threads * n * 8 / best / 1e9


def memory_read_bandwidth_gb_s(threads: int = 2, mib_per_thread: int = 256, repeats: int = 5) -> float:
    """Best-of-``repeats`` read-only bandwidth in GB/s (10^9 bytes/s): each thread takes the maximum
    of its own float32 array (numpy's SIMD reduction, memory-bound), so only reads cross the memory bus.

    Decode reads its weights and writes almost nothing, so this is the bandwidth of the decode
    roofline. A copy costs more than its bytes (the written lines are read first), so on the build
    machine the STREAM Copy figure (:func:`memory_bandwidth_gb_s`) is the lower one, and decode
    measured above it.

    Args: as :func:`memory_bandwidth_gb_s`.
    """
    n = mib_per_thread * (1 << 20) // 4
    sources = [np.ones(n, dtype=np.float32) for _ in range(threads)]
    best = _best_pass(threads, lambda i: sources[i].max(), repeats)
    return threads * n * 4 / best / 1e9


def describe_machine(threads: int = 2) -> dict[str, Any]:
    """CPU model and flags, logical/physical cores, total memory (GiB), measured bandwidth (GB/s)."""
    return {
        "cpu_model": cpu_model(),
        "cpu_flags": cpu_flags(),
        "logical_cores": psutil.cpu_count(logical=True),
        "physical_cores": psutil.cpu_count(logical=False),
        "affinity_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": round(psutil.virtual_memory().total / (1 << 30), 1),
        "bandwidth_threads": threads,
        "memory_read_bandwidth_gb_s": round(memory_read_bandwidth_gb_s(threads), 2),
        "memory_bandwidth_gb_s": round(memory_bandwidth_gb_s(threads), 2),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "library_versions": library_versions(),
    }
