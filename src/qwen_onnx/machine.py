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
from typing import Any

import numpy as np
import psutil

from .artifacts import library_versions


def peak_rss_mib() -> float:
    """Peak resident set size of this process in MiB (``getrusage``; Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


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
