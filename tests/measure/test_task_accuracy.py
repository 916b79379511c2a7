"""Task accuracy: the HumanEval harness (every canonical solution passes, a wrong one fails), the answer's
extraction, the statistics and the gate, and the stage end to end on the tiny Qwen2."""

from __future__ import annotations

import importlib.util
import json
import math
import os

import pytest

from qwen_onnx.cli import main
from qwen_onnx.errors import ArtifactError, OptionError
from qwen_onnx.measure.humaneval import (
    HUMANEVAL_SIZE,
    Problem,
    block_closed,
    canonical_program,
    extract_code,
    load_problems,
    program,
    response_prefix,
    select_problems,
    subset_indices,
    user_message,
)
from qwen_onnx.measure.parity import NO_THINKING_MODE, NON_THINKING, chat_mode, chat_prompt_ids
from qwen_onnx.measure.sandbox import run_program
from qwen_onnx.measure.task_accuracy import (
    RECORD_KEYS,
    detectable_drop_points,
    mcnemar_exact_p,
    paired_comparison,
    peer_task_accuracy,
    summarize,
    task_accuracy,
    unresolved_note,
    wilson_interval,
)
from qwen_onnx.report.rows import task_columns
from qwen_onnx.settings.gates import DEFAULT_TASK_GATE, check_task_gate
from qwen_onnx.source.text import evenly_spaced
from qwen_onnx.store.task_results import current_task_files, settings_record

PROBLEMS = load_problems()
#: Problems whose chat prompt fits the tiny model's 512 positions with the tiny tokenizer (279 and 325 tokens).
TINY_PROBLEMS = ["HumanEval/53", "HumanEval/23"]


# --- the harness ---------------------------------------------------------------------------------------------

def test_every_canonical_solution_passes_and_a_wrong_one_fails_in_the_sandbox():
    assert [p.task_id for p in PROBLEMS] == [f"HumanEval/{i}" for i in range(HUMANEVAL_SIZE)]
    outcomes = {p.task_id: run_program(canonical_program(p)) for p in PROBLEMS}
    assert {t: (o.outcome, o.reason) for t, o in outcomes.items() if o.outcome != "passed"} == {}
    wrong = {p.task_id: run_program(program(p, p.prompt + "    return None\n")) for p in PROBLEMS}
    assert [t for t, o in wrong.items() if o.outcome == "passed"] == []
    assert wrong["HumanEval/0"].reason == "AssertionError"


HAS_CLOSE = PROBLEMS[0]
BODY = ("    for i, a in enumerate(numbers):\n        for b in numbers[i + 1:]:\n"
        "            if abs(a - b) < threshold:\n                return True\n    return False\n")


def test_a_fenced_whole_function_follows_the_prompt():
    whole = f"from typing import List\n\ndef has_close_elements(numbers, threshold):\n{BODY}"
    answer = f"Here it is:\n```python\n{whole}```\nDone."
    code = extract_code(HAS_CLOSE, answer)
    assert code == (HAS_CLOSE.prompt.rstrip("\n") + "\n\n\nfrom typing import List\n\n"
                    "def has_close_elements(numbers, threshold):\n" + BODY)
    assert run_program(program(HAS_CLOSE, code)).outcome == "passed"


def test_a_fenced_body_continues_the_prompt_and_a_bare_answer_is_taken_whole():
    assert extract_code(HAS_CLOSE, f"```\n{BODY}```") == HAS_CLOSE.prompt + BODY
    assert extract_code(HAS_CLOSE, BODY) == HAS_CLOSE.prompt + BODY  # no fence: the raw answer, as a body
    bare = f"def has_close_elements(numbers, threshold):\n{BODY}"  # no fence, whole function
    assert extract_code(HAS_CLOSE, bare) == HAS_CLOSE.prompt.rstrip("\n") + "\n\n\n" + bare
    # a block cut at the token limit is read to the end; only the first block counts
    assert extract_code(HAS_CLOSE, f"```py\n{BODY}") == HAS_CLOSE.prompt + BODY
    assert extract_code(HAS_CLOSE, f"```python\n{BODY}```\n```python\n    return 1\n```") == HAS_CLOSE.prompt + BODY
    # a nested def of the same name is not a top-level definition
    assert extract_code(HAS_CLOSE, "    def has_close_elements(x):\n        return x\n").startswith(HAS_CLOSE.prompt)


