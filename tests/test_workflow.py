"""The Snakemake workflow end to end on the tiny Qwen2, in a temporary folder.

Checks the artifacts, the rerun behaviour (nothing to do after a full run; a calibration change
reruns only the static variant and what depends on it; one artifact builds only its ancestors) and
the messages for bad input.
"""

import csv
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from part_packages import make_part_packages
from timing_checks import assert_timed
from tiny_models import FAMILY_TIMED

from qwen_onnx.measure.task_accuracy import unresolved_note
from qwen_onnx.settings.variants import DIFFED
from qwen_onnx.settings.variants import NAMES as VARIANTS

#: The variants of the tiny models without a tflite one (write_config builds it for `tiny` only).
ONNX_VARIANTS = tuple(v for v in VARIANTS if v != "tflite")
#: The same-start llama.cpp rows (peers.llama_cpp_recipes' default): planned and measured only where
#: llama-cpp-python is installed (envs/setup.sh --peers; CI runs without it).
LLAMA_ROWS = ("llama.cpp-q4_k_m", "llama.cpp-q5_k_m") if importlib.util.find_spec("llama_cpp") else ()

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))

pytestmark = pytest.mark.workflow


def write_config(folder: Path, source, texts, extra_models=None, **overrides) -> None:
    """The tiny test configuration; the tflite variant (fp32, prefill 32 = half a window, KV cache 128:
    the longest chat prompt plus its generation) is built for the model `tiny` only, and only `tiny` gets task
    accuracy, on the two HumanEval problems whose prompts fit its 512 positions (none fits the tflite KV cache)."""
    config = {
        "models": {"tiny": {"source": source, "params_billion": 0.001, "tflite": {"enabled": True},
                            "task_accuracy": {"enabled": True}},
                   **(extra_models or {})},
        "task_accuracy": {"enabled": False, "problems": ["HumanEval/53", "HumanEval/23"], "max_new_tokens": 8},
        "tflite": {"enabled": False, "prefill_length": 32, "kv_cache_length": 128, "quantize": "none"},
        "quantize_static": {"samples": 4, "sequence_length": 32, "calibration_text": str(texts["calibration"])},
        "quantize_mixed": {"samples": 4, "sequence_length": 32, "calibration_text": str(texts["calibration"]),
                           "block_size": 16},
        "quantize_int4": {"importance_samples": 4, "calibration_sequence_length": 32,
                          "calibration_text": str(texts["calibration"])},
        "evaluation": {"text": str(texts["evaluation"]), "window": 64, "max_windows": 2, "kv_decode_steps": 4,
                       "generation_tokens": 6},
        "latency": {"prompt_lengths": [8, 16], "decode_prompt_tokens": 16, "new_tokens": 4, "warmup": 0,
                    "repeats": 1, "rounds": 1, "threads": 1, "load_watch_s": 0.1},
        # every variant built and timed, and the builder's graph in our runtime too: the opt-in ones are tested
        "variants": {"built": list(VARIANTS), "timed": list(VARIANTS)},
        "peers": {"genai_builder_ort": True},
    }
    for section, values in overrides.items():
        config.setdefault(section, {}).update(values)
    (folder / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")


def snakemake(folder: Path, *args: str, env: dict | None = None, cores: int = 2) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(folder), "--cores", str(cores), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=2400,
    )


#: The measuring rules on the latency threads (1 in write_config) instead of every core: the finished run's option.
UNEXCLUSIVE = ("--set-threads", "profile=1", "sitting=1", "machine=1")


def planned_jobs(result: subprocess.CompletedProcess) -> dict[str, int]:
    """Rule -> job count from a dry run's job stats table."""
    jobs = {}
    for line in result.stdout.splitlines():
        match = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if match and match.group(1) != "total":
            jobs[match.group(1)] = int(match.group(2))
    return jobs


# `families` and `finished_run` (the full run on three tiny models) are session fixtures in conftest.py,
# shared with test_faults.py.


