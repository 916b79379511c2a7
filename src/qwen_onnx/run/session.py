"""onnxruntime session settings: the options the decode loop and every measurement take (spinning, graph
optimization level, memory arena), onnxruntime's defaults and the shared-cores setting.
"""

from __future__ import annotations

from typing import Any, Mapping

import onnxruntime as ort

#: ONNX Runtime's own defaults for the settings :func:`session_options` exposes.
ORT_DEFAULT_SETTINGS: dict[str, Any] = {
    "intra_op_spinning": True,  # session.intra_op.allow_spinning
    "inter_op_spinning": True,  # session.inter_op.allow_spinning
    "graph_optimization_level": "all",
    "cpu_mem_arena": True,
    "dynamic_block_base": 0,  # session.dynamic_block_base (0: off)
}

#: The settings :func:`session_options` uses unless told otherwise: onnxruntime's defaults, which
#: measured fastest with the cores to itself (see :func:`session_options` for the measurements).
DEFAULT_SETTINGS: dict[str, Any] = dict(ORT_DEFAULT_SETTINGS)

#: For sessions that share the cores with other jobs and measure no speed (the ``accuracy`` and
#: ``task_accuracy`` stages, the calibration of ``quantize_static`` and the ``sensitivity`` report):
#: intra-op spinning off, which measured 1.5-1.7x faster decode than spinning on a VM loaded 6-13.
SHARED_CORES_SETTINGS: dict[str, Any] = {"intra_op_spinning": False}

_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def resolve_settings(settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """:data:`DEFAULT_SETTINGS` updated with ``settings``.

    Raises:
        ValueError: an unknown key or graph optimization level.
    """
    resolved = dict(DEFAULT_SETTINGS)
    for key, value in (settings or {}).items():
        if key not in resolved:
            raise ValueError(f"unknown session setting {key!r}; known: {sorted(resolved)}")
        resolved[key] = value
    if resolved["graph_optimization_level"] not in _LEVELS:
        raise ValueError(f"graph_optimization_level must be one of {sorted(_LEVELS)}, "
                         f"got {resolved['graph_optimization_level']!r}")
    return resolved


def session_options(
    threads: int | None = None,
    *,
    profile_prefix: str | None = None,
    settings: Mapping[str, Any] | None = None,
) -> ort.SessionOptions:
    """ONNX Runtime session options with ``threads`` intra-op threads (0 or None: ORT's default).

    ``settings`` override :data:`DEFAULT_SETTINGS` (keys: ``intra_op_spinning``,
    ``inter_op_spinning``, ``graph_optimization_level`` disable|basic|extended|all,
    ``cpu_mem_arena``, ``dynamic_block_base``; ORT's session config keys
    ``session.intra_op.allow_spinning``, ``session.inter_op.allow_spinning`` and
    ``session.dynamic_block_base``, onnxruntime_session_options_config_keys.h).

    Defaults: onnxruntime's own. Measured on Qwen2.5-Coder-0.5B (onnxruntime 1.32, 2 threads, 3
    interleaved rounds, each measurement in a fresh process, 128-token prompt then 64 greedy tokens,
    IO-bound loop, :func:`qwen_onnx.measure.compare_decode.compare_decode`), the best setting depends on whether
    the cores are free. Idle 2-core VM (load average under 1.5; docs/timing.md), decode tok/s with
    intra-op spinning on over off:

    ==========================================  ======
    variant                                     on/off
    ==========================================  ======
    int4                                        1.42 (67.3 against 47.3 tok/s)
    onnxruntime-genai builder INT4 graph        1.10
    int8-static                                 1.14
    int8-dynamic                                1.15
    fp32                                        1.01
    ==========================================  ======

    On the same VM shared with other jobs (load average 6-13), one factor at a time
    against onnxruntime's defaults, intra-op spinning *off* was 1.70x faster on int8-dynamic (1.01x
    fp32), one intra-op thread 1.72x, inter-op spinning off 0.87x, ORT_ENABLE_BASIC 0.82x, the CPU
    arena off 0.88x, ``dynamic_block_base`` 4 0.87x: spinning threads take the CPU the working ones
    need when there are more threads than free cores. Measuring jobs have the machine to
    themselves (the workflow gives them every core), as a deployment does, so the default is
    onnxruntime's (spinning on); jobs that share cores and measure no speed pass
    :data:`SHARED_CORES_SETTINGS`.

    Raises:
        ValueError: an unknown setting (see :func:`resolve_settings`).
    """
    resolved = resolve_settings(settings)
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = int(threads)
        options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.graph_optimization_level = _LEVELS[resolved["graph_optimization_level"]]
    options.enable_cpu_mem_arena = bool(resolved["cpu_mem_arena"])
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if resolved["intra_op_spinning"] else "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "1" if resolved["inter_op_spinning"] else "0")
    if int(resolved["dynamic_block_base"]) > 0:
        options.add_session_config_entry("session.dynamic_block_base", str(int(resolved["dynamic_block_base"])))
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return options
