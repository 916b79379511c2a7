"""The workflow through a cluster executor plugin: each job submitted as its own process.

The stand-in cluster is ``profiles/local-cluster`` (snakemake-executor-plugin-cluster-generic with
``submit.sh``, ``status.sh`` and ``cancel.sh``): every job runs as a separate ``snakemake --mode
remote`` process started by the submit script, as on SLURM, and the artifacts must equal those of
a local run of the same targets. Also checks the scripts' job states on their own, that the
commented SLURM profile (``profiles/slurm``) is accepted by Snakemake with its resources applied,
and, where snakemake-executor-plugin-slurm is installed, runs that profile through the plugin with
stand-in ``sbatch``/``squeue``/``srun`` (``tests/fake_slurm``).
"""

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from test_workflow import REPO, SNAKEMAKE, snakemake, write_config

pytestmark = pytest.mark.workflow

PROFILE = REPO / "profiles" / "local-cluster"
# Targets that cover every kind of stage but peers and report: resolve, export, optimize,
# sensitivity, the three quantizations, inspect, diff, reference, accuracy and profile.
TARGETS = (
    "results/tiny/reports/int8-static.accuracy.json",
    "results/tiny/reports/int8-static.diff.json",
    "results/tiny/reports/int8-dynamic.inspect.json",
    "results/tiny/reports/int4.profile.json",
    "results/tiny/reports/sensitivity.json",  # no quantizer of these needs it by default any more
)
# the jobs submitted to the cluster; inspect and diff (of TARGETS) are localrules (Snakefile)
JOBS = Counter({rule: 1 for rule in ("resolve", "export", "optimize", "sensitivity", "quantize_dynamic",
                                     "quantize_static", "quantize_int4", "reference", "accuracy", "profile")})
# Wall-clock figures, which differ from run to run (everything else must be equal).
MEASURED = re.compile(r"^(seconds|load_s|prefill_ms_.*|ttft_ms.*|decode_tok_s|decode_ms_per_token|profile|peak_rss_mib)$")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_qwen2, texts):
    """The same targets run locally and through the stand-in cluster, in two folders."""
    folders = {}
    # the local run on --cores 4, so that two of its 2-thread jobs overlap (the jobs' own threads are the same)
    for kind, args, cores in (("local", (), 4), ("cluster", ("--profile", str(PROFILE)), 2)):
        folder = tmp_path_factory.mktemp(kind)
        write_config(folder, str(tiny_qwen2), texts)
        result = snakemake(folder, *args, *TARGETS, cores=cores)
        assert result.returncode == 0, result.stderr[-4000:]
        folders[kind] = folder
    folders["cluster_output"] = result.stdout + result.stderr
    return folders


def normalized(value, folder: Path):
    """A JSON value with its measured figures dropped and the run's folder replaced by `RUN`."""
    if isinstance(value, dict):
        return {k: normalized(v, folder) for k, v in value.items() if not MEASURED.match(k)}
    if isinstance(value, list):
        return [normalized(v, folder) for v in value]
    if isinstance(value, str):
        return value.replace(str(folder), "RUN")
    return value


def test_every_job_went_through_the_submit_script(runs):
    spool = runs["cluster"] / ".snakemake" / "local-cluster"
    submitted = [line.split("\t") for line in (spool / "submitted.tsv").read_text().splitlines()]
    assert Counter(rule for _, rule, _ in submitted) == JOBS
    job_ids = [job_id for job_id, _, _ in submitted]
    assert len(set(job_ids)) == len(job_ids)
    for job_id, rule, _ in submitted:
        assert (spool / f"{job_id}.exit").read_text().strip() == "0", rule
        # each job is its own Snakemake process, run in remote mode for this one job
        log = (spool / f"{job_id}.log").read_text()
        assert "--mode remote" in log and f"--allowed-rules {rule} " in log, rule
        assert f"Finished jobid: 0 (Rule: {rule})" in log, rule
    for job_id in job_ids:
        assert f"with external jobid '{job_id}'." in runs["cluster_output"]


