"""Published figures, regenerated from a run instead of copied by hand.

``qwen-onnx publish RESULTS`` reads a finished run's ``metrics.json``, ``machine.json`` and
``report.md`` and writes

- a measurement page (``docs/measurements/DATE-CPU.md``): where, when and at which commit the run
  ran, then the run's ``report.md`` as it is;
- the README's measured tables, one per model, between :data:`BEGIN` and :data:`END`: variant,
  gate, perplexity change, KL divergence, top-1 agreement, HumanEval pass@1, size, decode tokens/s, time to first token,
  and whether the timing round was idle, each model's table under a line naming the commit, date, CPU, ISA,
  the run's time (its last span and core bound, :mod:`qwen_onnx.report.pipeline`) and page of the run it comes from. A run of some models replaces their tables and keeps the others' (the latest
  run per model).

Nothing in the README between the markers is written by hand; a run that lacks a file is refused.
"""

from __future__ import annotations

import datetime
import os
import re
import subprocess
from pathlib import Path
from typing import Any, Sequence

from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.report.pipeline import pipeline_table
from qwen_onnx.store.artifacts import read_json, write_text

BEGIN = "<!-- measured:begin (written by `qwen-onnx publish` from a run; do not edit by hand) -->"
END = "<!-- measured:end -->"

#: Columns of the README's table: (header, metrics.json key, format).
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("variant", "variant", "{}"),
    ("gate", "gate", "{}"),
    ("perplexity Δ (%)", "ppl_delta_pct", "{:+.2f}"),
    ("KL (nats)", "kl_mean", "{:.3g}"),
    ("top-1 (%)", "top1_pct", "{:.1f}"),
    ("pass@1 (%)", "pass_at_1_pct", "{:.1f}"),
    ("size (MB)", "bytes_on_disk", "{:.0f}"),
    ("decode (tok/s)", "decode_tok_s", "{:.1f}"),
    ("TTFT (ms)", "ttft_ms", "{:.0f}"),
    ("timing", "timing_load", "{}"),
)


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    value = row.get(key)
    if key == "gate" and value is None:
        return "peer"  # llama.cpp and onnxruntime-genai's builder graph: timed, not gated
    if value is None or value == "":
        return "–"
    if key == "bytes_on_disk":
        value = value / 1e6
    return fmt.format(value)