def test_the_answer_after_the_response_prefix_ends_at_the_closing_fence():
    """The assistant's turn starts with the opened block and the prompt (:data:`RESPONSE_PREFIX`): the model writes
    the body and closes the block; what follows is never read, so generation stops there."""
    problem = PROBLEMS[53]
    prefix = response_prefix(problem)
    assert prefix == "```python\n" + problem.prompt and not block_closed(prefix)
    answer = prefix + problem.canonical_solution + "```\n\nThis adds x and y."
    assert block_closed(prefix + problem.canonical_solution + "```")
    block = (problem.prompt + problem.canonical_solution).strip("\n")
    assert extract_code(problem, answer) == problem.prompt.rstrip("\n") + "\n\n\n" + block + "\n"
    assert run_program(program(problem, extract_code(problem, answer))).outcome == "passed"
    assert user_message(problem) == ("Complete the following Python function. Answer with the whole function in one "
                                     f"```python code block.\n```python\n{problem.prompt}```")


def test_problem_selection():
    assert subset_indices(4) == [0, 41, 82, 123]
    assert evenly_spaced(8, 59) == [0, 7, 14, 22, 29, 36, 44, 51] and evenly_spaced(3, 3) == [0, 1, 2]
    with pytest.raises(ValueError, match="9 of 8 indices: the count must be within 1 ... 8"):
        evenly_spaced(9, 8)
    assert [p.index for p in select_problems(PROBLEMS, 20)] == [i * 164 // 20 for i in range(20)]
    assert select_problems(PROBLEMS, "all") == PROBLEMS and select_problems(PROBLEMS, "164") == PROBLEMS
    assert [p.task_id for p in select_problems(PROBLEMS, ["HumanEval/3", 7])] == ["HumanEval/3", "HumanEval/7"]
    for bad, message in ((0, "problems 0 is out of range"), (165, "problems 165 is out of range"),
                         (["HumanEval/164"], "names 'HumanEval/164', no HumanEval problem"),
                         (["HumanEval/3", 3], "names a problem twice"), ("some", "'some' is not understood")):
        with pytest.raises(OptionError, match=message):
            select_problems(PROBLEMS, bad)


# --- statistics and the gate ---------------------------------------------------------------------------------

def test_wilson_interval_and_mcnemar_exact_p_have_their_textbook_values():
    assert wilson_interval(10, 20) == pytest.approx((0.29930, 0.70070), abs=1e-5)
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.27753), abs=1e-5)
    assert wilson_interval(20, 20) == pytest.approx((0.83887, 1.0), abs=1e-5)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert mcnemar_exact_p(0, 6) == 0.03125 == mcnemar_exact_p(6, 0)  # 2 x 0.5^6
    assert mcnemar_exact_p(1, 5) == 0.21875  # 2 x (1 + 6) / 64
    assert mcnemar_exact_p(3, 3) == 1.0 and mcnemar_exact_p(0, 0) == 1.0


def test_the_drop_a_set_of_problems_can_call_beyond_chance():
    """McNemar's exact p <= 0.05 needs six problems lost and none gained (p 0.03125; five give 0.0625)."""
    assert detectable_drop_points(164) == pytest.approx(100 * 6 / 164)  # 3.66 points
    assert detectable_drop_points(16) == 37.5 and detectable_drop_points(120) == 5.0
    assert detectable_drop_points(5) == math.inf
    assert detectable_drop_points(164, p_limit=0.01) == pytest.approx(100 * 8 / 164)  # 2 x 0.5^8 = 0.0078
    assert unresolved_note(164) is None and unresolved_note(120) is None
    assert unresolved_note(119) == ("pass@1 not shown: on 119 HumanEval problems McNemar's test (p <= 0.05) can tell "
                                    "only a drop of 5.0 points or more from chance; `snakemake --cores 4 task` "
                                    "scores all 164")


