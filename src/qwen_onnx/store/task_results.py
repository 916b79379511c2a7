"""Task results on disk (``results/{model}/reports/{name}.task.json``, written by
:func:`qwen_onnx.measure.task_accuracy.task_accuracy`): the settings they record, and whether one an earlier run of
the workflow's ``task`` target left is still current for the configuration at hand.

HumanEval is not part of the workflow's default run; its report shows the task results of an earlier ``task`` run
while they are current (:func:`current_task_files`) and names the others, so that a default run never reruns
HumanEval. Kept free of heavy imports: the workflow calls it while building its DAG.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from qwen_onnx.store.artifacts import read_json


def settings_record(problems: Any, max_new_tokens: int, timeout_s: float, memory_mb: int) -> dict[str, Any]:
    """The settings a ``task.json`` records (``settings``): the problems (``all``, a count or a list of task ids),
    the token limit, the sandbox's wall time (s) and address space (MiB) per program."""
    return {"problems": problems if isinstance(problems, (int, str)) else list(problems),
            "max_new_tokens": int(max_new_tokens), "timeout_s": float(timeout_s), "memory_mb": int(memory_mb)}


def current_task_files(paths: Sequence[str | os.PathLike], settings: Mapping[str, Mapping[str, Any]],
                       gates: Mapping[str, Mapping[str, float]], version: str) -> tuple[list[str], list[str]]:
    """The task results on disk that a run without the ``task`` target may show, and one note per result it may not.

    A ``task.json`` is current when it ran with the model's configured settings (``settings``: per model
    ``problems``, ``max_new_tokens``, ``timeout_s``, ``memory_mb``), its row's task gate (``gates``: per model; fp32,
    the reference, has none) and this ``version`` of qwen-onnx, and is newer than the ``accuracy.json`` beside it
    (older: the variant was rebuilt since). ``snakemake --cores 4 task`` brings the others up to date.

    Returns:
        ``(current, notes)``: the paths to show (as given), and one note per reason, such as ``"HumanEval results
        of an earlier `task` run not shown, as they predate their variant (tiny: int4); `snakemake --cores 4
        task` reruns them"``.
    """
    current: list[str] = []
    notes: list[str] = []
    stale: dict[str, dict[str, list[str]]] = {}
    for given in paths:
        path = Path(given)
        model, name = path.parents[1].name, path.name.removesuffix(".task.json")
        task = read_json(path)
        accuracy = path.with_name(f"{name}.accuracy.json")
        if model in settings and task.get("settings") != settings_record(**settings[model]):
            why = "were run with other task_accuracy settings"
        elif task.get("gate") != "reference" and model in gates and task.get("gate_limits") != dict(gates[model]):
            why = "were judged by another task gate"
        elif (task.get("library_versions") or {}).get("qwen-onnx") != version:
            why = f"were written by another qwen-onnx than {version}"
        elif accuracy.is_file() and accuracy.stat().st_mtime > path.stat().st_mtime:
            why = "predate their variant"
        else:
            current.append(os.fspath(given))
            continue
        stale.setdefault(why, {}).setdefault(model, []).append(name)
    for why, models in stale.items():
        names = "; ".join(f"{model}: {', '.join(found)}" for model, found in models.items())
        notes.append(f"HumanEval results on disk not shown, as they {why} ({names}); "
                     "`snakemake --cores 4 task` reruns them")
    return current, notes
