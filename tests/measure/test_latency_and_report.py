"""Latency protocol, ORT profile summary, decode roofline bytes and the combined report."""

import csv
import json

import numpy as np
import onnx
import pytest
from fake_reports import fake_reports
from timing_checks import assert_timed

from qwen_onnx.measure.inspect_graph import decode_weight_bytes, initializer_bytes
from qwen_onnx.measure.latency import measure_latency, percentile
from qwen_onnx.measure.latency_torch import measure_torch_latency
from qwen_onnx.measure.profile import summarise_trace
from qwen_onnx.report.build import build_report
from qwen_onnx.report.tables import columns
from qwen_onnx.run.machine import memory_bandwidth_gb_s
from qwen_onnx.settings.timing import TimingSettings

VOCAB, HIDDEN = 384, 64
SMALL = TimingSettings(prompt_lengths=(8, 16), decode_prompt_tokens=16, new_tokens=5, threads=1, warmup=0, repeats=3)


def test_percentile_interpolates_like_numpy():
    assert percentile([1.0, 2.0, 3.0, 4.0], 90) == pytest.approx(3.7)
    assert percentile([5.0], 90) == 5.0


def test_profile_summary_sums_kernel_time_per_op_type(tmp_path):
    trace = [
        {"cat": "Session", "name": "model_run", "dur": 999},
        {"cat": "Node", "name": "a_kernel_time", "dur": 300, "args": {"op_name": "MatMul"}},
        {"cat": "Node", "name": "b_kernel_time", "dur": 100, "args": {"op_name": "MatMul"}},
        {"cat": "Node", "name": "c_kernel_time", "dur": 100, "args": {"op_name": "Softmax"}},
        {"cat": "Node", "name": "c_fence_before", "dur": 50, "args": {"op_name": "Softmax"}},
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    summary = summarise_trace(path)
    assert summary["total_ms"] == pytest.approx(0.5)
    assert summary["ops"][0] == {"op_type": "MatMul", "ms": 0.4, "pct": 80.0, "calls": 2}
    assert summary["ops"][1]["op_type"] == "Softmax" and summary["ops"][1]["pct"] == pytest.approx(20.0)
    top = summarise_trace(path, top=1)
    assert top["ops"][1] == {"op_type": "other", "ms": 0.1, "pct": 20.0, "calls": 1}


def test_decode_weight_bytes_counts_one_embedding_row(pipeline):
    proto = onnx.load(str(pipeline["fp32"] / "model.onnx"), load_external_data=False)
    total = sum(initializer_bytes(t) for t in proto.graph.initializer)
    embedding = VOCAB * HIDDEN * 4
    assert decode_weight_bytes(proto) == total - embedding + HIDDEN * 4


def test_decode_weight_bytes_counts_one_row_of_the_rotary_tables(pipeline):
    proto = onnx.load(str(pipeline["optimized"] / "model.onnx"), load_external_data=False)
    sizes = {t.name: initializer_bytes(t) for t in proto.graph.initializer}
    # GroupQueryAttention indexes cos_cache/sin_cache [max_position 512, head_dim 16 / 2] fp32 by position
    tables = {t.name: list(t.dims) for t in proto.graph.initializer if t.name in ("cos_cache", "sin_cache")}
    assert tables == {"cos_cache": [512, 8], "sin_cache": [512, 8]}
    whole = sum(sizes.values()) - VOCAB * HIDDEN * 4 + HIDDEN * 4
    assert decode_weight_bytes(proto) == whole - 2 * 512 * 8 * 4 + 2 * 8 * 4


def test_bandwidth_counts_read_and_write_of_the_best_repeat(monkeypatch):
    import qwen_onnx.run.machine as machine

    # (start, end) per pass: the warm-up pass (1 s) is dropped, the best of the two timed ones kept
    clock = iter([0.0, 1.0, 10.0, 10.020, 20.0, 20.010])
    monkeypatch.setattr(machine.time, "perf_counter", lambda: next(clock))
    figure = memory_bandwidth_gb_s(threads=2, mib_per_thread=4, repeats=2)
    # STREAM Copy: each of 2 threads reads and writes 4 MiB in 10 ms
    assert figure == pytest.approx(2 * 2 * 4 * 2**20 / 0.010 / 1e9)


def test_bandwidth_of_this_machine_is_a_dram_figure():
    figure = memory_bandwidth_gb_s(threads=1, mib_per_thread=64, repeats=2)
    assert 1 < figure < 100  # one core copying 64 MiB (past any cache): DDR4/DDR5 territory


@pytest.mark.parametrize("variant", ["fp32", "int8-dynamic"])
def test_latency_protocol_reports_every_figure(pipeline, texts, variant, tmp_path):
    result = measure_latency(pipeline[variant], texts["evaluation"], SMALL, output=tmp_path / "l.json")
    assert_timed(result, (8, 16), timing=SMALL)
    assert result["peak_rss_mib"] > 50
    ops = result["profile"]["ops"]
    assert sum(o["pct"] for o in ops) == pytest.approx(100.0)
    # which MatMul kernel ranks in the top 12 of the tiny model varies; MatMulIntegerToFloat is ORT's fusion
    # of DynamicQuantizeLinear + MatMulInteger + Mul
    assert {"MatMul", "MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"} & {o["op_type"] for o in ops}
    assert result["threads"] == 1 and result["prompt_lengths"] == [8, 16]
    assert result["decode_loop"] == "bound" and result["kv_share_buffer"] is False
    assert result["session_settings"]["graph_optimization_level"] == "all"
    assert json.loads((tmp_path / "l.json").read_text())["decode_tok_s"] == result["decode_tok_s"]


def test_latency_command_line_passes_the_protocol(pipeline, texts, tmp_path):
    from qwen_onnx.cli import main

    out = tmp_path / "cli.json"
    argv = ["latency", str(pipeline["fp32"]), "--text", str(texts["evaluation"]), "--prompt-lengths", "8", "12",
            "--decode-prompt-tokens", "8", "--new-tokens", "3", "--threads", "1", "--warmup", "0", "--repeats", "1",
            "--no-profile", "--loop", "unbound", "-o", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["prompt_lengths"] == [8, 12] and result["threads"] == 1
    timing = TimingSettings(prompt_lengths=(8, 12), decode_prompt_tokens=8, new_tokens=3, threads=1, warmup=0, repeats=1)
    assert_timed(result, (8, 12), timing=timing)
    assert "profile" not in result and result["decode_loop"] == "unbound"


@pytest.mark.parametrize("scope, calls", [
    # row: one untimed decode (min(new_tokens, DECODE_WARMUP_TOKENS) = 5 tokens) first, then only timed passes
    ("row", [("generate", 5), ("prefill", 8), ("prefill", 8), ("prefill", 8), ("prefill", 32), ("prefill", 32),
             ("prefill", 32), ("generate", 5), ("generate", 5), ("generate", 5)]),
    # length: an untimed prefill before each length's timed ones, the untimed decode after the prefills
    ("length", [("prefill", 8)] * 4 + [("prefill", 32)] * 4 + [("generate", 5)] * 4),
])
def test_the_timing_protocol_computes_its_figures_from_the_measured_times(monkeypatch, scope, calls):
    """A fake clock: prefill takes 1 ms per prompt token, decode steps 10 ms, TTFTs 40 (warm-up), 70, 50, 60 ms."""
    from qwen_onnx.measure import latency

    clock = [0.0]
    monkeypatch.setattr(latency.time, "perf_counter", lambda: clock[0])
    called = []

    def prefill(ids):
        called.append(("prefill", len(ids)))
        clock[0] += 0.001 * len(ids)

    ttfts = iter([0.040, 0.070, 0.050, 0.060])

    def generate(prompt, count, steps):
        assert len(prompt) == 16
        called.append(("generate", count))
        steps.extend([0.010] * (count - 1))
        return next(ttfts)

    timing = TimingSettings(prompt_lengths=[8, 32], decode_prompt_tokens=16, new_tokens=5, warmup=1, repeats=3,
                            warmup_scope=scope)
    result = latency.timing_protocol(prefill, generate, np.arange(64), timing)
    assert called == calls
    assert result["prefill_ms_p50_8"] == pytest.approx(8.0) and result["prefill_ms_p90_32"] == pytest.approx(32.0)
    assert result["ttft_ms"] == pytest.approx(60.0) and result["ttft_ms_p90"] == pytest.approx(68.0)
    assert result["decode_tok_s"] == pytest.approx(100.0) and result["decode_ms_per_token"] == pytest.approx(10.0)


def test_a_missing_folder_is_named_before_anything_loads(texts, tmp_path):
    # without the check, the tokenizer takes the path for a hub ID and retries the network
    from qwen_onnx.errors import ArtifactError

    missing = tmp_path / "nope"
    with pytest.raises(ArtifactError, match="no ONNX model at .*nope"):
        measure_latency(missing, texts["evaluation"])
    with pytest.raises(ArtifactError, match="no Hugging Face folder at .*nope"):
        measure_torch_latency(missing, texts["evaluation"])


def test_pytorch_latency_uses_the_same_protocol(pipeline, texts):
    result = measure_torch_latency(pipeline["hf"], texts["evaluation"], SMALL)
    assert result["runtime"] == "pytorch"
    assert_timed(result, (16,), timing=SMALL)
    from transformers import AutoModelForCausalLM

    parameters = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(pipeline["hf"]).parameters())
    # every fp32 parameter except the embedding table, plus one embedding row
    assert result["weight_bytes_per_token"] == 4 * parameters - VOCAB * HIDDEN * 4 + HIDDEN * 4


def test_report_rows_ratios_roofline_and_gates(tmp_path):
    variants = ["fp32", "int8-static"]
    files, machine = fake_reports(tmp_path, variants)
    outputs = dict(markdown=tmp_path / "report.md", html_path=tmp_path / "report.html",
                   csv_path=tmp_path / "metrics.csv", json_path=tmp_path / "metrics.json",
                   plots={k: tmp_path / f"{k}.png" for k in ("ppl_vs_size", "decode_tok_s", "prefill_latency")})
    rows = build_report(["m"], variants, files, machine, prompt_lengths=(8,), **outputs)
    by_variant = {r["variant"]: r for r in rows}
    assert list(by_variant) == ["pytorch", "fp32", "int8-static"]
    assert by_variant["pytorch"]["ppl"] == 12.0 and by_variant["pytorch"]["gate"] == "reference"
    assert by_variant["fp32"]["decode_speedup_vs_pytorch"] == pytest.approx(2.0)
    assert by_variant["fp32"]["prefill_vs_pytorch"] == pytest.approx(1.0)
    # 20 GB/s over 1 GB per token: 20 tokens/s bound; fp32 decodes 20 tokens/s
    assert by_variant["fp32"]["roofline_tok_s"] == pytest.approx(20.0)
    assert by_variant["fp32"]["roofline_pct"] == pytest.approx(100.0)
    assert by_variant["int8-static"]["gate"] == "FAIL"
    with open(tmp_path / "metrics.csv", newline="") as f:
        header = next(csv.reader(f))
    assert header == list(columns((8,)))
    md = (tmp_path / "report.md").read_text()
    assert "1 variant(s) FAIL their gate: m/int8-static: ppl_delta_pct 566.7 > 2" in md
    page = (tmp_path / "report.html").read_text()
    assert "class='fail'>FAIL" in page and page.count("data:image/png;base64,") == 3
    assert np.isclose(json.loads((tmp_path / "metrics.json").read_text())[1]["decode_speedup_vs_pytorch"], 2.0)


def test_protocol_warms_decode_up_with_a_short_run_then_times_full_runs():
    from qwen_onnx.measure.latency import DECODE_WARMUP_TOKENS, timing_protocol

    calls = []

    def prefill(ids):
        calls.append(("prefill", len(ids)))

    def generate(prompt, count, steps):
        calls.append(("generate", len(prompt), count))
        steps.extend([0.01] * (count - 1))  # 100 tok/s
        return 0.05

    timing = TimingSettings(prompt_lengths=(8, 32), decode_prompt_tokens=32, new_tokens=40, warmup=2, repeats=3)
    result = timing_protocol(prefill, generate, np.arange(64), timing)
    assert DECODE_WARMUP_TOKENS == 16
    # the default scope (length): two untimed passes before each length's timed ones and before the decode
    assert calls == [("prefill", 8)] * 5 + [("prefill", 32)] * 5 + [("generate", 32, 16)] * 2 + [("generate", 32, 40)] * 3
    assert result["decode_tok_s"] == pytest.approx(100.0) and result["ttft_ms"] == pytest.approx(50.0)
    # fewer new tokens than the warm-up length: the warm-up decodes new_tokens
    calls.clear()
    short = TimingSettings(prompt_lengths=(8,), decode_prompt_tokens=8, new_tokens=4, warmup=1, repeats=1)
    timing_protocol(prefill, generate, np.arange(64), short)
    assert calls[2:] == [("generate", 8, 4), ("generate", 8, 4)]


def test_a_variant_left_out_of_the_sitting_gets_an_empty_speed_row_with_the_reason(tmp_path):
    from qwen_onnx.measure.latency_row import NOT_TIMED, untimed_latency

    variants = ["fp32", "preprocessed"]
    files, machine = fake_reports(tmp_path, variants)
    assert untimed_latency("preprocessed", output=files["latency"][1]) == {
        "variant": "preprocessed", "timed": False, "note": NOT_TIMED, "measured_in": None}
    outputs = dict(markdown=tmp_path / "report.md", html_path=tmp_path / "report.html",
                   csv_path=tmp_path / "metrics.csv", json_path=tmp_path / "metrics.json",
                   plots={k: tmp_path / f"{k}.png" for k in ("ppl_vs_size", "decode_tok_s", "prefill_latency")})
    rows = {r["variant"]: r for r in build_report(["m"], variants, files, machine, prompt_lengths=(8,), **outputs)}
    assert rows["preprocessed"]["measured_by"] == "not timed" and rows["fp32"]["measured_by"] == "latency"
    # fp16 is left out by default with its own reason: the CPU execution provider runs it on fp32's kernels
    assert untimed_latency("fp16")["note"] == (
        "not timed: onnxruntime's CPU execution provider has no float16 MatMul kernel and runs fp16 through casts "
        "and fp32's kernels, so the fp32 row gives its speed (add fp16 to variants.timed to time it)")
    from qwen_onnx.settings.variants import DEFAULT_TIMED

    assert DEFAULT_TIMED == ("fp32", "int8-dynamic", "int8-static", "int4", "optimized", "tflite")
    assert rows["preprocessed"]["decode_tok_s"] is None and rows["preprocessed"]["decode_speedup_vs_pytorch"] is None
    assert rows["preprocessed"]["gate"] == "PASS" and rows["preprocessed"]["top1_pct"] == 99.0
    assert rows["fp32"]["decode_tok_s"] == 20.0


def test_the_report_carries_task_accuracy_with_the_paired_comparison(tmp_path):
    from qwen_onnx.measure.task_accuracy import paired_comparison, summarize
    from qwen_onnx.settings.gates import DEFAULT_TASK_GATE, check_task_gate

    variants = ["fp32", "int8-static"]
    files, machine = fake_reports(tmp_path, variants)
    reports = tmp_path / "m" / "reports"
    reports.mkdir(parents=True)
    ids = [f"HumanEval/{i}" for i in range(164)]
    fp32 = summarize([{"task_id": t, "outcome": "passed" if i < 100 else "failed", "tokens": 100}
                      for i, t in enumerate(ids)])
    fp32.update(gate="reference", gate_failures=[], gate_marginal=[], seconds=300.0)
    # int8-static loses the first 6 problems fp32 passes (2 by timeout): 3.7 points, McNemar p 2 / 64
    static = summarize([{"task_id": t, "outcome": "passed" if 6 <= i < 100 else "timeout" if i < 2 else "failed",
                         "tokens": 90} for i, t in enumerate(ids)])
    paired = paired_comparison(static["records"], fp32["records"])
    status, failures, marginal = check_task_gate(-paired["pass_at_1_delta_points"], 164, paired["mcnemar_p"],
                                                 DEFAULT_TASK_GATE)
    static.update(paired=paired, gate=status, gate_failures=failures, gate_marginal=marginal, seconds=120.0)
    files["task"] = []
    for name, task in (("fp32", fp32), ("int8-static", static)):
        (reports / f"{name}.task.json").write_text(json.dumps(task))
        files["task"].append(reports / f"{name}.task.json")
    outputs = dict(markdown=tmp_path / "report.md", html_path=tmp_path / "report.html",
                   csv_path=tmp_path / "metrics.csv", json_path=tmp_path / "metrics.json",
                   plots={k: tmp_path / f"{k}.png" for k in ("ppl_vs_size", "decode_tok_s", "prefill_latency")})
    rows = {r["variant"]: r for r in build_report(["m"], variants, files, machine, prompt_lengths=(8,), **outputs)}
    assert (rows["fp32"]["pass_at_1_pct"], rows["fp32"]["task_gate"], rows["fp32"]["task_lost"]) == (
        pytest.approx(100 * 100 / 164), "reference", None)
    static_row = rows["int8-static"]
    assert (static_row["pass_at_1_pct"], static_row["task_gained"], static_row["task_lost"]) == (
        pytest.approx(100 * 94 / 164), 0, 6)
    assert (static_row["task_mcnemar_p"], static_row["task_gate"], static_row["task_tokens"]) == (0.03125, "FAIL", 14760)
    assert static_row["task_gate_note"] == "pass_at_1_drop_points 3.66 > 3 (McNemar p 0.031 <= 0.05)"
    assert rows["pytorch"]["pass_at_1_pct"] is None
    md = (tmp_path / "report.md").read_text()
    assert "## Task accuracy (HumanEval pass@1)" in md and "pass@1 on all 164 HumanEval problems" in md
    assert "| m | int8-static | 164 | 57.32 | 49.66 | 64.63 | 0 | 6 | 0.0312 | FAIL |" in md
    assert ("1 FAIL the task gate (HumanEval pass@1 against fp32): m/int8-static: pass_at_1_drop_points 3.66 > 3 "
            "(McNemar p 0.031 <= 0.05)") in md
    with open(tmp_path / "metrics.csv", newline="") as f:
        by_variant = {r["variant"]: r for r in csv.DictReader(f)}
    assert by_variant["int8-static"]["pass_at_1_low_pct"].startswith("49.6")