def test_full_run_writes_every_artifact(finished_run):
    results = finished_run / "results"
    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "source.json"):
        assert (results / "tiny" / "hf" / name).is_file()
    for variant in VARIANTS:
        if variant == "tflite":
            assert (results / "tiny" / variant / "model.tflite").is_file()
        else:
            assert (results / "tiny" / variant / "model.onnx").is_file()
            assert (results / "tiny" / variant / "model.onnx_data").is_file()
        for kind in ("inspect.json", "inspect.md", "accuracy.json", "latency.json"):
            assert (results / "tiny" / "reports" / f"{variant}.{kind}").is_file()
        if variant in DIFFED:
            assert json.loads((results / "tiny" / "reports" / f"{variant}.diff.json").read_text())["nodes"]["a"] > 0
    # every variant folder carries its model card, written by the report stage from the run's figures
    from huggingface_hub import ModelCard

    int4_card = ModelCard.load(results / "tiny" / "int4" / "README.md")
    assert int4_card.data.library_name == "onnxruntime" and "int4" in int4_card.data.tags
    assert ModelCard.load(results / "tiny" / "tflite" / "README.md").data.library_name == "litert"
    assert "## Accuracy against PyTorch fp32" in int4_card.text
    # the tflite variant: only where enabled (tiny), not diffed, its gate that of its quantization (none: float)
    assert not (results / "tiny-qwen3" / "tflite").exists() and not (results / "tiny" / "reports" / "tflite.diff.json").exists()
    tflite = json.loads((results / "tiny" / "reports" / "tflite.accuracy.json").read_text())
    assert tflite["gate_kind"] == "float" and tflite["gate"] == "PASS", tflite["gate_failures"]
    assert tflite["top1_pct"] == 100.0 and tflite["padded_batch"].startswith("not applicable")
    assert json.loads((results / "tiny" / "reports" / "tflite.inspect.json").read_text())["format"] == "tflite"
    assert json.loads((results / "tiny" / "reports" / "tflite.latency.json").read_text())["profile"] is None
    with open(results / "metrics.csv", newline="") as f:
        rows_read = list(csv.DictReader(f))
    from qwen_onnx.report.peer_rows import is_peer_row

    # every speed figure comes from each model's one timing sitting (the sitting stage); the families' other
    # variants are built and scored, their rows say they were not timed and give no speed
    assert {r["measured_by"] for r in rows_read if r["model"] == "tiny"} == {"peers"}
    for r in (r for r in rows_read if r["model"] != "tiny"):
        timed = r["variant"] in ("pytorch", *FAMILY_TIMED)
        assert (r["measured_by"], r["decode_tok_s"] != "") == (("peers", True) if timed else ("not timed", False)), r
    every = [r for r in rows_read if not is_peer_row(r["variant"])]
    # the measured peers follow our rows (the tiny sources are folders: no GGUF for llama.cpp), our int4 and
    # int8-dynamic run by OpenVINO first; optimum-intel's export needs .venv-openvino and a width its group
    # size of 128 divides, so openvino-int4 is skipped on the tiny models
    openvino = ["int4-openvino", "int8-dynamic-openvino"] if importlib.util.find_spec("openvino") else []
    assert [(r["model"], r["variant"]) for r in rows_read if is_peer_row(r["variant"])] == [
        ("tiny", v) for v in (*openvino, *LLAMA_ROWS, "genai-builder-int4", "genai-builder-int4-ort")]
    for r in (r for r in rows_read if is_peer_row(r["variant"])):
        assert_timed({k: float(r[k]) for k in ("decode_tok_s", "ttft_ms")})
    peers = json.loads((results / "tiny" / "reports" / "peers.json").read_text())
    onnx = [v for v in VARIANTS if v != "tflite"]
    assert [r["peer"] for r in peers["rows"]] == ["pytorch", *onnx, "tflite", "int4-openvino", "int8-dynamic-openvino",
                                                  "llama.cpp", *LLAMA_ROWS, "genai-builder-int4",
                                                  "genai-builder-int4-ort", "openvino-int4"]
    by_peer = {r["peer"]: r for r in peers["rows"]}
    assert by_peer["openvino-int4"]["skipped"].startswith(("export failed: ", "openvino-genai not installed: "))
    accuracy = json.loads((results / "tiny" / "reports" / "int4-openvino.accuracy.json").read_text())
    if openvino:  # the same windows, int4's gate, OpenVINO's report
        assert (accuracy["runtime"], accuracy["gate_kind"]) == ("openvino", "int4") and accuracy["tokens"] > 0
        assert accuracy["openvino"]["compiled"]["INFERENCE_PRECISION_HINT"] == "f32"
    assert json.loads((results / "tiny" / "reports" / "openvino-int4.accuracy.json").read_text())["skipped"]
    # the other families (conftest.families): their timed variants and PyTorch, no peers (models.NAME.peers)
    for family in ("tiny-qwen1.5", "tiny-qwen3"):
        sitting = json.loads((results / family / "reports" / "peers.json").read_text())
        assert [r["peer"] for r in sitting["rows"]] == ["pytorch", *(v for v in VARIANTS if v in FAMILY_TIMED)]
        assert not list((results / family).glob("peers/*")) and not list((results / family / "reports").glob("genai-*"))
    # each variant's latency report holds the figures of its row in the sitting, and its own profile
    for variant in ("pytorch", *VARIANTS):
        latency = json.loads((results / "tiny" / "reports" / f"{variant}.latency.json").read_text())
        row = next(r for r in peers["rows"] if r["peer"] == variant)
        assert latency["decode_tok_s"] == row["decode_tok_s"], variant
        assert_timed(latency, (8, 16))
        assert latency["prefill_ms_p50_16"] == row["prefill_ms_16"] and latency["rounds"] == 1
        assert latency["measured_in"] == "peers.json"
        assert (latency.get("profile") is not None) == (variant not in ("pytorch", "tflite")), variant
    # without llama-cpp-python (CI: envs/setup.sh without --peers) the package is named first
    note = "no GGUF: the source " if importlib.util.find_spec("llama_cpp") else "llama-cpp-python not installed: "
    assert by_peer["llama.cpp"]["skipped"].startswith(note)
    # the ratios divide by the fastest peer: llama.cpp's own quantizations of the hf folder are peers too
    assert peers["reference"] == max((r for r in peers["rows"] if r["peer"] in ("genai-builder-int4", *LLAMA_ROWS)),
                                     key=lambda r: r["decode_tok_s"])["peer"]
    assert "## Against peers: tiny-qwen3" in (results / "report.md").read_text()
    assert [(r["model"], r["variant"]) for r in every] == [
        (m, v) for m in ("tiny", "tiny-qwen1.5", "tiny-qwen3")
        for v in ("pytorch", *(VARIANTS if m == "tiny" else ONNX_VARIANTS))]
    for row in every:
        if row["variant"] in ("fp32", "preprocessed", "optimized", "tflite"):
            assert row["gate"] == "PASS", (row["model"], row["variant"], row["gate_failures"])
    rows = {r["variant"]: r for r in every if r["model"] == "tiny"}
    fp32 = rows["fp32"]
    assert float(fp32["max_abs_logit_diff"]) < 1e-3 and float(fp32["top1_pct"]) == 100.0
    assert int(fp32["eval_tokens"]) == 2 * 63
    assert fp32["gate"] == "PASS" and float(fp32["generation_match_pct"]) == 100.0
    assert rows["pytorch"]["gate"] == "reference" and float(rows["pytorch"]["decode_speedup_vs_pytorch"]) == 1.0
    for variant in ("pytorch", *VARIANTS):
        row = rows[variant]
        assert_timed({k: float(row[k]) for k in ("decode_tok_s", "ttft_ms", "prefill_ms_p50_16", "prefill_ms_p90_16")},
                     (16,))
        assert 0 < float(row["roofline_pct"]), variant
        assert row["threads"] == "1"
    assert int(rows["int8-static"]["quant_ops"]) > 0
    # the gates the workflow applied are the default limits of each variant's kind, recomputed here
    from qwen_onnx.settings.gates import check_gate, default_gate, variant_kind

    for variant in ("int8-dynamic", "int8-static", "int4"):
        accuracy = json.loads((results / "tiny" / "reports" / f"{variant}.accuracy.json").read_text())
        kind = variant_kind(variant)
        assert accuracy["gate_kind"] == kind and accuracy["gate_limits"] == default_gate(kind)
        assert check_gate(accuracy, default_gate(kind)) == (accuracy["gate"], accuracy["gate_failures"])
        assert rows[variant]["gate"] == accuracy["gate"]
        assert rows[variant]["gate_failures"] == "; ".join(accuracy["gate_failures"])
    # task accuracy: tiny's shipped variants, each paired against fp32 on the same two problems
    fp32_task = json.loads((results / "tiny" / "reports" / "fp32.task.json").read_text())
    assert fp32_task["gate"] == "reference" and [r["task_id"] for r in fp32_task["records"]] == ["HumanEval/53",
                                                                                                  "HumanEval/23"]
    for variant in ("fp32", "int8-dynamic", "int8-static", "int4", "tflite"):
        task = json.loads((results / "tiny" / "reports" / f"{variant}.task.json").read_text())
        passed = sum(r["outcome"] == "passed" for r in task["records"])
        assert (task["problems"], task["passed"], task["pass_at_1_pct"]) == (2, passed, 50.0 * passed), variant
        # two problems cannot tell a loss from chance: the row gives the set's size and why, not the figure
        assert rows[variant]["pass_at_1_pct"] == "" and rows[variant]["task_problems"] == "2"
        assert rows[variant]["task_gate_note"] == unresolved_note(2)
        assert rows[variant]["task_gate"] == task["gate"]
        if variant != "fp32":
            lost = [r["task_id"] for r, ref in zip(task["records"], fp32_task["records"])
                    if ref["outcome"] == "passed" and r["outcome"] != "passed"]
            assert task["paired"]["lost_ids"] == lost and rows[variant]["task_lost"] == "", variant
    tflite_task = json.loads((results / "tiny" / "reports" / "tflite.task.json").read_text())
    assert [r["reason"] for r in tflite_task["records"]] == [
        f"the prompt of {r['prompt_tokens']} tokens leaves no room in the litert model's 128 positions"
        for r in tflite_task["records"]]
    assert not (results / "tiny-qwen3" / "reports" / "fp32.task.json").exists()
    assert not (results / "tiny" / "reports" / "fp16.task.json").exists()  # fp16 is opt-in (fp32's answers)
    assert rows["fp16"]["pass_at_1_pct"] == ""
    assert rows["pytorch"]["pass_at_1_pct"] == ""
    assert f"## Task accuracy (HumanEval pass@1)\n\n{unresolved_note(2)}.\n" in (results / "report.md").read_text()
    machine = json.loads((results / "machine.json").read_text())
    assert machine["memory_bandwidth_gb_s"] > 0 and machine["logical_cores"] >= 1
    assert json.loads((results / "metrics.json").read_text())[2]["variant"] == "preprocessed"
    report = (results / "report.md").read_text()
    assert "| tiny | int8-static |" in report and "## Columns" in report
    assert "## Across models" in report and "| tiny-qwen3 |" in report
    # the pipeline table: one row per job that ran, each with its wall time and peak RSS
    with (results / "pipeline.csv").open(encoding="utf-8") as f:
        pipeline = {(r["model"], r["job"]): r for r in csv.DictReader(f)}
    expected = {("tiny", j) for j in ("resolve", "export", "preprocess", "optimize", "sensitivity",
                                      "quantize_dynamic", "quantize_static", "quantize_int4", "latency_row.pytorch", "sitting")}
    expected |= {("tiny", f"{rule}.{v}") for v in VARIANTS for rule in ("inspect", "accuracy", "latency_row")}
    expected |= {("tiny", f"profile.{v}") for v in VARIANTS if v != "tflite"}
    expected |= {("tiny", f"task_accuracy.{v}") for v in ("fp32", "int8-dynamic", "int8-static", "int4", "tflite")}
    expected |= {("tiny", f"diff.{v}") for v in DIFFED} | {("", "machine"), ("tiny", "tflite")}
    assert expected <= set(pipeline)
    assert all(float(r["wall_s"]) > 0 and float(r["peak_rss_mib"]) > 50 for r in pipeline.values())
    assert "## Pipeline: where the time goes" in report and "critical path:" in report
    assert "## Graphs (inspection, and the change from fp32)" in report and "q/k norm" in report
    assert "## INT8 sensitivity per MatMul role" in report and "| tiny-qwen3 | down_proj | 2 |" in report
    sensitivity = json.loads((results / "tiny" / "reports" / "sensitivity.json").read_text())
    # the fused graph packs q/k/v into one qkv_proj MatMul: 2 layers x 5 weight MatMuls + lm_head
    assert len(sensitivity["nodes"]) == 2 * 5 + 1 and (results / "tiny" / "reports" / "sensitivity.md").is_file()
    # tiny-qwen3's override asks for 2 sensitive MatMuls blockwise; merged at every depth, the section
    # keeps config.yaml's max_fraction 0.1 and rank: 10% of its 15 weight MatMuls (2 layers x q, k, v, o,
    # gate, up, down + lm_head), rounded down, is 1
    info = json.loads((results / "tiny-qwen3" / "int8-static" / "quantize.json").read_text())
    assert {k: info["settings"][k] for k in ("sensitive_max_nodes", "sensitive_max_fraction", "sensitive_rank",
                                             "sensitive_scheme", "block_size")} == {
        "sensitive_max_nodes": 2, "sensitive_max_fraction": 0.1, "sensitive_rank": "static_percentile",
        "sensitive_scheme": "blockwise", "block_size": 16}
    sensitivity_qwen3 = json.loads((results / "tiny-qwen3" / "reports" / "sensitivity.json").read_text())
    assert len(sensitivity_qwen3["nodes"]) == 2 * 7 + 1
    assert [n["name"] for n in info["sensitive_nodes"]] == sensitivity_qwen3["rank_static_percentile"][:1]
    assert "MatMulNBits" in json.loads((results / "tiny-qwen3" / "reports" / "int8-static.inspect.json").read_text())["op_types"]
    # the default dynamic recipe: every weight MatMul blockwise
    dynamic_ops = json.loads((results / "tiny" / "reports" / "int8-dynamic.inspect.json").read_text())["op_types"]
    assert dynamic_ops["MatMulNBits"] == 2 * 5 + 1 and dynamic_ops["GroupQueryAttention"] == 2 and "DynamicQuantizeMatMul" not in dynamic_ops
    # int4: every weight MatMul MatMulNBits, the embedding GatherBlockQuantized
    int4_ops = json.loads((results / "tiny" / "reports" / "int4.inspect.json").read_text())["op_types"]
    assert int4_ops["MatMulNBits"] == 2 * 5 + 1 and int4_ops["GroupQueryAttention"] == 2 and int4_ops["GatherBlockQuantized"] == 1
    page = (results / "report.html").read_text()
    # self-contained: the plots inline, no link out (the base64 of a PNG may spell "http" by chance)
    assert page.count("data:image/png;base64,") == 4
    text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", page)
    assert not re.search(r"(src|href)=['\"]?https?:", text) and "http" not in text.replace("http-equiv", "")
    for plot in ("ppl_vs_size", "decode_tok_s", "prefill_latency", "accuracy_vs_speed"):
        assert (results / "plots" / f"{plot}.png").stat().st_size > 1000
    for rule in ("resolve", "export", "preprocess", "quantize_dynamic", "quantize_static", "optimize"):
        assert f"peak RSS of rule {rule}:" in (results / "logs" / "tiny" / f"{rule}.log").read_text()
        assert (results / "benchmarks" / "tiny" / f"{rule}.tsv").is_file()