def _records(outcomes: dict[str, str]) -> list[dict]:
    return [{"task_id": t, "outcome": o, "tokens": 10, "generate_s": 1.0, "execute_s": 0.1}
            for t, o in outcomes.items()]


def test_paired_comparison_summary_and_gate():
    ids = [f"HumanEval/{i}" for i in range(20)]
    reference = _records({t: "passed" if i < 12 else "failed" for i, t in enumerate(ids)})
    # loses 0-3 and 5 (crash, timeout, fail), gains 12: 8 passed of 20
    mine = _records({t: ("crashed" if i == 0 else "timeout" if i == 1 else "failed") if i in (0, 1, 2, 3, 5)
                     else "passed" if i < 13 else "failed" for i, t in enumerate(ids)})
    summary = summarize(mine)
    assert (summary["problems"], summary["passed"], summary["pass_at_1_pct"]) == (20, 8, 40.0)
    assert summary["outcomes"] == {"passed": 8, "failed": 10, "timeout": 1, "crashed": 1, "skipped": 0}
    assert (summary["pass_at_1_low_pct"], summary["pass_at_1_high_pct"]) == pytest.approx((21.88, 61.34), abs=0.01)
    paired = paired_comparison(mine, reference)
    assert (paired["gained"], paired["lost"], paired["both_passed"], paired["both_failed"]) == (1, 5, 7, 7)
    assert paired["gained_ids"] == ["HumanEval/12"]
    assert paired["lost_ids"] == [f"HumanEval/{i}" for i in (0, 1, 2, 3, 5)]
    assert paired["mcnemar_p"] == 0.21875 and paired["pass_at_1_delta_points"] == -20.0
    # 20 points lost on 20 problems, but 1 gained and 5 lost happen by chance: a marginal pass
    marginal = ("pass@1 20 points below the reference, over 3 but within chance (McNemar p 0.22 > 0.05 on 20 "
                "problems): more problems settle it")
    assert check_task_gate(20.0, 20, 0.21875, DEFAULT_TASK_GATE) == ("PASS", [], [marginal])
    # 0 gained, 6 lost: beyond chance
    assert check_task_gate(30.0, 20, mcnemar_exact_p(0, 6), DEFAULT_TASK_GATE) == (
        "FAIL", ["pass_at_1_drop_points 30 > 3 (McNemar p 0.031 <= 0.05)"], [])
    # the point limit alone
    assert check_task_gate(20.0, 20, 0.21875, {"pass_at_1_drop_points": 3.0, "mcnemar_p": 1.0})[0] == "FAIL"
    assert check_task_gate(20.0, 20, 0.21875, {"pass_at_1_drop_points": 3.0})[0] == "FAIL"
    assert check_task_gate(0.0, 20, 1.0, DEFAULT_TASK_GATE) == ("PASS", [], [])
    assert check_task_gate(-5.0, 20, 1.0, DEFAULT_TASK_GATE) == ("PASS", [], [])
    assert check_task_gate(50.0, 20, 0.0, {}) == ("PASS", [], [])
    with pytest.raises(KeyError, match="task gate names top1_pct"):
        check_task_gate(0.0, 20, 1.0, {"top1_pct": 90})
    with pytest.raises(ArtifactError, match="other problems"):
        paired_comparison(mine[:-1], reference)


# --- the stage on the tiny model -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fp32_task(pipeline, tmp_path_factory):
    out = tmp_path_factory.mktemp("task") / "fp32.task.json"
    result = task_accuracy(pipeline["fp32"], pipeline["hf"], problems=TINY_PROBLEMS, max_new_tokens=8, threads=1,
                           output=out)
    return out, result