def assert_same_artifacts(local_run: Path, other_run: Path) -> None:
    """The same files under results/; every non-JSON one byte for byte (ONNX graphs, external data,
    safetensors, tokenizer, markdown), every JSON one up to its measured figures and run folder."""
    local, other = local_run / "results", other_run / "results"
    files = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(other).as_posix() for p in other.rglob("*") if p.is_file())
    for variant in ("fp32", "optimized", "int8-dynamic", "int8-static", "int4"):
        assert {"model.onnx", "model.onnx_data"} <= {p.name for p in (other / "tiny" / variant).iterdir()}
    compared = 0
    for name in files:
        if name.startswith(("logs/", "benchmarks/")):
            continue
        if name.endswith(".json"):
            a, b = (json.loads((root / name).read_text()) for root in (local, other))
            if name.endswith("/manifest.json"):
                # the JSON files it lists hold wall-clock figures (each compared on its own, up to those)
                a, b = ({**m, "files": [f for f in m["files"] if not f["name"].endswith(".json")]} for m in (a, b))
                assert len(a["files"]) >= 2, name
            assert normalized(a, local_run) == normalized(b, other_run), name
        else:
            a, b = (hashlib.sha256((root / name).read_bytes()).hexdigest() for root in (local, other))
            assert a == b, name
        compared += 1
    assert compared >= 20
    accuracy = json.loads((other / "tiny" / "reports" / "int8-static.accuracy.json").read_text())
    assert accuracy == json.loads((local / "tiny" / "reports" / "int8-static.accuracy.json").read_text()) | {
        "seconds": accuracy["seconds"]}
    ops = json.loads((other / "tiny" / "reports" / "int8-dynamic.inspect.json").read_text())["op_types"]
    assert ops["MatMulNBits"] == 2 * 5 + 1 and ops["GroupQueryAttention"] == 2
    # the profile job asks the cluster for the measured threads only (no local core count there)
    profile = json.loads((other / "tiny" / "reports" / "int4.profile.json").read_text())
    assert profile["threads"] == 1 and "MatMulNBits" in {op["op_type"] for op in profile["profile"]["ops"]}


def test_cluster_artifacts_equal_the_local_runs(runs):
    assert_same_artifacts(runs["local"], runs["cluster"])


def test_nothing_to_do_locally_after_the_cluster_run(runs):
    result = snakemake(runs["cluster"], "-n", *TARGETS)
    assert result.returncode == 0, result.stderr
    assert "Nothing to be done" in result.stdout + result.stderr


def _state(spool: Path, job_id: str) -> str:
    return subprocess.run(
        [str(PROFILE / "status.sh"), job_id], capture_output=True, text=True, check=True,
        env={"PATH": "/usr/bin:/bin", "QWEN_ONNX_CLUSTER_SPOOL": str(spool)},
    ).stdout.strip()


def _wait_for(spool: Path, job_id: str, state: str, seconds: float = 30) -> str:
    deadline = time.monotonic() + seconds
    while (current := _state(spool, job_id)) != state and time.monotonic() < deadline:
        time.sleep(0.2)
    return current


def test_submit_status_and_cancel_scripts(tmp_path):
    spool = tmp_path / "spool"
    env = {"PATH": "/usr/bin:/bin", "QWEN_ONNX_CLUSTER_SPOOL": str(spool)}

    def submit(body: str, rule: str) -> str:
        script = tmp_path / f"{rule}.sh"
        script.write_text(f'#!/bin/sh\n# properties = {{"type": "single", "rule": "{rule}"}}\n{body}\n')
        out = subprocess.run([str(PROFILE / "submit.sh"), str(script)], capture_output=True, text=True,
                             check=True, env=env, cwd=tmp_path).stdout
        assert re.fullmatch(r"\d+\n", out), out
        return out.strip()

    ok = submit("echo done", "ok")
    failing = submit("echo broken >&2; exit 3", "failing")
    sleeping = submit("sleep 60", "sleeping")
    assert _wait_for(spool, ok, "success") == "success"
    assert _wait_for(spool, failing, "failed") == "failed"
    assert (spool / f"{failing}.exit").read_text() == "3\n" and "broken" in (spool / f"{failing}.log").read_text()
    assert _state(spool, sleeping) == "running"
    subprocess.run([str(PROFILE / "cancel.sh"), sleeping], check=True, env=env)
    assert _wait_for(spool, sleeping, "failed") == "failed"
    assert [line.split("\t")[:2] for line in (spool / "submitted.tsv").read_text().splitlines()] == [
        [ok, "ok"], [failing, "failing"], [sleeping, "sleeping"]]


