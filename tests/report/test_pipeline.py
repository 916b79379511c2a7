"""The pipeline table: jobs' wall time and peak RSS from benchmark files and logs, and the critical path."""

import json
import os

import pytest

from qwen_onnx.report.pipeline import critical_path, dependencies, pipeline_markdown, pipeline_table
from qwen_onnx.settings.variants import NAMES, variant

HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def _job(results, model, job, wall, rss, cpu, log_peak=None, child=0, ended=None):
    bench = results / "benchmarks" / model / f"{job}.tsv"
    bench.parent.mkdir(parents=True, exist_ok=True)
    bench.write_text(HEADER + f"{wall}\t0:00:01\t{rss}\t1\t1\t1\t1\t1\t50\t{cpu}\n", encoding="utf-8")
    log = results / "logs" / model / f"{job}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    text = "2026-12-01 INFO working\n"
    if log_peak is not None:
        text += f"2026-12-01 INFO qwen_onnx: peak RSS of rule {job}: {log_peak} MiB (largest child process: {child} MiB)\n"
    log.write_text(text, encoding="utf-8")
    if ended is not None:
        os.utime(log, (ended, ended))


def test_registry_names_kinds_and_parents():
    assert NAMES == ("fp32", "preprocessed", "int8-dynamic", "int8-static", "int8-mixed", "int4", "optimized",
                     "fp16", "tflite")
    assert variant("tflite").stage == "tflite" and variant("tflite").parent == "hf"
    assert variant("tflite").format == "tflite" and variant("fp16").format == "onnx"
    assert variant("fp16").stage == "float16" and variant("fp16").parent == "fp32"
    assert variant("fp16").kind == "float16"
    assert variant("int8-mixed").stage == "quantize_mixed" and variant("int8-mixed").kind == "int8_mixed"
    assert variant("int4").stage == "quantize_int4" and variant("int4").parent == "optimized"
    with pytest.raises(KeyError, match="unknown variant 'int2'; known: fp32, preprocessed"):
        variant("int2")


def test_dependencies_follow_the_registry():
    assert dependencies("quantize_int4") == ["optimize", "sensitivity"]
    assert dependencies("quantize_int4", {"int4": "preprocessed"}) == ["preprocess", "sensitivity"]
    assert dependencies("sensitivity") == ["optimize"]
    assert dependencies("preprocess") == ["export"]
    assert dependencies("float16") == ["export"]
    assert dependencies("accuracy.fp16") == ["float16", "resolve", "reference"]
    assert dependencies("diff.int8-static") == ["quantize_static", "export"]
    assert dependencies("accuracy.fp32") == ["export", "resolve", "reference"]
    assert dependencies("latency_row.pytorch") == ["resolve"]


def test_pipeline_table_reads_benchmarks_and_logs(tmp_path):
    m = "m"
    _job(tmp_path, m, "resolve", 10.0, 900, 8, log_peak=1000, ended=1000)
    _job(tmp_path, m, "export", 40.0, 3000, 30, log_peak=2500, child=3500, ended=1040)
    _job(tmp_path, m, "optimize", 5.0, 2000, 4, ended=1015)  # no peak line: the benchmark's sampled one
    _job(tmp_path, m, "preprocess", 12.0, 1500, 10, log_peak=1600, ended=1052)
    _job(tmp_path, m, "sensitivity", 20.0, 1200, 18, log_peak=1300, ended=1035)
    _job(tmp_path, m, "quantize_int4", 30.0, 1000, 25, log_peak=1100, ended=1065)
    _job(tmp_path, m, "accuracy.int4", 50.0, 4000, 45, log_peak=4100, ended=1115)
    _job(tmp_path, m, "latency_row.preprocessed", 9.0, 800, 9, log_peak=900, ended=1061)
    (tmp_path / "benchmarks" / "machine.tsv").write_text(HEADER + "2.0\t0\t100\t1\t1\t1\t1\t1\t1\t2\n")
    (tmp_path / "benchmarks" / "report.tsv").write_text(HEADER + "3.0\t0\t100\t1\t1\t1\t1\t1\t1\t2\n")
    _quantized(tmp_path, m, "int4", sensitive_max_nodes=3)  # int4 kept 3 sensitive MatMuls: it read the report
    table = pipeline_table(tmp_path, [m])
    rows = {r["job"]: r for r in table["rows"]}
    assert set(rows) == {"machine", "resolve", "export", "optimize", "preprocess", "sensitivity", "quantize_int4",
                         "accuracy.int4", "latency_row.preprocessed"}  # the report's own job is not in its table
    assert rows["export"]["peak_rss_mib"] == 3500  # the child's peak, from the log
    assert rows["optimize"]["peak_rss_mib"] == 2000 and rows["resolve"]["cpu_s"] == 8
    assert table["total_job_s"] == pytest.approx(10 + 40 + 5 + 12 + 20 + 30 + 50 + 9 + 2)
    # resolve 10 -> optimize 5 -> sensitivity 20 -> quantize_int4 30 -> accuracy.int4 50 = 115 s,
    # longer than resolve -> export -> preprocess -> latency (71 s)
    assert table["critical_path"] == ["m/resolve", "m/optimize", "m/sensitivity", "m/quantize_int4", "m/accuracy.int4"]
    assert table["critical_path_s"] == pytest.approx(115)
    assert {j for j, r in rows.items() if r["critical"]} == {"resolve", "optimize", "sensitivity", "quantize_int4",
                                                             "accuracy.int4"}
    assert table["span_s"] == pytest.approx(1115 - (1000 - 10))  # the machine job has no log: not counted
    assert table["span_jobs"] == 8
    text = pipeline_markdown(table)
    assert "critical path: 1.9 min: m/resolve → m/optimize" in text
    assert "| m | accuracy.int4 | 50.0 | 45 | 4100 | ✓ |" in text