def test_the_stage_on_the_tiny_model_records_every_problem(pipeline, fp32_task):
    out, result = fp32_task
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    records = result["records"]
    assert [r["task_id"] for r in records] == TINY_PROBLEMS
    assert all(set(r) == set(RECORD_KEYS) for r in records)
    for record, problem in zip(records, select_problems(PROBLEMS, TINY_PROBLEMS)):
        assert 1 <= record["tokens"] <= 8 and record["answer"].startswith(response_prefix(problem))
        assert record["stopped"] in ("eos", "block closed", "max_new_tokens")
        assert record["outcome"] in ("passed", "failed", "timeout", "crashed")
    passed = sum(r["outcome"] == "passed" for r in records)
    assert (result["problems"], result["passed"], result["pass_at_1_pct"]) == (2, passed, 50.0 * passed)
    assert result["tokens"] == sum(r["tokens"] for r in records)
    assert result["gate"] == "reference" and result["settings"]["problems"] == TINY_PROBLEMS
    assert result["chat_mode"] == "template has no thinking mode"  # the tiny ChatML template, as Qwen2.5's
    generation_config = json.loads((pipeline["hf"] / "generation_config.json").read_text())
    assert result["eos_token_ids"] == generation_config["eos_token_id"]


def test_a_variant_is_paired_against_the_reference_and_gated(pipeline, fp32_task, tmp_path):
    reference, ref = fp32_task
    result = task_accuracy(pipeline["int8-dynamic"], pipeline["hf"], reference=reference, problems=TINY_PROBLEMS,
                           max_new_tokens=8, threads=1, output=tmp_path / "int8-dynamic.task.json")
    paired = paired_comparison(result["records"], ref["records"])
    assert result["paired"] == paired and result["reference_pass_at_1_pct"] == ref["pass_at_1_pct"]
    status, failures, marginal = check_task_gate(-paired["pass_at_1_delta_points"], 2, paired["mcnemar_p"],
                                                 DEFAULT_TASK_GATE)
    assert (result["gate"], result["gate_failures"], result["gate_marginal"]) == (status, failures, marginal)
    # two problems cannot tell any drop from chance: the report shows the set's size, its gate and why, no figure
    columns = task_columns(result)
    assert columns == {"task_problems": 2, "task_gate": status, "task_tokens": result["tokens"],
                       "task_s": result["seconds"],
                       "task_gate_note": "pass@1 not shown: on 2 HumanEval problems McNemar's test (p <= 0.05) can "
                                         "tell no drop from chance; `snakemake --cores 4 task` scores all 164"}
    # the same result on all 164 problems is shown, paired columns included
    full = {**result, "problems": 164}
    columns = task_columns(full)
    assert (columns["task_problems"], columns["pass_at_1_pct"], columns["task_gained"], columns["task_lost"],
            columns["task_gate"]) == (164, result["pass_at_1_pct"], paired["gained"], paired["lost"], status)


def test_a_reference_of_other_settings_is_refused_and_nothing_is_written(pipeline, fp32_task, tmp_path):
    reference, _ = fp32_task
    out = tmp_path / "int4.task.json"
    with pytest.raises(ArtifactError, match=r"other settings: max_new_tokens 4 \(the reference has 8\)"):
        task_accuracy(pipeline["int4"], pipeline["hf"], reference=reference, problems=TINY_PROBLEMS, max_new_tokens=4,
                      output=out)
    with pytest.raises(ArtifactError, match=r"other settings: problems 1: HumanEval/53 … HumanEval/53 \(the reference "
                                            r"has 2: HumanEval/53 … HumanEval/23\)"):
        task_accuracy(pipeline["int4"], pipeline["hf"], reference=reference, problems=["HumanEval/53"],
                      max_new_tokens=8, output=out)
    with pytest.raises(OptionError, match="max_new_tokens 0 is out of range"):
        task_accuracy(pipeline["int4"], pipeline["hf"], problems=TINY_PROBLEMS, max_new_tokens=0, output=out)
    assert not out.exists()