@pytest.mark.parametrize("override", [[], ["--set-resources", "export:mem_mb=40000", "export:runtime=180"]])
def test_slurm_profile_resources_apply_to_every_job(tmp_path, tiny_qwen2, texts, override):
    """profiles/slurm as the workflow profile, its executor left out (the SLURM plugin is not a
    requirement): Snakemake accepts every key, the measuring jobs get --exclusive, and every job
    has its declared memory and run time (sized here for a 1.5B model). A command-line
    --set-resources (the README's own example) replaces the profile's set-resources; the measuring
    jobs used to lose --exclusive with it, and keep it now that the rules declare it."""
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    assert profile.pop("executor") == "slurm"
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "config.yaml").write_text(yaml.safe_dump(profile))
    write_config(tmp_path, str(tiny_qwen2), texts)
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    config["models"]["tiny"]["params_billion"] = 1.54
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(tmp_path), "--workflow-profile",
         str(tmp_path / "profile"), "-n", "task", *override], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = re.findall(r"^rule (\w+):\n(?:    .*\n)*?    resources: (.*)$", result.stdout, re.M)
    resources = {rule: dict(item.split("=", 1) for item in line.split(", ")) for rule, line in jobs}
    assert set(resources) == {"resolve", "export", "preprocess", "sensitivity", "quantize_dynamic", "quantize_static", "quantize_mixed",
                              "quantize_int4", "float16", "optimize", "inspect", "diff", "reference", "accuracy", "profile",
                              "latency_row", "latency_row_pytorch", "genai_builder", "openvino_export", "sitting",
                              "accuracy_peer", "task_accuracy", "machine",
                              "report", "task",  # the `task` target: HumanEval too
                              # llama.cpp's own quantizations, planned where llama-cpp-python is installed
                              *(["llama_quantize"] if importlib.util.find_spec("llama_cpp") else [])}
    for rule, res in resources.items():
        assert res["slurm_partition"] == "cpu" and res["slurm_account"] == "my-account", rule
        if rule not in ("all", "task"):  # the targets run nothing
            assert int(res["mem_mb"]) >= 1000 and int(res["runtime"]) >= 10, rule
        assert (res.get("slurm_extra") == "--exclusive") == (rule in ("profile", "sitting", "machine"))
    # declared from params_billion (workflow/rules/common.smk), not replaced by the profile
    # MB (10^6 bytes) of 1.15 x the stage's line at 6.16 fp32 GB (resources.MEM_GIB): export 1.15 x (2.3 + 2.1 x
    # 6.16) x 1073.74 = 18,813
    export = ("40000", "180") if override else ("18813", "43")
    assert (resources["export"]["mem_mb"], resources["export"]["runtime"]) == export
    assert resources["profile"]["mem_mb"] == "10115"  # 1.15 x (0.8 + 1.2 x 6.16) GiB
    # the jobs that hold one session declare by its kind (resources.SESSION_MEM_GIB): accuracy 2.2 + 1.1 (float),
    # 2.1 + 0.8 (quantized) GiB per fp32 GB; HumanEval's task_accuracy 1.4 + 1.1 and 0.9 + 0.3
    sessions = {(rule, dict(w.split("=", 1) for w in wildcards.split(", "))["variant"]): dict(
        item.split("=", 1) for item in line.split(", "))["mem_mb"]
        for rule, wildcards, line in re.findall(r"^rule (accuracy|task_accuracy):\n(?:    .*\n)*?    wildcards: (.*)\n"
                                                r"(?:    .*\n)*?    resources: (.*)$", result.stdout, re.M)}
    assert sessions[("accuracy", "fp32")] == "11083" and sessions[("accuracy", "int4")] == "8678"
    assert sessions[("task_accuracy", "fp32")] == "10095" and sessions[("task_accuracy", "int4")] == "3393"
    assert resources["sitting"]["mem_mb"] == "13572" and resources["float16"]["mem_mb"] == "21381"
    assert resources["latency_row"]["mem_mb"] == "1000" and resources["latency_row_pytorch"]["mem_mb"] == "1000"