def _quantized(results, model, variant, **settings):
    folder = results / model / variant
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "quantize.json").write_text(json.dumps({"kind": variant, "settings": settings}))


def test_a_quantize_stage_that_read_no_sensitivity_report_does_not_wait_for_it(tmp_path):
    """With the defaults (sensitive.max_nodes 0) no quantize stage reads the report: the sensitivity job
    is off the critical path, and `sensitivity_readers` says which stages read it from their quantize.json."""
    from qwen_onnx.report.pipeline import sensitivity_readers

    _job(tmp_path, "m", "resolve", 10.0, 900, 8, ended=1000)
    _job(tmp_path, "m", "optimize", 5.0, 2000, 4, ended=1015)
    _job(tmp_path, "m", "sensitivity", 20.0, 1200, 18, ended=1035)
    _job(tmp_path, "m", "quantize_int4", 30.0, 1000, 25, ended=1065)
    _job(tmp_path, "m", "quantize_static", 25.0, 1000, 25, ended=1090)
    _quantized(tmp_path, "m", "int4", sensitive_max_nodes=0)
    _quantized(tmp_path, "m", "int8-static", sensitive_max_nodes=12)
    assert sensitivity_readers(tmp_path, "m") == {"quantize_static"}
    assert dependencies("quantize_int4", reads_sensitivity={"quantize_static"}) == ["optimize"]
    table = pipeline_table(tmp_path, ["m"])
    # resolve 10 -> optimize 5 -> sensitivity 20 -> quantize_static 25 = 60 s, not via quantize_int4 (45 s)
    assert table["critical_path"] == ["m/resolve", "m/optimize", "m/sensitivity", "m/quantize_static"]
    _quantized(tmp_path, "m", "int8-static", sensitive_max_nodes=0)
    table = pipeline_table(tmp_path, ["m"])
    assert table["critical_path"] == ["m/resolve", "m/optimize", "m/quantize_int4"]
    assert table["critical_path_s"] == pytest.approx(45)


def test_the_span_is_the_latest_runs_only(tmp_path):
    """A rerun redoes only stale jobs: the span is that run's, not the time since the first run."""
    from qwen_onnx.report.pipeline import latest_run

    rows = [{"wall_s": 100.0, "ended": 1100.0}, {"wall_s": 50.0, "ended": 1140.0},  # first run: 1000-1140
            {"wall_s": 30.0, "ended": 9030.0}, {"wall_s": 20.0, "ended": 9100.0},  # rerun, 2 h later: 9000-9100
            {"wall_s": 5.0, "ended": None}]
    assert latest_run(rows) == (100.0, 2)
    assert latest_run(rows, gap_s=10_000) == (8100.0, 4)
    assert latest_run([{"wall_s": 5.0, "ended": None}]) == (None, 0)
    _job(tmp_path, "m", "resolve", 10.0, 900, 8, ended=1000)
    _job(tmp_path, "m", "export", 40.0, 3000, 30, ended=5040)
    table = pipeline_table(tmp_path, ["m"])
    assert (table["span_s"], table["span_jobs"]) == (40.0, 1)
    assert "latest run's span (first job's start to last job's end): 0.7 min over 1 jobs" in pipeline_markdown(table)