def test_the_cli_runs_the_same_stage(pipeline, fp32_task, tmp_path, capsys):
    reference, ref = fp32_task
    out = tmp_path / "fp32-again.task.json"
    code = main(["task-accuracy", str(pipeline["fp32"]), "--hf", str(pipeline["hf"]), "--problems", *TINY_PROBLEMS,
                 "--max-new-tokens", "8", "--threads", "1", "--reference", str(reference), "-o", str(out)])
    assert code == 0
    again = json.loads(out.read_text())
    # the same graph, greedy: the same answers, nothing gained or lost, and the gate passes
    assert [r["answer"] for r in again["records"]] == [r["answer"] for r in ref["records"]]
    assert (again["paired"]["gained"], again["paired"]["lost"], again["gate"]) == (0, 0, "PASS")
    assert f"fp32: pass@1 {ref['pass_at_1_pct']:.1f}%" in capsys.readouterr().out


def test_problem_records_name_the_stop_and_the_skip():
    problem = Problem("HumanEval/0", "def f():\n", "f", "    return 1\n", "def check(c):\n    assert c() == 1\n")
    assert run_program(program(problem, extract_code(problem, "```python\n    return 1\n```"))).outcome == "passed"
    assert summarize([{"task_id": "HumanEval/0", "outcome": "skipped"}])["outcomes"]["skipped"] == 1


# --- the peers -----------------------------------------------------------------------------------------------

@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                    reason="llama-cpp-python is not installed (envs/setup.sh --peers installs it)")
def test_llama_cpp_on_a_float32_gguf_answers_as_fp32_does(pipeline, fp32_task, tmp_path):
    """The tiny Qwen2 written to GGUF in float32, run by llama.cpp in a child process, paired against fp32."""
    from tiny_gguf import write_tiny_gguf

    reference, ref = fp32_task
    gguf = write_tiny_gguf(pipeline["hf"], tmp_path / "tiny-f32.gguf")
    result = peer_task_accuracy("llama.cpp", pipeline["hf"], source=str(gguf), reference=reference,
                                problems=TINY_PROBLEMS, max_new_tokens=8, threads=1,
                                output=tmp_path / "llama.cpp.task.json")
    assert "skipped" not in result, result.get("skipped")
    assert (result["peer"], result["name"], result["runtime"]) == ("llama.cpp", "llama.cpp", "llama.cpp")
    assert [r["task_id"] for r in result["records"]] == TINY_PROBLEMS
    assert result["paired"] == paired_comparison(result["records"], ref["records"])
    for record, problem in zip(result["records"], select_problems(PROBLEMS, TINY_PROBLEMS)):
        assert record["answer"].startswith(response_prefix(problem)) and 1 <= record["tokens"] <= 8
    assert json.loads((tmp_path / "llama.cpp.task.json").read_text())["gate"] == result["gate"]


def test_a_peer_that_cannot_run_is_recorded_with_the_reason(pipeline, fp32_task, tmp_path, monkeypatch):
    reference, _ = fp32_task
    kwargs = dict(reference=reference, problems=TINY_PROBLEMS, max_new_tokens=8)
    missing = peer_task_accuracy("genai-builder-int4", pipeline["hf"], genai_dir=None, output=tmp_path / "g.json",
                                 **kwargs)
    assert missing["skipped"] == "no builder graph: the genai_builder stage wrote none" and missing["isa"]
    assert json.loads((tmp_path / "g.json").read_text())["skipped"] == missing["skipped"]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    assert peer_task_accuracy("llama.cpp", pipeline["hf"], source=str(pipeline["hf"]), **kwargs)["skipped"] == (
        "llama-cpp-python is not installed; envs/setup.sh --peers installs it")
    with pytest.raises(OptionError, match="unknown peer 'openvino'"):
        peer_task_accuracy("openvino", pipeline["hf"], **kwargs)


def test_the_builders_graph_runs_as_an_onnx_variant(pipeline, fp32_task, tmp_path):
    if importlib.util.find_spec("onnxruntime_genai") is None:
        pytest.skip("onnxruntime-genai is not installed")
    from qwen_onnx.convert.genai_builder import build_genai_int4

    reference, ref = fp32_task
    build_genai_int4(pipeline["hf"], tmp_path / "genai")
    result = peer_task_accuracy("genai-builder-int4", pipeline["hf"], genai_dir=tmp_path / "genai",
                                reference=reference, problems=TINY_PROBLEMS, max_new_tokens=8, threads=1)
    assert (result["runtime"], result["problems"]) == ("onnxruntime", 2)
    assert result["paired"] == paired_comparison(result["records"], ref["records"])