def _tree_state(folder: Path) -> dict[str, tuple[int, int]]:
    """(mtime ns, size) of every file and folder under ``folder`` but Snakemake's own ``.snakemake``."""
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.stat().st_size)
            for p in sorted(folder.rglob("*")) if ".snakemake" not in p.parts}


def test_nothing_to_do_after_a_full_run_and_a_dry_run_writes_nothing(finished_run):
    """A dry run on a complete tree parses the workflow and plans nothing; parsing writes no file
    (the sweep of killed jobs' leftovers runs in onstart, on real runs only): a leftover planted
    under results/ is still there after -n, and every other file keeps its mtime."""
    import socket

    # a staging folder of a process that has ended (PID 999999 on this host): what sweep_tree removes
    leftover = finished_run / "results" / "tiny" / f".qwen-onnx-999999@{socket.gethostname()}~planted"
    leftover.mkdir()
    try:
        before = _tree_state(finished_run)
        result = snakemake(finished_run, "-n")
        assert result.returncode == 0, result.stderr
        assert "Nothing to be done" in result.stdout + result.stderr
        assert _tree_state(finished_run) == before
    finally:
        leftover.rmdir()


def test_calibration_change_reruns_only_the_static_variant(finished_run, texts):
    config = yaml.safe_load((finished_run / "config.yaml").read_text())
    original = yaml.safe_dump(config)
    config["quantize_static"]["samples"] = 3
    (finished_run / "config.yaml").write_text(yaml.safe_dump(config))
    try:
        everywhere = planned_jobs(snakemake(finished_run, "-n"))
        config["quantize_static"]["samples"] = 4
        config["models"]["tiny"]["quantize_static"] = {"samples": 3}  # one model's own override
        (finished_run / "config.yaml").write_text(yaml.safe_dump(config))
        one_model = planned_jobs(snakemake(finished_run, "-n"))
    finally:
        (finished_run / "config.yaml").write_text(original)
    # a changed timed variant is timed again with all the others (one sitting per model): every latency report
    # is rewritten from the new sitting, and only the changed variant is profiled again; task accuracy is
    # measured for `tiny` only: its int8-static's is measured again
    per_model = {"quantize_static": 1, "inspect": 1, "diff": 1, "accuracy": 1, "profile": 1, "sitting": 1,
                 "latency_row": len(VARIANTS), "latency_row_pytorch": 1}
    # the other families do not time int8-static (FAMILY_TIMED): built and scored again, their sitting stands
    family = {"quantize_static": 1, "inspect": 1, "diff": 1, "accuracy": 1}
    assert everywhere == {rule: per_model[rule] + 2 * family.get(rule, 0) for rule in per_model} | {
        "task_accuracy": 1, "report": 1, "all": 1}
    assert one_model == {**per_model, "task_accuracy": 1, "report": 1, "all": 1}