def test_the_core_bound_counts_measuring_jobs_alone_and_the_rest_over_the_cores(tmp_path):
    from qwen_onnx.report.pipeline import core_bound

    _job(tmp_path, "m", "resolve", 10.0, 900, 8, ended=1000)
    _job(tmp_path, "m", "accuracy.int4", 50.0, 4000, 45, ended=1050)
    _job(tmp_path, "m", "task_accuracy.int4", 70.0, 1400, 61, ended=1070)
    _job(tmp_path, "m", "sitting", 300.0, 3800, 150, ended=1400)  # measures: nothing beside it
    _job(tmp_path, "m", "profile.int4", 6.0, 900, 7, ended=1406)
    (tmp_path / "machine.json").write_text('{"affinity_cores": 2}')
    table = pipeline_table(tmp_path, ["m"])
    # 300 + 6 alone, then (8 + 45) CPU seconds over 2 cores; the `task` target's job is a run of its own
    assert table["cores"] == 2 and table["core_bound_s"] == pytest.approx(306 + 53 / 2)
    assert pipeline_table(tmp_path, ["m"], cores=4)["core_bound_s"] == round(306 + 53 / 4, 1)
    assert "- core bound on 2 cores: 5.5 min (the measuring jobs' wall time" in pipeline_markdown(table)
    (tmp_path / "machine.json").unlink()
    assert pipeline_table(tmp_path, ["m"])["core_bound_s"] is None
    assert "core bound" not in pipeline_markdown(pipeline_table(tmp_path, ["m"]))
    # a job without CPU time counts its wall time
    assert core_bound([{"job": "export", "wall_s": 40.0, "cpu_s": None}], 2) == pytest.approx(20)
    with pytest.raises(ValueError, match="cores must be at least 1, got 0"):
        core_bound([], 0)


def test_critical_path_of_nothing():
    assert critical_path([]) == (0.0, [])


def test_jobs_of_unregistered_variants_are_tabled_without_a_producer(tmp_path):
    """Benchmarks of a folder the registry does not know (a removed variant, a user's own rule) stay in
    the table; they once raised KeyError in the critical path."""
    assert dependencies("accuracy.coreml") == ["resolve", "reference"]
    assert dependencies("accuracy.tflite") == ["tflite", "resolve", "reference"]  # registered now, as fp16
    assert dependencies("latency_row.coreml") == []
    assert dependencies("quantize_int4", {"int4": "elsewhere"}) == ["sensitivity"]
    _job(tmp_path, "m", "resolve", 10.0, 900, 8, ended=1000)
    _job(tmp_path, "m", "latency_row.coreml", 70.0, 800, 60, ended=1100)
    _job(tmp_path, "m", "accuracy.coreml", 30.0, 800, 20, ended=1130)
    table = pipeline_table(tmp_path, ["m"])
    assert {r["job"] for r in table["rows"]} == {"resolve", "latency_row.coreml", "accuracy.coreml"}
    assert table["critical_path"] == ["m/latency_row.coreml"] and table["critical_path_s"] == pytest.approx(70)


def test_each_model_alone_is_bounded_by_its_own_jobs(tmp_path):
    """With two models, each gets the lower bound of a run of it alone: the larger of its own jobs' critical
    path and core bound (the 0.5B's target is stated alone, and a run of both interleaves their jobs)."""
    _job(tmp_path, "small", "resolve", 10.0, 900, 8, ended=1010)
    _job(tmp_path, "small", "optimize", 5.0, 900, 4, ended=1015)
    _job(tmp_path, "small", "quantize_int4", 100.0, 900, 90, ended=1115)
    _job(tmp_path, "small", "task_accuracy.fp32", 80.0, 900, 80, ended=1100)
    _job(tmp_path, "small", "sitting", 60.0, 900, 30, ended=1180)
    _job(tmp_path, "big", "resolve", 20.0, 900, 18, ended=1020)
    _job(tmp_path, "big", "sitting", 200.0, 900, 90, ended=1400)
    (tmp_path / "machine.json").write_text('{"affinity_cores": 2}')
    table = pipeline_table(tmp_path, ["small", "big"])
    small, big = table["models"]
    # small: resolve -> optimize -> quantize_int4 -> sitting = 175 s; core bound 60 alone + (8+4+90)/2 = 111 s
    # (its task_accuracy job belongs to the `task` target's run)
    assert small == {"model": "small", "total_job_s": 175.0, "critical_path_s": 175.0, "core_bound_s": 111.0,
                     "alone_at_least_s": 175.0}
    # big: resolve -> sitting = 220 s; core bound 200 + 18/2 = 209 s
    assert (big["critical_path_s"], big["core_bound_s"], big["alone_at_least_s"]) == (220.0, 209.0, 220.0)
    text = pipeline_markdown(table)
    assert ("- small alone: at least 2.9 min (its own jobs' critical path 2.9 min, core bound 1.9 min; their wall "
            "times add up to 2.9 min)") in text
    assert pipeline_table(tmp_path, ["small"])["models"] == []  # one model: the run's own figures say it