def run_commit(results_dir: str | os.PathLike) -> str:
    """The short commit of the git checkout that holds ``results_dir`` (the code the run ran).

    Raises:
        QwenOnnxError: ``results_dir`` is not inside a git checkout (give ``--commit``).
    """
    try:
        out = subprocess.run(["git", "-C", str(results_dir), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        raise QwenOnnxError(f"{results_dir} is not inside a git checkout; give the run's commit with --commit") from None
    return out.stdout.strip()


def _read_run(results_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any], str]:
    missing = [n for n in ("metrics.json", "machine.json", "report.md") if not (results_dir / n).is_file()]
    if missing:
        raise QwenOnnxError(f"{results_dir} lacks {', '.join(missing)}: publish reads a finished run's report "
                            "(run the main command first)")
    return (read_json(results_dir / "metrics.json"), read_json(results_dir / "machine.json"),
            (results_dir / "report.md").read_text(encoding="utf-8"))


def run_date(results_dir: str | os.PathLike, ended: float | None = None) -> str:
    """The UTC date, ``YYYY-MM-DD``, the main command's run ended (``ended``, seconds since the epoch: the
    pipeline table's ``run_ended``), else the day its report was written (a later `task` run rewrites it)."""
    return _day(ended if ended is not None else (Path(results_dir) / "report.md").stat().st_mtime)


def machine_line(machine: dict[str, Any]) -> str:
    """``AMD EPYC, AVX2 (2 cores, 23.5 GiB)`` from ``machine.json``."""
    return (f"{machine.get('cpu_model', 'unknown CPU')}, {machine.get('isa', 'unknown ISA')} "
            f"({machine.get('logical_cores', '?')} cores, {machine.get('memory_gib', '?')} GiB)")


LEGEND = ("Timing: `idle` when every round of the model's sitting ran with the machine otherwise idle, else how "
          "many rounds were measured beside other load.")

#: A model's section in the block: ``**model**: measured ...`` (written by :func:`measured_tables`).
_SECTION = re.compile(r"^\*\*(?P<model>[^*]+)\*\*", re.MULTILINE)
#: The one provenance line of blocks written before the tables had one each.
_OLD_PROVENANCE = re.compile(r"Measured (?P<rest>\S+ at commit \S+ on .*? by the main command; the whole report: "
                             r"\[[^\]]+\]\([^)]+\))\.")


def run_time_clause(pipeline: dict[str, Any]) -> str:
    """`` in 97.3 min (its last run: 120 jobs, setup excluded; core bound 90.1 min on 2 cores)`` from
    :func:`qwen_onnx.report.pipeline.pipeline_table`; empty when the logs give no span."""
    if pipeline.get("span_s") is None:
        return ""
    bound = (f"; core bound {pipeline['core_bound_s'] / 60:.1f} min on {pipeline['cores']} cores"
             if pipeline.get("core_bound_s") is not None else "")
    return f" in {pipeline['span_s'] / 60:.1f} min (its last run: {pipeline['span_jobs']} jobs, setup excluded{bound})"


def task_time_clauses(pipeline: dict[str, Any]) -> dict[str, str]:
    """Per model, ``; its `task` target (HumanEval) YYYY-MM-DD: 5 jobs in 68.2 min`` from the ``task`` runs of
    :func:`qwen_onnx.report.pipeline.pipeline_table` (none for a model whose HumanEval never ran)."""
    return {t["model"]: f"; its `task` target (HumanEval) {_day(t['ended'])}: {t['jobs']} jobs in "
                        f"{t['span_s'] / 60:.1f} min" for t in pipeline.get("task", [])}


def _day(stamp: float) -> str:
    return datetime.datetime.fromtimestamp(stamp, datetime.timezone.utc).strftime("%Y-%m-%d")


def measured_tables(rows: Sequence[dict[str, Any]], machine: dict[str, Any], commit: str, date: str,
                    page: str, previous: str = "", run_time: str = "",
                    task_times: dict[str, str] | None = None) -> str:
    """The README block: a legend, then per model its provenance line and a Markdown table (PyTorch and
    every variant of ``metrics.json``, in its order).

    Args:
        rows: ``metrics.json``'s rows.
        machine: ``machine.json``.
        commit, date: the run's code and day.
        page: the measurement page's path, relative to the README.
        previous: the block as it was: the sections of models this run does not have are kept, in
            their place, with their own provenance (a block of the older one-line form lends each
            section its line).
        run_time: :func:`run_time_clause` of the run, after "by the main command".
        task_times: :func:`task_time_clauses` of the run, after ``run_time`` in each model's line.
    """
    lines = [LEGEND]
    problems = sorted({r["task_problems"] for r in rows if r.get("pass_at_1_pct") is not None})
    if problems:
        lines[0] += (f" pass@1: HumanEval, {' or '.join(map(str, problems))} problems, greedy, sandboxed "
                     "([docs/evaluation.md](docs/evaluation.md)); – where the `task` target did not score it.")
    else:
        lines[0] += (" pass@1: – as the run did not score HumanEval (the `task` target: "
                     "[docs/evaluation.md](docs/evaluation.md)).")
    sections: dict[str, str] = {}
    old = _OLD_PROVENANCE.search(previous.split("**", 1)[0]) if previous else None
    heads = list(_SECTION.finditer(previous))
    for head, after in zip(heads, [*heads[1:], None]):
        text = previous[head.start():after.start() if after else len(previous)].strip()
        if old and text.startswith(f"**{head['model']}**\n"):  # older form: give it the block's provenance
            text = f"**{head['model']}**: measured {old['rest']}.\n" + text.split("\n", 1)[1]
        sections[head["model"]] = text
    for model in dict.fromkeys(r["model"] for r in rows):
        table = [f"**{model}**: measured {date} at commit {commit} on {machine_line(machine)} by the main command"
                 f"{run_time}{(task_times or {}).get(model, '')}; "
                 f"the whole report: [{page}]({page}).", "",
                 "| " + " | ".join(h for h, _, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        table += ["| " + " | ".join(_cell(row, key, fmt) for _, key, fmt in COLUMNS) + " |"
                  for row in rows if row["model"] == model]
        sections[model] = "\n".join(table)
    lines += ["", "\n\n".join(sections.values())]
    return "\n".join(lines).rstrip() + "\n"


def current_block(text: str) -> str:
    """What ``text`` holds between :data:`BEGIN` and :data:`END` (empty without the markers)."""
    start, end = text.find(BEGIN), text.find(END)
    return text[start + len(BEGIN):end].strip() if 0 <= start < end else ""


def replace_block(text: str, block: str, source: str = "README.md") -> str:
    """``text`` with everything between :data:`BEGIN` and :data:`END` replaced by ``block``.

    Raises:
        QwenOnnxError: the markers are missing or out of order.
    """
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise QwenOnnxError(f"{source} has no '{BEGIN}' ... '{END}' block; add the two lines where the tables go")
    return text[:start + len(BEGIN)] + "\n" + block + text[end:]


def measurement_page(report: str, machine: dict[str, Any], commit: str, date: str, command: str) -> str:
    """The docs/measurements page: provenance, then the run's ``report.md`` (its title dropped)."""
    body = re.sub(r"\A# [^\n]*\n", "", report).lstrip("\n")
    return (f"# Measured {date} on {machine_line(machine)}\n\n"
            f"Generated by `qwen-onnx publish` from the run of `{command}` at commit {commit}; not edited. "
            f"Below: that run's `results/report.md`.\n\n{body}")


def publish(results_dir: str | os.PathLike, *, readme: str | os.PathLike | None, page: str | os.PathLike,
            commit: str | None = None, command: str = "envs/setup.sh --models --peers && .venv/bin/snakemake --cores 4",
            index: str | os.PathLike | None = None) -> dict[str, str]:
    """Write the measurement page and the README block from a finished run.

    Args:
        results_dir: the run's ``results/``.
        readme: the README to update (its block between the markers), or None.
        index: a second document with the same block, e.g. ``docs/measurements.md`` (its latest run), or None.
        page: the measurement page to write.
        commit: the run's commit (default: :func:`run_commit` of ``results_dir``).
        command: the command that made the run, for the page.

    Returns:
        ``{"page": ..., "readme": ..., "commit": ..., "date": ...}``.

    Raises:
        QwenOnnxError: a file of the run is missing, or the README has no block.
    """
    results_dir, page = Path(results_dir), Path(page)
    rows, machine, report = _read_run(results_dir)
    commit = commit or run_commit(results_dir)
    models = list(dict.fromkeys(r["model"] for r in rows))
    pipeline = pipeline_table(results_dir, models)
    date = run_date(results_dir, pipeline.get("run_ended"))
    targets = [Path(d) for d in (readme, index) if d is not None]
    texts = {d: d.read_text(encoding="utf-8") for d in targets}
    for document, text in texts.items():  # every block checked before anything is written
        replace_block(text, "", str(document))
    write_text(page, measurement_page(report, machine, commit, date, command))
    run_time, task_times = run_time_clause(pipeline), task_time_clauses(pipeline)
    for document, text in texts.items():
        relative = os.path.relpath(page, document.parent)
        block = measured_tables(rows, machine, commit, date, relative, previous=current_block(text),
                                run_time=run_time, task_times=task_times)
        write_text(document, replace_block(text, block, str(document)))
    return {"page": str(page), "readme": str(readme) if readme else "", "index": str(index) if index else "",
            "commit": commit, "date": date}