def test_float16_settings_rerun_only_the_fp16_variant_and_the_exporter_reruns_all(finished_run):
    config = yaml.safe_load((finished_run / "config.yaml").read_text())
    original = yaml.safe_dump(config)
    try:
        config["float16"] = {"blocked_ops": ["Pow", "ReduceMean"]}
        (finished_run / "config.yaml").write_text(yaml.safe_dump(config))
        blocked = planned_jobs(snakemake(finished_run, "-n"))
        config["float16"] = {}
        config["export"] = {"exporter": "torch", "opset": 18}
        (finished_run / "config.yaml").write_text(yaml.safe_dump(config))
        exporter = planned_jobs(snakemake(finished_run, "-n"))
    finally:
        (finished_run / "config.yaml").write_text(original)
    per_model = {"float16": 1, "inspect": 1, "diff": 1, "accuracy": 1, "profile": 1, "sitting": 1,
                 "latency_row": len(VARIANTS), "latency_row_pytorch": 1}
    family = {"float16": 1, "inspect": 1, "diff": 1, "accuracy": 1}  # fp16 untimed there (FAMILY_TIMED)
    assert blocked == {rule: per_model[rule] + 2 * family.get(rule, 0) for rule in per_model} | {
        "report": 1, "all": 1}  # no task job: fp16 is not among the default task variants
    assert exporter["export"] == 3 and exporter["preprocess"] == 3 and exporter["float16"] == 3
    assert "optimize" not in exporter  # the builder starts from hf, not from the export