def test_the_first_variant_through_its_gate_is_timed_from_the_runs_start(tmp_path):
    """Per model, the first accuracy job of the latest run whose verdict is PASS, from the run's first start."""
    _job(tmp_path, "m", "accuracy.int4", 30.0, 900, 8, ended=100)  # an earlier run's
    _job(tmp_path, "m", "resolve", 100.0, 900, 8, ended=10_100)  # the latest run starts at 10,000
    _job(tmp_path, "m", "accuracy.int8-static", 200.0, 900, 8, ended=10_300)
    _job(tmp_path, "m", "accuracy.int8-dynamic", 260.0, 900, 8, ended=10_360)
    _job(tmp_path, "m", "accuracy.fp32", 400.0, 900, 8, ended=10_500)
    _job(tmp_path, "m", "accuracy.llama.cpp", 100.0, 900, 8, ended=10_200)  # a peer: not a variant
    reports = tmp_path / "m" / "reports"
    reports.mkdir(parents=True)
    for name, gate in (("int4", "PASS"), ("int8-static", "FAIL"), ("int8-dynamic", "PASS"), ("fp32", "PASS"),
                       ("llama.cpp", "PASS")):
        (reports / f"{name}.accuracy.json").write_text(json.dumps({"gate": gate}))
    table = pipeline_table(tmp_path, ["m", "other"])
    assert table["first_gated"] == [{"model": "m", "variant": "int8-dynamic", "ready_s": 360.0}]
    assert "- m: first variant through its accuracy gate, int8-dynamic, 6.0 min after the run started" in (
        pipeline_markdown(table))


def test_the_task_targets_jobs_are_a_run_of_their_own(tmp_path):
    """HumanEval runs after the main command (`snakemake task`): its jobs stay in the table but out of the main
    run's span, critical path, core bound and totals, and get a line per model of their own."""
    _job(tmp_path, "m", "resolve", 100.0, 900, 90, ended=1_100)
    _job(tmp_path, "m", "export", 300.0, 900, 250, ended=1_400)
    _job(tmp_path, "m", "accuracy.fp32", 50.0, 900, 40, ended=1_450)
    # an hour later: fp32's HumanEval, then int4's right after it; an older int4 run's, a day before
    _job(tmp_path, "m", "task_accuracy.fp32", 1_500.0, 900, 2_900, ended=6_000)
    _job(tmp_path, "m", "task_accuracy.int4", 600.0, 900, 1_100, ended=6_610)
    _job(tmp_path, "other", "task_accuracy.int4", 40.0, 900, 30, ended=500)
    (tmp_path / "machine.json").write_text('{"affinity_cores": 2}')
    table = pipeline_table(tmp_path, ["m", "other"])
    assert (table["span_s"], table["span_jobs"], table["run_ended"]) == (450.0, 3, 1_450)
    assert table["critical_path"] == ["m/resolve", "m/export", "m/accuracy.fp32"] and table["total_job_s"] == 450.0
    assert table["core_bound_s"] == pytest.approx(380 / 2)
    assert table["task"] == [{"model": "m", "jobs": 2, "span_s": 2_110.0, "total_job_s": 2_100.0, "ended": 6_610},
                             {"model": "other", "jobs": 1, "span_s": 40.0, "total_job_s": 40.0, "ended": 500}]
    assert {r["job"]: r["critical"] for r in table["rows"] if r["model"] == "m"}["task_accuracy.fp32"] is False
    assert ("- m: the `task` target (HumanEval), a run of its own left out of the figures above: 2 jobs, 35.2 min "
            "from the first start to the last end, their wall times 35.0 min") in pipeline_markdown(table)
