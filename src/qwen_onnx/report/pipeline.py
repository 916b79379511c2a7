"""The pipeline table: wall time and peak RSS of every job of the workflow, with the total and the
critical path, so that a user sees where the time goes.

Sources, per job ``{rule}`` or ``{rule}.{variant}`` of a model:

- ``results/benchmarks/{model}/{job}.tsv``: Snakemake's ``benchmark`` file (columns ``s`` wall
  seconds, ``cpu_time`` seconds, ``max_rss`` MiB; Snakemake samples the memory every few seconds,
  so it can miss a short peak);
- ``results/logs/{model}/{job}.log``: the job's log, whose last line holds the exact peak RSS of
  the job and of its largest child process (``getrusage``, :mod:`qwen_onnx.snakemake_support`)
  and whose modification time is the job's end.

The critical path is the longest chain of dependent jobs by wall time (the lower bound of a run
with unlimited cores). The core bound is the lower bound on the machine's cores: the measuring jobs'
wall time (:data:`qwen_onnx.settings.defaults.MEASURING_RULES`, which run with every core to
themselves) plus the other jobs' CPU time spread over the cores (:func:`core_bound`); a run whose
span is near it is limited by its cores, not by its dependencies.

Dependencies come from the variant registry (:mod:`qwen_onnx.settings.variants`): a variant's stage
(its rule) depends on its parent's, and every per-variant job (inspect, accuracy, latency, diff) on
its variant's stage. A quantize stage depends on ``sensitivity`` only when it read the sensitivity
report: its variant's ``quantize.json`` records ``settings.sensitive_max_nodes`` above 0
(:func:`sensitivity_readers`).
"""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path
from typing import Any, Collection, Iterable, Mapping, Sequence

from qwen_onnx.settings.defaults import MEASURING_RULES
from qwen_onnx.settings.variants import BY_STAGE, VARIANTS
from qwen_onnx.store.artifacts import read_json

_PEAK = re.compile(r"peak RSS of rule \S+: (\d+) MiB \(largest child process: (\d+) MiB\)")
#: Folder -> the rule that writes it (``hf`` by ``resolve``, each variant by its stage).
PRODUCER = {"hf": "resolve", **{v.name: v.stage for v in VARIANTS}}
#: Jobs run once per variant (``{rule}.{variant}``).
PER_VARIANT = ("inspect", "accuracy", "latency_row", "diff")
_VARIANT_NAMES = frozenset(v.name for v in VARIANTS)
COLUMNS = ("model", "job", "wall_s", "cpu_s", "peak_rss_mib", "critical")
#: Idle seconds between jobs that separate two runs (Snakemake starts the next job within seconds).
RUN_GAP_S = 120.0
#: The rule of the `task` target's jobs (HumanEval, ``task_accuracy.{variant}`` and ``task_accuracy.{peer}``): a run
#: of their own, after the main command's, so the run's figures (span, critical path, core bound, first gated
#: variant) leave them out and the table gives them a line of their own (:func:`task_runs`).
TASK_RULE = "task_accuracy"


def is_task_job(row: Mapping[str, Any]) -> bool:
    """Whether a pipeline row is a job of the `task` target (:data:`TASK_RULE`)."""
    return row["job"].partition(".")[0] == TASK_RULE


def _read_benchmark(path: Path) -> dict[str, float]:
    with path.open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    if not rows:
        return {}
    last = rows[-1]  # one row per repeat; the workflow runs each job once
    out = {}
    for key, name in (("s", "wall_s"), ("cpu_time", "cpu_s"), ("max_rss", "benchmark_rss_mib")):
        try:
            out[name] = float(last[key])
        except (KeyError, TypeError, ValueError):
            pass
    return out