def test_task_settings_rerun_only_the_task_jobs(finished_run):
    """Generation settings change every task result (fp32's first); the task gate only the paired ones. Only the
    `task` target reruns them."""
    config = yaml.safe_load((finished_run / "config.yaml").read_text())
    original = yaml.safe_dump(config)
    try:
        config["task_accuracy"]["max_new_tokens"] = 6
        (finished_run / "config.yaml").write_text(yaml.safe_dump(config))
        tokens = planned_jobs(snakemake(finished_run, "-n"))
        tokens_task = planned_jobs(snakemake(finished_run, "-n", "task"))
        config["task_accuracy"]["max_new_tokens"] = 8
        config["gates"] = {"task": {"pass_at_1_drop_points": 10.0}}
        (finished_run / "config.yaml").write_text(yaml.safe_dump(config))
        gate = planned_jobs(snakemake(finished_run, "-n"))
        gate_task = planned_jobs(snakemake(finished_run, "-n", "task"))
    finally:
        (finished_run / "config.yaml").write_text(original)
    # the default run never reruns HumanEval: its report leaves the out-of-date results out and names them
    assert tokens == {"report": 1, "all": 1} and gate == {"report": 1, "all": 1}
    assert tokens_task == {"task_accuracy": 5, "report": 1, "task": 1}  # fp32, int8-dynamic, int8-static, int4, tflite
    assert gate_task == {"task_accuracy": 4, "report": 1, "task": 1}