# --- the chat mode: Qwen3's thinking switch ------------------------------------------------------------------

@pytest.fixture(scope="module")
def qwen3_chat_hf(tiny_qwen2, tmp_path_factory):
    """The tiny checkpoint's folder with a Qwen3-style chat template (``enable_thinking``), same tokenizer."""
    import shutil

    from tiny_models import QWEN3_CHAT_TEMPLATE, write_chat_template

    folder = tmp_path_factory.mktemp("qwen3-chat") / "hf"
    shutil.copytree(tiny_qwen2, folder)
    return write_chat_template(folder, QWEN3_CHAT_TEMPLATE)


def prompt_ids(tokenizer, problems):
    """The HumanEval prompts as the stage builds them, and their chat mode."""
    ids = chat_prompt_ids(tokenizer, [user_message(p) for p in problems], [response_prefix(p) for p in problems])
    return [i.tolist() for i in ids], chat_mode(tokenizer)[1]


def test_a_thinking_template_is_prompted_in_non_thinking_mode(qwen3_chat_hf, pipeline):
    from qwen_onnx.source.text import load_tokenizer

    tokenizer = load_tokenizer(qwen3_chat_hf)
    chosen = select_problems(PROBLEMS, TINY_PROBLEMS)
    assert chat_mode(tokenizer) == ({"enable_thinking": False}, "non-thinking (enable_thinking=False)")
    ids, mode = prompt_ids(tokenizer, chosen)
    assert mode == NON_THINKING
    for got, problem in zip(ids, chosen):
        messages = [{"role": "user", "content": user_message(problem)}]
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                 enable_thinking=False)
        assert rendered.endswith("<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
        assert got == tokenizer(rendered + response_prefix(problem), add_special_tokens=False)["input_ids"]
        # the template's default (thinking) prompt, with the code block opened right away, is not what is scored
        thinking = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert thinking.endswith("<|im_start|>assistant\n")
        assert got != tokenizer(thinking + response_prefix(problem), add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(got).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n```python\n"
                                              + problem.prompt)
    # a template without the switch (the tiny ChatML one, as Qwen2.5's): the prompts as before
    chatml = load_tokenizer(pipeline["hf"])
    ids, mode = prompt_ids(chatml, chosen)
    assert mode == NO_THINKING_MODE and chat_mode(chatml) == ({}, "template has no thinking mode")
    for got, problem in zip(ids, chosen):
        messages = [{"role": "user", "content": user_message(problem)}]
        chat = chatml.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert got == chatml(chat + response_prefix(problem), add_special_tokens=False)["input_ids"]


def test_the_task_report_states_the_chat_mode(pipeline, qwen3_chat_hf, fp32_task, tmp_path, caplog):
    import logging

    from qwen_onnx.source.text import load_tokenizer

    out = tmp_path / "fp32-qwen3.task.json"
    with caplog.at_level(logging.INFO, logger="qwen_onnx.measure.task_accuracy"):
        result = task_accuracy(pipeline["fp32"], qwen3_chat_hf, problems=TINY_PROBLEMS, max_new_tokens=8,
                               threads=1, output=out)
    assert result["chat_mode"] == json.loads(out.read_text())["chat_mode"] == "non-thinking (enable_thinking=False)"
    expected, _ = prompt_ids(load_tokenizer(qwen3_chat_hf), select_problems(PROBLEMS, TINY_PROBLEMS))
    assert [r["prompt_tokens"] for r in result["records"]] == [len(i) for i in expected]
    # the same prompts as the ChatML template's but for the empty think block (17 tokens of the tiny tokenizer)
    longer = {q["prompt_tokens"] - c["prompt_tokens"] for q, c in zip(result["records"], fp32_task[1]["records"])}
    assert longer == {17}
    lines = [r.getMessage() for r in caplog.records]
    assert any("2 HumanEval problems on onnxruntime, chat mode non-thinking (enable_thinking=False)" in line
               for line in lines), lines
    assert any("chat mode non-thinking (enable_thinking=False))" in line and "pass@1" in line for line in lines)


def test_a_reference_prompted_in_another_chat_mode_is_refused(pipeline, qwen3_chat_hf, fp32_task, tmp_path):
    reference, ref = fp32_task
    out = tmp_path / "int8-dynamic.task.json"
    with pytest.raises(ArtifactError, match=r"other settings: chat mode non-thinking \(enable_thinking=False\) "
                                            r"\(the reference has template has no thinking mode\); rerun the "
                                            r"reference with them"):
        task_accuracy(pipeline["int8-dynamic"], qwen3_chat_hf, reference=reference, problems=TINY_PROBLEMS,
                      max_new_tokens=8, output=out)
    # a reference from before chat_mode was recorded: prompted in the template's default (thinking) mode
    old = tmp_path / "old-fp32.task.json"
    old.write_text(json.dumps({k: v for k, v in ref.items() if k != "chat_mode"}))
    with pytest.raises(ArtifactError, match=r"chat mode non-thinking \(enable_thinking=False\) \(the reference was "
                                            r"prompted without enable_thinking, in the template's default thinking "
                                            r"mode\)"):
        task_accuracy(pipeline["int8-dynamic"], qwen3_chat_hf, reference=old, problems=TINY_PROBLEMS,
                      max_new_tokens=8, output=out)
    assert not out.exists()
    # ... which a template without the switch prompted as now: still a valid reference
    result = task_accuracy(pipeline["fp32"], pipeline["hf"], reference=old, problems=TINY_PROBLEMS, max_new_tokens=8,
                           threads=1)
    assert result["chat_mode"] == NO_THINKING_MODE and (result["paired"]["gained"], result["paired"]["lost"]) == (0, 0)


def test_an_earlier_task_runs_results_are_shown_only_while_current(pipeline, fp32_task, tmp_path):
    """The default run shows the task results a `task` run left while they are current, and names the others."""
    import qwen_onnx
    from qwen_onnx.store.artifacts import write_json

    reference, ref = fp32_task
    reports = tmp_path / "tiny" / "reports"
    reports.mkdir(parents=True)
    settings = {"problems": TINY_PROBLEMS, "max_new_tokens": 8, "timeout_s": 10, "memory_mb": 1024}
    assert ref["settings"] == settings_record(**settings)
    gate = dict(DEFAULT_TASK_GATE)
    paths = {}
    for name, extra in (("fp32", {}), ("int4", {"gate_limits": gate})):
        write_json(reports / f"{name}.accuracy.json", {})
        paths[name] = reports / f"{name}.task.json"
        write_json(paths[name], {**ref, "gate": "reference" if name == "fp32" else "PASS", **extra})
    version = qwen_onnx.__version__
    assert ref["library_versions"]["qwen-onnx"] == version

    def check(settings=settings, gate=gate, version=version):
        return current_task_files([str(p) for p in paths.values()], {"tiny": settings}, {"tiny": gate}, version)

    assert check() == ([str(paths["fp32"]), str(paths["int4"])], [])
    rerun = "`snakemake --cores 4 task` reruns them"
    assert check(settings={**settings, "max_new_tokens": 16}) == ([], [
        f"HumanEval results on disk not shown, as they were run with other task_accuracy settings "
        f"(tiny: fp32, int4); {rerun}"])
    assert check(gate={**gate, "mcnemar_p": 1.0}) == ([str(paths["fp32"])], [
        f"HumanEval results on disk not shown, as they were judged by another task gate (tiny: int4); "
        f"{rerun}"])
    assert check(version="9.9.9")[1] == [
        f"HumanEval results on disk not shown, as they were written by another qwen-onnx than 9.9.9 "
        f"(tiny: fp32, int4); {rerun}"]
    later = paths["int4"].stat().st_mtime + 10
    os.utime(reports / "int4.accuracy.json", (later, later))  # the variant rebuilt after its task result
    assert check() == ([str(paths["fp32"])], [
        f"HumanEval results on disk not shown, as they predate their variant (tiny: int4); {rerun}"])