def test_every_rule_declares_threads_memory_and_runtime():
    rules = re.split(r"^rule ", "".join(p.read_text() for p in sorted((REPO / "workflow" / "rules").glob("*.smk"))),
                     flags=re.M)[1:]
    from qwen_onnx.settings.variants import VARIANTS

    assert {v.stage for v in VARIANTS} <= {body.split(":", 1)[0] for body in rules}
    for body in rules:
        name = body.split(":", 1)[0]
        for directive in ("    threads: ", "        mem_mb=", "        runtime=", "    log:", "    conda:"):
            assert directive in body, (name, directive)
        assert "\n    run:" not in body and "\n    shell:" not in body, name


@pytest.mark.skipif(importlib.util.find_spec("snakemake_executor_plugin_slurm") is None,
                    reason="snakemake-executor-plugin-slurm is not installed (not in envs/requirements.txt)")
def test_slurm_plugin_with_a_stand_in_sbatch(runs, tmp_path_factory, tiny_qwen2, texts):
    """profiles/slurm as it ships, through the SLURM executor plugin, with sbatch, squeue and
    srun stand-ins (tests/fake_slurm) that run each job as its own process on this machine."""
    folder = tmp_path_factory.mktemp("slurm")
    spool = tmp_path_factory.mktemp("slurm-spool")
    write_config(folder, str(tiny_qwen2), texts)
    env = {"PATH": os.pathsep.join([str(REPO / "tests" / "fake_slurm"), os.environ["PATH"]]),
           "FAKE_SLURM_SPOOL": str(spool)}
    result = snakemake(folder, "--workflow-profile", str(REPO / "profiles" / "slurm"), "--jobs", "2",
                       "--slurm-init-seconds-before-status-checks", "1", *TARGETS, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    calls = dict(line.split("\t", 1) for line in (spool / "sbatch.log").read_text().splitlines())
    rules = Counter(re.search(r"--comment rule_(\w+?)_wildcards", args).group(1) for args in calls.values())
    assert rules == JOBS
    for args in calls.values():
        rule = re.search(r"--comment rule_(\w+?)_wildcards", args).group(1)
        assert " -A my-account -p cpu -t 10 --mem 10" in args and " --ntasks=1 " in args, args
        assert ("--exclusive" in args) == (rule == "profile"), rule
        assert f"--cpus-per-task={1 if rule in ('inspect', 'diff', 'profile') else 2}" in args, rule
    assert len((spool / "srun.log").read_text().splitlines()) == len(calls)
    assert_same_artifacts(runs["local"], folder)


@pytest.mark.parametrize("params_billion, warned", [(7.6, True), (0.5, False)])
def test_a_job_declaring_more_than_the_memory_cap_is_named(tmp_path, tiny_qwen2, texts, params_billion, warned):
    """Snakemake runs a job declaring more than --resources mem_mb as if it needed the cap, silently
    (a 7.6B model's float16 declares 99,204 MB against a 22,000 MB cap); the workflow
    says so in one line per model."""
    write_config(tmp_path, str(tiny_qwen2), texts)
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    config["models"]["tiny"]["params_billion"] = params_billion
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    result = subprocess.run([SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(tmp_path), "-n", "--cores", "2",
                             "--resources", "mem_mb=22000"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("qwen-onnx: tiny")]
    if warned:
        # the largest line, float16's: 1.15 x (1.3 + 2.6 GiB per fp32 GB) in MB; every stage but quantize_dynamic over
        float16 = int(1.15 * (1.3 + 2.6 * 4 * params_billion) * 2**30 / 10**6)
        assert float16 == 99204
        assert lines == [f"qwen-onnx: tiny (params_billion {params_billion}) declares more memory than this run's "
                         f"mem_mb cap of 22,000 MB in 17 stages (float16 {float16:,} MB); Snakemake would run them as if "
                         "they needed the cap: use a machine with more memory (--resources mem_mb=N) or a cluster "
                         "(profiles/slurm)"]
    else:
        assert lines == []