def test_adding_a_model_reruns_only_that_models_stages(finished_run, tiny_qwen2):
    config = yaml.safe_load((finished_run / "config.yaml").read_text())
    original = yaml.safe_dump(config)
    config["models"]["tiny-copy"] = {"source": str(tiny_qwen2), "params_billion": 0.001}
    (finished_run / "config.yaml").write_text(yaml.safe_dump(config))
    try:
        result = snakemake(finished_run, "-n")
    finally:
        (finished_run / "config.yaml").write_text(original)
    n = len(ONNX_VARIANTS)  # the copy has no tflite variant (tflite.enabled is false but for `tiny`)
    assert planned_jobs(result) == {"resolve": 1, "export": 1, "preprocess": 1, "sensitivity": 1, "quantize_dynamic": 1,
                                    "quantize_static": 1, "quantize_mixed": 1, "quantize_int4": 1,
                                    "float16": 1,
                    "optimize": 1, "inspect": n, "diff": n - 1, "reference": 1, "accuracy": n, "profile": n,
                    "latency_row": n, "latency_row_pytorch": 1, "genai_builder": 1, "openvino_export": 1,
                    "sitting": 1, "accuracy_peer": 5 + len(LLAMA_ROWS), "report": 1, "all": 1,
                    **({"llama_quantize": len(LLAMA_ROWS)} if LLAMA_ROWS else {})}


def test_evaluation_settings_rerun_the_reference_only_when_they_change_it(finished_run):
    """max_windows changes PyTorch's reference (once per model) and every accuracy job, the peers' too; the
    KV-cache steps are the accuracy jobs' own setting (the peers are scored with the same)."""
    reference = finished_run / "results" / "tiny" / "reference"
    meta = json.loads((reference / "reference.json").read_text())
    assert (meta["windows"], meta["window"], meta["generation_tokens"]) == (2, 64, 6)
    assert not any(p.is_dir() and p.name.startswith("reference.partial") for p in reference.parent.iterdir())
    config = yaml.safe_load((finished_run / "config.yaml").read_text())
    original = yaml.safe_dump(config)
    try:
        config["evaluation"]["max_windows"] = 1
        (finished_run / "config.yaml").write_text(yaml.safe_dump(config))
        windows = planned_jobs(snakemake(finished_run, "-n"))
        config["evaluation"]["max_windows"] = 2
        config["evaluation"]["kv_decode_steps"] = 3
        (finished_run / "config.yaml").write_text(yaml.safe_dump(config))
        steps = planned_jobs(snakemake(finished_run, "-n"))
    finally:
        (finished_run / "config.yaml").write_text(original)
    models = len(config["models"])
    accuracy = len(ONNX_VARIANTS) * models + 1  # and tiny's tflite
    # tiny's peers (the other families have none): llama.cpp, its own quantizations, the builder's graph,
    # optimum-intel's IR, our int4 and int8-dynamic by OpenVINO
    peers = 5 + len(LLAMA_ROWS)
    assert windows == {"reference": models, "accuracy": accuracy, "accuracy_peer": peers, "report": 1, "all": 1}
    assert steps == {"accuracy": accuracy, "accuracy_peer": peers, "report": 1, "all": 1}


def test_tflite_is_scheduled_only_within_the_memory_budget(tmp_path, tiny_qwen2, texts):
    """A 1.5B-sized model's tflite conversion (26 GiB per billion parameters, 40 GiB) is over the
    16 GiB budget: not scheduled, and the report will say why; raising the budget schedules it,
    tflite.enabled: false removes it everywhere."""
    # both models follow the global tflite section (no per-model override)
    big = {"tiny": {"source": str(tiny_qwen2), "params_billion": 0.001},
           "big": {"source": str(tiny_qwen2), "params_billion": 1.54}}

    def plan(**tflite):
        write_config(tmp_path, str(tiny_qwen2), texts, extra_models=big, tflite={"enabled": True, **tflite})
        result = snakemake(tmp_path, "-n")
        assert result.returncode == 0, result.stderr[-3000:]
        return planned_jobs(result), result.stdout

    jobs, out = plan()
    assert jobs["tflite"] == 1 and "output: results/tiny/tflite\n" in out and "results/big/tflite" not in out
    assert jobs["accuracy"] == len(VARIANTS) + len(ONNX_VARIANTS) and jobs["diff"] == 2 * len(DIFFED)
    assert "results/tiny/reports/tflite.latency.json" in out and "results/big/reports/tflite" not in out
    assert plan(max_rss_gib=41)[0]["tflite"] == 2
    assert "tflite" not in plan(enabled=False)[0]