def _read_log_peak(path: Path) -> float | None:
    """The largest of the job's and its largest child's peak RSS in MiB from the log's last lines."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - 4096))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    found = _PEAK.findall(tail)
    if not found:
        return None
    own, child = found[-1]
    return float(max(int(own), int(child)))


def collect_jobs(results: str | os.PathLike, models: Sequence[str]) -> list[dict[str, Any]]:
    """One row per finished job of ``models`` (and the run-wide ``machine`` job).

    Args:
        results: the results folder (``benchmarks/`` and ``logs/`` inside it).
        models: model short names, in report order.

    Returns:
        Rows ``{model, job, wall_s, cpu_s, peak_rss_mib, ended}``: ``job`` is ``rule`` or
        ``rule.variant``; ``model`` is empty for run-wide jobs; ``peak_rss_mib`` the log's exact
        peak when written, else the benchmark's sampled one; ``ended`` the log's modification time
        (seconds since the epoch) or None. Jobs without a benchmark file (not run yet, and the
        report job itself) are absent.
    """
    results = Path(results)
    rows = []
    for model in ("", *models):
        bench_dir = results / "benchmarks" / model if model else results / "benchmarks"
        log_dir = results / "logs" / model if model else results / "logs"
        if not bench_dir.is_dir():
            continue
        for bench in sorted(bench_dir.glob("*.tsv")):
            job = bench.stem
            if not model and job == "report":
                continue
            figures = _read_benchmark(bench)
            if "wall_s" not in figures:
                continue
            log = log_dir / f"{job}.log"
            peak = _read_log_peak(log)
            rows.append({
                "model": model, "job": job, "wall_s": figures["wall_s"], "cpu_s": figures.get("cpu_s"),
                "peak_rss_mib": peak if peak is not None else figures.get("benchmark_rss_mib"),
                "ended": log.stat().st_mtime if log.exists() else None,
            })
    return rows


def sensitivity_readers(results: str | os.PathLike, model: str) -> set[str]:
    """The quantize stages of ``model`` that read the sensitivity report: those whose variant's
    ``quantize.json`` (in ``results/{model}/{variant}``) has ``settings.sensitive_max_nodes`` above 0.
    A variant not built (no ``quantize.json``) reads nothing."""
    readers = set()
    for variant in VARIANTS:
        path = Path(results, model, variant.name, "quantize.json")
        if variant.stage.startswith("quantize_") and path.is_file():
            if int((read_json(path).get("settings") or {}).get("sensitive_max_nodes") or 0) > 0:
                readers.add(variant.stage)
    return readers


def dependencies(job: str, parents: Mapping[str, str] | None = None,
                 reads_sensitivity: Collection[str] | None = None) -> list[str]:
    """The jobs of the same model that ``job`` needs finished first.

    Args:
        job: ``rule`` or ``rule.variant`` (``latency_row.pytorch`` is PyTorch's row of the sitting).
        parents: folder -> parent folder overrides of the registry (for example
            ``{"int4": "preprocessed"}`` when ``optimize.quantize_fused`` is false).
        reads_sensitivity: the quantize stages that read the sensitivity report
            (:func:`sensitivity_readers`); None: every quantize stage may.
    """
    parent_of = {v.name: v.parent for v in VARIANTS}
    parent_of.update(parents or {})
    rule, _, variant = job.partition(".")
    quantize_parent = parent_of["int8-dynamic"]
    if rule in PER_VARIANT:
        if variant == "pytorch":
            return ["resolve"]
        # a benchmark of a folder the registry does not know (a variant since removed, a user's
        # own rule) has no known producer: its job stands alone on the critical path
        needs = [PRODUCER[variant]] if variant in PRODUCER else []
        if rule == "diff":
            needs.append(PRODUCER["fp32"])
        if rule == "accuracy":
            needs += ["resolve", "reference"]
        return needs
    if rule == "resolve" or rule == "machine":
        return []
    if rule == "sensitivity":
        return [PRODUCER[quantize_parent]]
    if rule == "reference":
        return ["resolve"]
    if rule == "sitting":
        return ["resolve", *(v.stage for v in VARIANTS)]
    if rule in BY_STAGE:
        name = BY_STAGE[rule].name
        needs = [PRODUCER[parent_of[name]]] if parent_of[name] in PRODUCER else []
        if rule.startswith("quantize_") and (reads_sensitivity is None or rule in reads_sensitivity):
            needs.append("sensitivity")
        return needs
    return []


def critical_path(rows: Iterable[Mapping[str, Any]], parents: Mapping[str, str] | None = None,
                  reads_sensitivity: Mapping[str, Collection[str]] | None = None) -> tuple[float, list[str]]:
    """The longest chain of dependent jobs by wall time, over every model.

    ``reads_sensitivity``: per model, its quantize stages that read the sensitivity report
    (:func:`dependencies`); a model left out, or None: every quantize stage may.

    Returns:
        ``(seconds, jobs)`` with ``jobs`` as ``model/job`` from the first to the last; ``(0, [])``
        for no rows. Dependencies on jobs that did not run (absent rows) are skipped.
    """
    by_key = {(r["model"], r["job"]): r for r in rows}
    best: dict[tuple[str, str], tuple[float, list[str]]] = {}

    def longest(key: tuple[str, str]) -> tuple[float, list[str]]:
        if key not in best:
            model, job = key
            readers = None if reads_sensitivity is None else reads_sensitivity.get(model)
            before = [longest((model, d)) for d in dependencies(job, parents, readers) if (model, d) in by_key]
            seconds, chain = max(before, default=(0.0, []), key=lambda x: x[0])
            best[key] = (seconds + float(by_key[key]["wall_s"]), chain + [f"{model}/{job}" if model else job])
        return best[key]

    return max((longest(k) for k in by_key), default=(0.0, []), key=lambda x: x[0])


def core_bound(rows: Iterable[Mapping[str, Any]], cores: int) -> float:
    """Seconds a run of ``rows`` takes at least on ``cores`` cores: the wall time of the measuring jobs
    (rules in :data:`~qwen_onnx.settings.defaults.MEASURING_RULES`; nothing runs beside them) plus the
    CPU seconds of every other job (its wall time where Snakemake recorded no CPU time) over ``cores``.
    Snakemake samples a job's CPU time, so a short-lived child's may be missed: a lower bound.

    Raises:
        ValueError: ``cores`` below 1.
    """
    if cores < 1:
        raise ValueError(f"cores must be at least 1, got {cores}")
    alone = shared = 0.0
    for r in rows:
        if r["job"].partition(".")[0] in MEASURING_RULES:
            alone += float(r["wall_s"])
        else:
            shared += float(r["cpu_s"] if r.get("cpu_s") is not None else r["wall_s"])
    return alone + shared / cores


def latest_run(rows: Iterable[Mapping[str, Any]], gap_s: float = RUN_GAP_S) -> tuple[float | None, int]:
    """The span of the latest run: first start to last end of the jobs whose intervals chain
    together (no idle gap over ``gap_s`` seconds) up to the last job to end.

    A results tree holds jobs from several runs (a rerun only redoes stale jobs), so the span of
    all of them would count the time between runs.

    Returns:
        ``(seconds, jobs)``; ``(None, 0)`` when no row has an end time.
    """
    start, end, count = _latest_run_bounds(rows, gap_s)
    return (None, 0) if start is None else (end - start, count)


def _latest_run_bounds(rows: Iterable[Mapping[str, Any]], gap_s: float = RUN_GAP_S
                       ) -> tuple[float | None, float | None, int]:
    """``(start, end, jobs)`` of the latest run (:func:`latest_run`), seconds since the epoch."""
    intervals = sorted((float(r["ended"]) - float(r["wall_s"]), float(r["ended"])) for r in rows
                       if r.get("ended") is not None)
    if not intervals:
        return None, None, 0
    start, end, count = intervals[0][0], intervals[0][1], 0
    for begin, finish in intervals:
        if begin > end + gap_s:  # idle: a new run starts
            start, end, count = begin, finish, 0
        end = max(end, finish)
        count += 1
    return start, end, count


def first_gated(results: str | os.PathLike, rows: Iterable[Mapping[str, Any]], models: Sequence[str],
                gap_s: float = RUN_GAP_S) -> list[dict[str, Any]]:
    """Per model, the first variant of the latest run to pass its accuracy gate, and when: the end of its
    ``accuracy.{variant}`` job (the gate's verdict, ``reports/{variant}.accuracy.json``), seconds after the run's
    first job started. The workflow gives building and gating priority over measuring (the rules' ``priority``),
    so this is when a user of the model could take a verified variant.

    Returns:
        ``[{model, variant, ready_s}]`` in ``models`` order; a model without a gated variant in the latest run
        is absent.
    """
    rows = list(rows)
    start, _, _ = _latest_run_bounds(rows, gap_s)
    if start is None:
        return []
    out = []
    for model in models:
        ready = []
        for r in rows:
            if r["model"] != model or not r["job"].startswith("accuracy.") or r.get("ended") is None:
                continue
            if float(r["ended"]) - float(r["wall_s"]) < start:
                continue  # an earlier run's
            variant = r["job"].split(".", 1)[1]
            if variant not in _VARIANT_NAMES:  # a peer's accuracy: not a variant a user of the model takes
                continue
            report = Path(results, model, "reports", f"{variant}.accuracy.json")
            if report.is_file() and read_json(report).get("gate") == "PASS":
                ready.append((float(r["ended"]) - start, variant))
        if ready:
            seconds, variant = min(ready)
            out.append({"model": model, "variant": variant, "ready_s": round(seconds, 1)})
    return out


def task_runs(rows: Iterable[Mapping[str, Any]], models: Sequence[str], gap_s: float = RUN_GAP_S
              ) -> list[dict[str, Any]]:
    """Per model, the latest run of its `task` target's jobs (:func:`is_task_job`): HumanEval's cost.

    Returns:
        ``[{model, jobs, span_s, total_job_s, ended}]`` in ``models`` order (models without task jobs absent):
        ``jobs`` and ``span_s`` (first start to last end, s) of the latest chain of its task jobs
        (:func:`latest_run`), ``total_job_s`` their wall times added up, ``ended`` the last end (seconds since
        the epoch).
    """
    rows = [r for r in rows if is_task_job(r) and r.get("ended") is not None]
    out = []
    for model in models:
        own = [r for r in rows if r["model"] == model]
        start, end, count = _latest_run_bounds(own, gap_s)
        if start is None:
            continue
        ran = [r for r in own if float(r["ended"]) - float(r["wall_s"]) >= start]
        out.append({"model": model, "jobs": count, "span_s": round(end - start, 1),
                    "total_job_s": round(sum(float(r["wall_s"]) for r in ran), 1), "ended": end})
    return out


def pipeline_table(results: str | os.PathLike, models: Sequence[str],
                   parents: Mapping[str, str] | None = None, cores: int | None = None) -> dict[str, Any]:
    """The pipeline table and its totals.

    Args:
        cores: the cores of the core bound; None: ``machine.json``'s ``affinity_cores`` in ``results``
            (no core bound without it).

    Returns:
        ``rows`` (:data:`COLUMNS`, ``critical`` True for jobs on the critical path; the `task` target's jobs
        too, which every figure below but ``task`` leaves out: :data:`TASK_RULE`),
        ``total_job_s`` (the sum of wall times: the run's length on one core),
        ``span_s`` and ``span_jobs`` (the latest run's first start to last end and its number of
        jobs, from the logs' times, :func:`latest_run`; None when unknown), ``run_ended`` (its last end,
        seconds since the epoch; None when unknown),
        ``critical_path_s`` and ``critical_path`` (``model/job`` names), ``cores`` and
        ``core_bound_s`` (:func:`core_bound`; None without cores), ``peak_rss_mib`` (the largest job's);
        ``models``, when jobs of more than one model ran: per model, ``total_job_s``, ``critical_path_s``,
        ``core_bound_s`` of its own jobs and ``alone_at_least_s``, the larger two: no run of that model
        alone on these cores is shorter (a lower bound from the jobs' figures in this run, not a run of it alone);
        ``first_gated``: per model, its first variant through the accuracy gate and when (:func:`first_gated`);
        ``task``: per model, the latest run of its `task` target's jobs (:func:`task_runs`).
    """
    every = collect_jobs(results, models)
    rows = [r for r in every if not is_task_job(r)]  # the main command's jobs: the `task` target's are a run apart
    if cores is None and Path(results, "machine.json").is_file():
        cores = read_json(Path(results, "machine.json")).get("affinity_cores")
    seconds, chain = critical_path(rows, parents, {m: sensitivity_readers(results, m) for m in models})
    on_path = set(chain)
    for r in every:
        r["critical"] = (f"{r['model']}/{r['job']}" if r["model"] else r["job"]) in on_path
    run_start, run_end, span_jobs = _latest_run_bounds(rows)
    span = None if run_start is None else run_end - run_start
    # each model alone, when the run built more than one
    ran = {m: own for m in models if (own := [r for r in rows if r["model"] == m])}
    per_model = []
    if len(ran) > 1:
        for model, own in ran.items():
            seconds_m, _ = critical_path(own, parents, {model: sensitivity_readers(results, model)})
            bound = None if not cores else core_bound(own, int(cores))
            per_model.append({
                "model": model,
                "total_job_s": round(sum(r["wall_s"] for r in own), 1),
                "critical_path_s": round(seconds_m, 1),
                "core_bound_s": None if bound is None else round(bound, 1),
                "alone_at_least_s": round(max(seconds_m, bound or 0.0), 1),
            })
    return {
        "rows": [{k: r[k] for k in COLUMNS} for r in every],
        "total_job_s": round(sum(r["wall_s"] for r in rows), 1),
        "span_s": None if span is None else round(span, 1),
        "span_jobs": span_jobs,
        "run_ended": run_end,
        "critical_path_s": round(seconds, 1),
        "critical_path": chain,
        "cores": cores,
        "core_bound_s": None if not cores else round(core_bound(rows, int(cores)), 1),
        "peak_rss_mib": max((r["peak_rss_mib"] or 0 for r in rows), default=0),
        "models": per_model,
        "first_gated": first_gated(results, rows, models),
        "task": task_runs(every, models),
    }


def pipeline_markdown(table: Mapping[str, Any]) -> str:
    """The "Pipeline" section of report.md: one row per job, then the totals."""
    lines = [
        "## Pipeline: where the time goes",
        "",
        "Wall time and peak RSS of every job (Snakemake's benchmark files; the exact peak from each "
        "job's log), longest first. **Critical path**: the longest chain of dependent jobs, the run's "
        "length with unlimited cores; jobs on it are marked.",
        "",
        f"- total of job wall times: {table['total_job_s'] / 60:.1f} min (one core, one job at a time)",
        "- latest run's span (first job's start to last job's end): "
        + ("unknown" if table["span_s"] is None
           else f"{table['span_s'] / 60:.1f} min over {table.get('span_jobs', 0)} jobs"),
        f"- critical path: {table['critical_path_s'] / 60:.1f} min: " + " → ".join(table["critical_path"]),
        *([f"- core bound on {table['cores']} cores: {table['core_bound_s'] / 60:.1f} min (the measuring jobs' wall "
           f"time, which run alone, plus the other jobs' CPU time over {table['cores']} cores: no schedule of these "
           "jobs on these cores is shorter)"] if table.get("core_bound_s") is not None else []),
        *[f"- {m['model']} alone: at least {m['alone_at_least_s'] / 60:.1f} min (its own jobs' critical path "
          f"{m['critical_path_s'] / 60:.1f} min"
          + (f", core bound {m['core_bound_s'] / 60:.1f} min" if m["core_bound_s"] is not None else "")
          + f"; their wall times add up to {m['total_job_s'] / 60:.1f} min)" for m in table.get("models", [])],
        *[f"- {g['model']}: first variant through its accuracy gate, {g['variant']}, {g['ready_s'] / 60:.1f} min "
          "after the run started" for g in table.get("first_gated", [])],
        *[f"- {t['model']}: the `task` target (HumanEval), a run of its own left out of the figures above: "
          f"{t['jobs']} jobs, {t['span_s'] / 60:.1f} min from the first start to the last end, their wall times "
          f"{t['total_job_s'] / 60:.1f} min" for t in table.get("task", [])],
        f"- largest job peak RSS: {table['peak_rss_mib']:.0f} MiB",
        "",
        "| model | job | wall s | CPU s | peak RSS MiB | critical path |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(table["rows"], key=lambda r: -r["wall_s"]):
        cpu = "" if r["cpu_s"] is None else f"{r['cpu_s']:.0f}"
        rss = "" if r["peak_rss_mib"] is None else f"{r['peak_rss_mib']:.0f}"
        lines.append(f"| {r['model']} | {r['job']} | {r['wall_s']:.1f} | {cpu} | {rss} | "
                     f"{'✓' if r['critical'] else ''} |")
    return "\n".join(lines) + "\n"
