"""Against peers: skip notes, the GGUF of a source, a real interleaved run on the tiny Qwen2
(PyTorch, our fp32, llama.cpp on a float32 GGUF of it, onnxruntime-genai's builder INT4 graph),
and the report's "Against peers" section and metrics rows."""

import csv
import dataclasses
import importlib.util
import json
import statistics
import subprocess

import pytest

from qwen_onnx.convert.genai_builder import build_genai_int4
from qwen_onnx.measure import peers, peers_table
from qwen_onnx.measure.peers import run_peers
from qwen_onnx.measure.peers_table import GENAI, GENAI_ORT, LLAMA_CPP
from qwen_onnx.settings.timing import TimingSettings
from qwen_onnx.source.resolve import source_gguf

SMALL = TimingSettings(prompt_lengths=(8, 16), decode_prompt_tokens=8, new_tokens=5, threads=1, warmup=1, repeats=1,
                       load_watch_s=0.1)


def rounds(n):
    """:data:`SMALL` in ``n`` interleaved rounds."""
    return dataclasses.replace(SMALL, rounds=n)
HAVE_LLAMA = importlib.util.find_spec("llama_cpp") is not None


def _by_peer(result):
    return {r["peer"]: r for r in result["rows"]}


def test_missing_packages_skip_their_rows_with_the_install_command(pipeline, texts, tmp_path, monkeypatch):
    monkeypatch.setattr(peers, "_installed", lambda module: False)
    result = run_peers(pipeline["hf"], [], texts["evaluation"], rounds(3), pytorch=False, output=tmp_path / "p.json",
                       markdown=tmp_path / "p.md")
    rows = _by_peer(result)
    assert list(rows) == [LLAMA_CPP, GENAI, GENAI_ORT]
    assert rows[LLAMA_CPP]["skipped"] == "llama-cpp-python not installed: envs/setup.sh --peers"
    assert rows[GENAI]["skipped"] == rows[GENAI_ORT]["skipped"] == "onnxruntime-genai not installed: envs/setup.sh --peers"
    assert result["reference"] is None and "decode_tok_s" not in rows[GENAI]
    saved = json.loads((tmp_path / "p.json").read_text())
    assert saved["rows"][0]["skipped"] == "llama-cpp-python not installed: envs/setup.sh --peers"
    md = (tmp_path / "p.md").read_text()
    assert "no ratios" in md and "| llama.cpp | llama-cpp-python | – |" in md


def test_a_source_without_gguf_skips_llama_cpp(pipeline, texts, tmp_path, monkeypatch, tiny_qwen2):
    monkeypatch.setattr(peers, "_installed", lambda module: module == "llama_cpp")
    result = run_peers(pipeline["hf"], [], texts["evaluation"], SMALL, pytorch=False, genai_builder=False,
                       genai_builder_ort=False)
    (row,) = result["rows"]
    # the resolved folder's source.json names the tiny checkpoint's folder
    assert row["skipped"] == (f"no GGUF: the source {tiny_qwen2.resolve()} is a Hugging Face folder; llama.cpp "
                              "needs a .gguf source or GGUF parts")


def test_a_llama_cpp_build_for_another_cpu_is_skipped_with_the_reason(pipeline, texts, tmp_path, monkeypatch):
    from tiny_gguf import write_tiny_gguf

    monkeypatch.setattr(peers, "_installed", lambda module: module == "llama_cpp")
    monkeypatch.setattr(peers, "isa_name", lambda: "AVX2")
    monkeypatch.setattr(peers, "llama_cpp_config", lambda: {
        "version": "0.3.36", "system_info": "CPU : AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 |",
        "missing_cpu_features": ["AVX512", "AVX512_VNNI"], "setup_cmake_args": "-DGGML_AVX512=ON"})
    gguf = write_tiny_gguf(pipeline["hf"], tmp_path / "tiny.gguf")
    result = run_peers(pipeline["hf"], [], texts["evaluation"], SMALL, source=str(gguf), pytorch=False,
                       genai_builder=False, genai_builder_ort=False, output=tmp_path / "p.json", markdown=tmp_path / "p.md")
    (row,) = result["rows"]
    assert row["skipped"] == ("llama-cpp-python was built for AVX512, AVX512_VNNI, which this CPU (AVX2) lacks (it "
                              "would die with SIGILL): rebuild it with envs/setup.sh --peers")
    assert "would die with SIGILL" in (tmp_path / "p.md").read_text()