def test_snakemake_report_with_captions(finished_run):
    result = snakemake(finished_run, "--report", "results/snakemake-report.zip")
    assert result.returncode == 0, result.stderr[-3000:]
    import zipfile

    with zipfile.ZipFile(finished_run / "results" / "snakemake-report.zip") as archive:
        names = archive.namelist()
        html = next(archive.read(n).decode() for n in names if n.endswith("report.html"))
        # the six report() outputs of the report rule and peers.md, each with its own file
        for name in ("report.md", "metrics.csv", "ppl_vs_size.png", "decode_tok_s.png", "prefill_latency.png",
                     "accuracy_vs_speed.png", "peers.md"):
            entry = next((n for n in names if n.endswith("/" + name)), None)
            assert entry is not None, (name, names)
            assert archive.getinfo(entry).file_size > 100, name
        png = next(n for n in names if n.endswith("/ppl_vs_size.png"))
        assert archive.read(png)[:8] == b"\x89PNG\r\n\x1a\n"
        header = archive.read(next(n for n in names if n.endswith("/metrics.csv"))).decode().splitlines()[0]
        assert header.startswith("model,variant,") and "top1_pct" in header
        # the captions (workflow/report/*.rst) are in the page's data (Snakemake keeps it beside report.html)
        pages = [archive.read(n).decode(errors="replace") for n in names if n.endswith((".html", ".js", ".json"))]
    assert "<html" in html
    # a JavaScript string in the page: its line breaks are written as the two characters \n
    assert any("lower left is better" in page.replace("\\n", " ").replace("\n", " ") for page in pages)


def planned_inputs(result: subprocess.CompletedProcess, rule: str) -> list[list[str]]:
    """The input files of each job of ``rule`` in a dry run's job list."""
    out, current = [], None
    for line in result.stdout.splitlines():
        if line.startswith("rule ") or line.startswith("localrule "):
            current = line.split()[1].rstrip(":")
        elif current == rule and line.strip().startswith("input:"):
            out.append(line.split("input:", 1)[1].strip().split(", "))
    return out


def test_the_default_build_leaves_opt_in_variants_out(tmp_path, tiny_qwen2, texts):
    """Without a `variants` section: no int8-mixed, and the sitting times the shipped variants, not
    preprocessed nor fp16 (fp32's kernels; their latency rows only say why)."""
    write_config(tmp_path, str(tiny_qwen2), texts)
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    del config["variants"], config["peers"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    result = snakemake(tmp_path, "-n")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "int8-mixed" not in result.stdout and "quantize_mixed" not in result.stdout
    (sitting,) = planned_inputs(result, "sitting")
    folders = [Path(p).name for p in sitting if Path(p).parent.name == "tiny"]
    # and int4, int8-dynamic again: the folders run by OpenVINO too (peers.openvino_variants)
    assert folders == ["hf", "fp32", "int8-dynamic", "int8-static", "int4", "optimized", "tflite", "int4",
                       "int8-dynamic"]
    assert planned_inputs(result, "accuracy") and "results/tiny/reports/preprocessed.accuracy.json" in result.stdout
    # HumanEval is the `task` target, not the default run: tiny's fp32 and shipped variants, paired against fp32
    assert "task_accuracy" not in planned_jobs(result)
    task = snakemake(tmp_path, "-n", "task")
    assert planned_jobs(task)["task_accuracy"] == 5 and planned_jobs(task)["report"] == 1
    (report,) = planned_inputs(task, "report")
    assert [Path(p).name for p in report if p.endswith(".task.json")] == [
        f"{v}.task.json" for v in ("fp32", "int8-dynamic", "int8-static", "int4", "tflite")]
    # opting in: int8-mixed built and timed
    config["variants"] = {"built": list(VARIANTS), "timed": ["fp32", "int8-mixed"]}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    result = snakemake(tmp_path, "-n")
    (sitting,) = planned_inputs(result, "sitting")
    # the OpenVINO rows follow peers.openvino_variants (built int4, int8-dynamic), not variants.timed
    assert [Path(p).name for p in sitting if Path(p).parent.name == "tiny"] == ["hf", "fp32", "int8-mixed", "int4",
                                                                                  "int8-dynamic"]


def planned_threads(result: subprocess.CompletedProcess, field: str = "threads", default: int = 1
                    ) -> dict[str, set[int]]:
    """Rule -> the threads (or another whole-number ``field``) of its jobs in a dry run's job list (``default``
    where the job states none)."""
    threads: dict[str, set[int]] = {}
    for block in re.split(r"^\[.*\]$", result.stdout, flags=re.M)[1:]:
        rule = re.search(r"^(?:local)?rule (\w+):", block, re.M)
        if rule:
            count = re.search(rf"^    {field}: (\d+)$", block, re.M)
            threads.setdefault(rule.group(1), set()).add(int(count.group(1)) if count else default)
    return threads


def test_the_int4_stage_starts_before_the_other_builds_and_they_before_the_measuring_jobs(tmp_path, tiny_qwen2, texts):
    """Among ready jobs Snakemake starts the higher priority first: each model's critical path to the int4 stage (the
    longest job), then the other builds and their gates, then the measuring and reporting jobs."""
    write_config(tmp_path, str(tiny_qwen2), texts)
    result = snakemake(tmp_path, "-n", cores=2)
    assert result.returncode == 0, result.stderr[-3000:]
    priority = planned_threads(result, "priority", default=0)
    assert priority["resolve"] == priority["optimize"] == priority["quantize_int4"] == {20}
    builds = ("export", "preprocess", "sensitivity", "quantize_dynamic", "quantize_static",
              "float16", "reference", "accuracy")
    assert all(priority[rule] == {10} for rule in builds), priority
    assert priority["sitting"] == priority["profile"] == priority["report"] == {0}


def test_the_measuring_jobs_claim_every_core(tmp_path, tiny_qwen2, texts):
    """profile, sitting and machine take every core Snakemake is given (3 here), so that nothing runs beside a
    measurement; the other jobs their own threads. --set-threads (the finished run's UNEXCLUSIVE) lifts it."""
    write_config(tmp_path, str(tiny_qwen2), texts)
    result = snakemake(tmp_path, "-n", cores=3)
    assert result.returncode == 0, result.stderr[-3000:]
    threads = planned_threads(result)
    assert threads["profile"] == threads["sitting"] == threads["machine"] == {3}
    assert all(max(t) <= 2 for rule, t in threads.items() if rule not in ("profile", "sitting", "machine")), threads
    assert threads["export"] == {2} and threads["inspect"] == {1}
    lifted = planned_threads(snakemake(tmp_path, "-n", *UNEXCLUSIVE, cores=3))
    assert lifted["profile"] == lifted["sitting"] == lifted["machine"] == {1}


def test_one_artifact_builds_only_its_ancestors(tmp_path, tiny_qwen2, texts):
    write_config(tmp_path, str(tiny_qwen2), texts)
    jobs = planned_jobs(snakemake(tmp_path, "-n", "results/tiny/preprocessed"))
    assert jobs == {"resolve": 1, "export": 1, "preprocess": 1}
    # the builder method reads the hf folder: the optimized variant needs no export
    assert planned_jobs(snakemake(tmp_path, "-n", "results/tiny/optimized")) == {"resolve": 1, "optimize": 1}


def test_unknown_source_is_named_and_leaves_no_artifact(tmp_path, texts):
    write_config(tmp_path, "./no-such-model", texts)
    result = snakemake(tmp_path, "results/tiny/hf")
    assert result.returncode != 0
    assert "unknown model source './no-such-model'" in result.stdout + result.stderr
    assert not (tmp_path / "results" / "tiny" / "hf").exists()


def test_misspelled_config_key_is_named_by_the_schema(tmp_path, tiny_qwen2, texts):
    write_config(tmp_path, str(tiny_qwen2), texts, quantize_static={"sampels": 3})
    result = snakemake(tmp_path, "-n")
    assert result.returncode != 0
    assert re.search(r"'sampels' was unexpected", result.stdout + result.stderr)


def test_part_with_wrong_checksum_is_named(tmp_path, texts):
    chunks = [b"GGUF-part-one" * 3, b"part-two" * 5]
    names = make_part_packages(tmp_path / "site", "qowf_part", chunks)
    whole = b"".join(chunks)
    digests = [hashlib.sha256(c).hexdigest() for c in chunks]
    digests[1] = "e" * 64
    source = {"name": "fake", "packages": names, "bytes": len(whole),
              "sha256": hashlib.sha256(whole).hexdigest(), "part_sha256": digests}
    write_config(tmp_path, source, texts)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")])}
    result = snakemake(tmp_path, "results/tiny/hf", env=env)
    assert result.returncode != 0
    assert f"checksum mismatch in part 2 from package '{names[1]}'" in result.stdout + result.stderr
    assert not (tmp_path / "results" / "tiny" / "hf").exists()


def test_workflow_passes_lint_and_format_checks():
    lint = subprocess.run(
        [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(REPO), "--lint", "--nolock"],
        capture_output=True, text=True, timeout=300,
    )
    assert "Congratulations" in lint.stdout + lint.stderr, lint.stdout[-3000:]
    fmt = subprocess.run(
        [str(Path(sys.executable).with_name("snakefmt")), "--check", "Snakefile", "workflow"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_the_python_code_passes_the_linter():
    """ruff with the project's rules (pyproject.toml): pyflakes, pycodestyle, import order."""
    lint = subprocess.run([str(Path(sys.executable).with_name("ruff")), "check", "."], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert lint.returncode == 0, lint.stdout[-3000:] + lint.stderr