def test_source_gguf_kinds(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert source_gguf(str(gguf), tmp_path) == (gguf.resolve(), None)
    path, note = source_gguf(str(tmp_path / "gone.gguf"), tmp_path)
    assert path is None and note.startswith("no GGUF: GGUF file") and "does not exist" in note
    parts = {"packages": ["qo-absent-part1"], "bytes": 4, "sha256": "0" * 64, "name": "absent"}
    path, note = source_gguf(parts, tmp_path)
    assert path is None and "'qo-absent-part1' is not installed" in note and "pip install qo-absent-part1" in note
    assert source_gguf("Qwen/Qwen2.5-0.5B", tmp_path)[1].endswith("is a hub ID; llama.cpp needs a .gguf source or GGUF parts")


@pytest.fixture(scope="module")
def peers_run(pipeline, texts, tmp_path_factory):
    """One real run: PyTorch, our fp32, llama.cpp (when importable) on a float32 GGUF of the tiny
    Qwen2, and the genai builder's INT4 graph by onnxruntime-genai and by our runtime."""
    from tiny_gguf import write_tiny_gguf

    work = tmp_path_factory.mktemp("peers")
    gguf = write_tiny_gguf(pipeline["hf"], work / "tiny-qwen2-f32.gguf")
    result = run_peers(pipeline["hf"], [pipeline["fp32"]], texts["evaluation"], rounds(3), source=str(gguf),
                       work_dir=work, output=work / "peers.json", markdown=work / "peers.md")
    return result, work, gguf


def test_every_peer_is_measured_with_positive_figures(peers_run):
    result, work, gguf = peers_run
    rows = _by_peer(result)
    expected = ["pytorch", "fp32", LLAMA_CPP, GENAI, GENAI_ORT]
    assert list(rows) == expected
    measured = expected if HAVE_LLAMA else [p for p in expected if p != LLAMA_CPP]
    for name in measured:
        row = rows[name]
        assert row["skipped"] is None, (name, row["skipped"])
        assert row["rounds"] == 3 and len(row["rounds_decode_tok_s"]) == 3
        idle = [v for r, v in enumerate(row["rounds_decode_tok_s"], 1) if r not in row["rounds_busy"]]
        assert row["decode_tok_s"] == pytest.approx(statistics.median(idle or row["rounds_decode_tok_s"]))
        assert [load["round"] for load in row["rounds_load"]] == [1, 2, 3]
        # each measuring process's wall time, summed into what the row cost the sitting
        assert all(load["seconds"] > 0 for load in row["rounds_load"])
        assert row["sitting_s"] == pytest.approx(sum(load["seconds"] for load in row["rounds_load"]), abs=0.1)
        assert row["load_note"] == "idle" if not row["rounds_busy"] else row["load_note"].startswith(("median of", "BUSY"))
        for figure in ("decode_tok_s", "prefill_ms_8", "prefill_ms_16", "ttft_ms", "load_s"):
            assert row[figure] > 0, (name, figure)
        assert 50 < row["peak_rss_mib"] < 4000 and row["bytes_on_disk"] > 10_000
    assert rows[GENAI]["bytes_on_disk"] == rows[GENAI_ORT]["bytes_on_disk"]
    assert (work / GENAI / "model.onnx").is_file() and (work / GENAI / "genai_config.json").is_file()
    if HAVE_LLAMA:
        assert rows[LLAMA_CPP]["bytes_on_disk"] == gguf.stat().st_size
        assert rows[LLAMA_CPP]["config"]["n_threads"] == 1 and "AVX" in rows[LLAMA_CPP]["config"]["system_info"]
        assert rows[LLAMA_CPP]["config"]["missing_cpu_features"] == []
        assert result["isa"] and result["int8_kernel"]
    else:
        assert rows[LLAMA_CPP]["skipped"] == "llama-cpp-python not installed: envs/setup.sh --peers"


def test_ratios_divide_by_the_fastest_peer(peers_run):
    result, work, _ = peers_run
    rows = _by_peer(result)
    candidates = [rows[p] for p in (LLAMA_CPP, GENAI) if rows[p]["skipped"] is None]
    fastest = max(candidates, key=lambda r: r["decode_tok_s"])
    assert result["reference"] == fastest["peer"]
    figures = ("decode_tok_s", "prefill_ms_8", "prefill_ms_16", "ttft_ms", "peak_rss_mib", "bytes_on_disk")
    for row in rows.values():
        if row["skipped"] is None:
            for figure in figures:
                assert row[f"{figure}_vs_peer"] == pytest.approx(row[figure] / fastest[figure])
    assert all(fastest[f"{figure}_vs_peer"] == 1.0 for figure in figures)
    assert json.loads((work / "peers.json").read_text())["reference"] == fastest["peer"]
    md = (work / "peers.md").read_text()
    assert f"divide by {fastest['peer']}, the fastest peer" in md and "| fp32 |" in md
    # the machine's copy bandwidth at both ends of the sitting (one thread, as the rows ran)
    bandwidth = result["memory_bandwidth_gb_s"]
    assert bandwidth["threads"] == 1 and 0.5 < bandwidth["before"] < 500 and 0.5 < bandwidth["after"] < 500
    assert (f"Memory bandwidth (1 thread, STREAM Copy): {bandwidth['before']} GB/s before the rounds, "
            f"{bandwidth['after']} GB/s after them.") in md


def test_builder_graph_is_cached_and_rebuilt_when_the_weights_change(peers_run, pipeline):
    _, work, _ = peers_run
    graph = work / GENAI / "model.onnx"
    before = graph.stat().st_mtime_ns
    record = build_genai_int4(pipeline["hf"], work / GENAI)
    assert graph.stat().st_mtime_ns == before
    assert record["command"][-6:] == ["-p", "int4", "-e", "cpu", "--extra_options", "hf_token=false"]
    stamp = json.loads((work / GENAI / "builder.json").read_text())
    stamp["hf"][0]["mtime"] -= 1  # as if the resolved weights had been rewritten
    (work / GENAI / "builder.json").write_text(json.dumps(stamp))
    build_genai_int4(pipeline["hf"], work / GENAI)
    assert json.loads((work / GENAI / "builder.json").read_text())["hf"] != stamp["hf"]


def test_a_failed_build_is_recorded_and_its_row_skipped(pipeline, texts, tmp_path, monkeypatch):
    """The genai_builder rule keeps a failure (keep_failure) so its job completes; the sitting then
    skips both builder rows with the builder's message and does not build again."""
    hf = tmp_path / "hf"
    hf.mkdir()
    for path in pipeline["hf"].iterdir():
        (hf / path.name).symlink_to(path.resolve())
    config = json.loads((pipeline["hf"] / "config.json").read_text())
    (hf / "config.json").unlink()
    (hf / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchForCausalLM"]}))
    record = build_genai_int4(hf, tmp_path / "work" / GENAI, keep_failure=True)
    assert record["error"].startswith(f"onnxruntime-genai's builder failed on {hf} (status 1): ")
    assert record["error"].endswith(f"NotImplementedError: The {hf} model is not currently supported.")
    assert sorted(p.name for p in (tmp_path / "work" / GENAI).iterdir()) == ["builder.json", "builder.log", "manifest.json"]

    def no_second_build(*args, **kwargs):
        raise AssertionError("the recorded failure was built again")

    monkeypatch.setattr(subprocess, "run", no_second_build)
    with pytest.raises(peers.QwenOnnxError) as caught:
        build_genai_int4(hf, tmp_path / "work" / GENAI)
    assert str(caught.value) == record["error"]
    monkeypatch.setattr(peers, "_installed", lambda module: module == "onnxruntime_genai")
    result = run_peers(hf, [], texts["evaluation"], rounds(1), pytorch=False, work_dir=tmp_path / "work")
    rows = _by_peer(result)
    assert rows[GENAI]["skipped"] == rows[GENAI_ORT]["skipped"] == peers_table.one_line(f"builder failed: {record['error']}")


def test_report_has_the_peers_section_and_metrics_rows(peers_run, tmp_path):
    from fake_reports import fake_reports

    from qwen_onnx.report.build import build_report
    from qwen_onnx.report.tables import columns

    result, work, _ = peers_run
    variants = ["fp32", "int8-static"]
    files, machine = fake_reports(tmp_path, variants)
    files["peers"] = [work / "peers.json"]
    outputs = dict(markdown=tmp_path / "report.md", html_path=tmp_path / "report.html",
                   csv_path=tmp_path / "metrics.csv", json_path=tmp_path / "metrics.json",
                   plots={k: tmp_path / f"{k}.png" for k in ("ppl_vs_size", "decode_tok_s", "prefill_latency")})
    build_report(["m"], variants, files, machine, prompt_lengths=(8,), **outputs)
    with open(tmp_path / "metrics.csv", newline="") as f:
        every = list(csv.DictReader(f))
    assert list(every[0]) == list(columns((8,)))
    measured = [p for p in (LLAMA_CPP, GENAI, GENAI_ORT) if _by_peer(result)[p]["skipped"] is None]
    peer_rows = {r["variant"]: r for r in every if r["measured_by"] == "peers"}
    assert list(peer_rows) == measured
    assert {r["measured_by"] for r in every[:3]} == {"latency"}
    rows = _by_peer(result)
    genai = peer_rows[GENAI]
    assert float(genai["decode_tok_s"]) == pytest.approx(rows[GENAI]["decode_tok_s"])
    assert float(genai["prefill_ms_p50_8"]) == pytest.approx(rows[GENAI]["prefill_ms_8"])
    # against the pytorch row of the same peers run, not the latency stage's
    assert float(genai["decode_speedup_vs_pytorch"]) == pytest.approx(
        rows[GENAI]["decode_tok_s"] / rows["pytorch"]["decode_tok_s"])
    assert genai["provider"] == "onnxruntime-genai CPU" and genai["gate"] == ""
    md = (tmp_path / "report.md").read_text()
    assert "## Against peers: m" in md and f"| m | {GENAI} | onnxruntime-genai (og.Generator) |" in md
    assert "<h2>Against peers: m</h2>" in (tmp_path / "report.html").read_text()


def test_peers_command_line(pipeline, texts, tmp_path, capsys, monkeypatch):
    from qwen_onnx.cli import main

    monkeypatch.setattr(peers, "_installed", lambda module: False)
    argv = ["peers", str(pipeline["hf"]), "--text", str(texts["evaluation"]), "--no-pytorch", "--rounds", "1",
            "--prompt-lengths", "8", "--prompt-tokens", "8", "--new-tokens", "3", "-o", str(tmp_path / "p.json")]
    assert main(argv) == 0
    assert "llama-cpp-python not installed: envs/setup.sh --peers" in capsys.readouterr().out
    assert json.loads((tmp_path / "p.json").read_text())["prompt_lengths"] == [8]
    assert main(["peers", str(tmp_path / "nope")]) == 2
    assert "no Hugging Face folder at" in capsys.readouterr().err


def test_latency_reports_take_their_figures_from_the_sitting(peers_run, pipeline, texts, tmp_path):
    """A variant's latency report is its row of the sitting plus its profile; PyTorch's has no profile."""
    from qwen_onnx.errors import ArtifactError
    from qwen_onnx.measure.latency import percentile
    from qwen_onnx.measure.latency_row import latency_from_sitting
    from qwen_onnx.measure.profile import profile_variant

    result, work, _ = peers_run
    rows = _by_peer(result)
    profile = profile_variant(pipeline["fp32"], texts["evaluation"], TimingSettings(decode_prompt_tokens=8, threads=1),
                              output=tmp_path / "fp32.profile.json")
    assert profile["weight_bytes_per_token"] > 10_000 and profile["profile"]["decode_steps"] == 16
    assert {"MatMul", "Gather"} & {op["op_type"] for op in profile["profile"]["ops"]}
    fp32 = latency_from_sitting("fp32", work / "peers.json", profile=tmp_path / "fp32.profile.json",
                                output=tmp_path / "fp32.latency.json")
    row = rows["fp32"]
    assert fp32["decode_tok_s"] == row["decode_tok_s"] and fp32["rounds"] == 3 and fp32["measured_in"] == "peers.json"
    rounds_16 = [f["prefill_ms_16"] for f in row["per_round"]]
    # the median is over the rounds measured with the machine otherwise idle (every round when all were busy)
    idle_16 = [v for r, v in enumerate(rounds_16, 1) if r not in row["rounds_busy"]] or rounds_16
    assert fp32["prefill_ms_p50_16"] == pytest.approx(statistics.median(idle_16))
    assert fp32["prefill_ms_p90_16"] == pytest.approx(percentile(rounds_16, 90))
    assert fp32["prefill_ms_p90_16"] >= fp32["prefill_ms_p50_16"]
    assert fp32["profile"] == profile["profile"] and fp32["weight_bytes_per_token"] == profile["weight_bytes_per_token"]
    assert fp32["decode_ms_per_token"] == pytest.approx(1000.0 / row["decode_tok_s"])
    torch = latency_from_sitting("pytorch", result)
    assert torch["runtime"] == "pytorch" and "profile" not in torch and torch["load_s"] == rows["pytorch"]["load_s"]
    assert torch["weight_bytes_per_token"] == rows["pytorch"]["weight_bytes_per_token"] > 10_000
    with pytest.raises(ArtifactError, match=r"has no row 'int4' \(rows: pytorch, fp32, llama.cpp, "):
        latency_from_sitting("int4", work / "peers.json")


HAVE_OPENVINO = importlib.util.find_spec("openvino") is not None


@pytest.mark.skipif(not HAVE_OPENVINO, reason="openvino is not installed (envs/setup.sh installs it)")
def test_openvino_rows_are_timed_beside_the_same_variant(pipeline, texts, tmp_path):
    """int4 by onnxruntime and by OpenVINO in the same interleaved rounds: timed figures (no speed threshold), what
    OpenVINO read back in the row's config, and the row in metrics.csv with its provider."""
    from timing_checks import assert_timed

    from qwen_onnx.report.peer_rows import peer_metric_rows

    result = run_peers(pipeline["hf"], [pipeline["int4"]], texts["evaluation"], rounds(2), pytorch=False,
                       llama_cpp=False, genai_builder=False, genai_builder_ort=False, openvino_dirs=[pipeline["int4"]],
                       output=tmp_path / "peers.json", markdown=tmp_path / "peers.md")
    rows = _by_peer(result)
    assert list(rows) == ["int4", "int4-openvino"]
    row = rows["int4-openvino"]
    assert row["skipped"] is None and row["rounds"] == 2 and len(row["rounds_decode_tok_s"]) == 2
    assert_timed(row, SMALL.prompt_lengths)
    assert row["decode_tok_s"] > 0 and row["load_s"] > 0 and row["bytes_on_disk"] == rows["int4"]["bytes_on_disk"]
    assert row["runtime"] == "OpenVINO CPU, f32 (qwen-onnx OpenVinoCausalLM)" and row["path"] == str(pipeline["int4"])
    config = row["config"]
    assert config["compiled"]["INFERENCE_PRECISION_HINT"] == "f32" and config["compiled"]["INFERENCE_NUM_THREADS"] == 1
    assert config["openvino"].startswith("2026.") and "u4" in config["layers_by_precision"]
    assert result["library_versions"]["openvino"]
    assert "| int4-openvino | OpenVINO CPU, f32" in (tmp_path / "peers.md").read_text()
    (metrics,) = peer_metric_rows(["m"], [tmp_path / "peers.json"], SMALL.prompt_lengths)
    assert (metrics["variant"], metrics["measured_by"]) == ("int4-openvino", "peers")
    assert metrics["provider"] == "OpenVINO CPU plugin (f32 hint)"
    assert metrics["decode_tok_s"] == row["decode_tok_s"]


def test_openvino_rows_say_why_they_were_not_timed(pipeline, texts, tmp_path, monkeypatch):
    """Without openvino the rows say how to install it; a graph OpenVINO does not compile is skipped with
    OpenVINO's first line, before any round."""
    from tiny_models import write_unknown_op_graph

    monkeypatch.setattr(peers, "_installed", lambda module: False)
    result = run_peers(pipeline["hf"], [], texts["evaluation"], rounds(1), pytorch=False,
                       openvino_dirs=[pipeline["int4"]])
    assert _by_peer(result)["int4-openvino"]["skipped"] == ("openvino not installed: envs/setup.sh installs it "
                                                            "(envs/requirements.txt)")
    if not HAVE_OPENVINO:
        return
    monkeypatch.setattr(peers, "_installed", lambda module: module == "openvino")
    write_unknown_op_graph(tmp_path / "odd")
    result = run_peers(pipeline["hf"], [], texts["evaluation"], rounds(1), pytorch=False,
                       openvino_dirs=[tmp_path / "odd"])
    row = _by_peer(result)["odd-openvino"]
    assert row["skipped"].startswith("OpenVINO 2026.")
    assert f"did not compile {tmp_path / 'odd' / 'model.onnx'}: " in row["skipped"] and "\n" not in row["skipped"]
