"""qwen-onnx publish: the README's measured tables and the measurement page come from a run's files."""

from __future__ import annotations

import json

import pytest

from qwen_onnx.cli import main
from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.report.publish import BEGIN, END, publish

MACHINE = {"cpu_model": "AMD EPYC", "isa": "AVX2", "logical_cores": 2, "memory_gib": 23.5}
ROWS = [
    {"model": "m", "variant": "pytorch", "gate": "reference", "ppl_delta_pct": 0.0, "kl_mean": 0.0, "top1_pct": 100.0,
     "bytes_on_disk": 2520702368, "decode_tok_s": 6.359, "ttft_ms": 1353.6, "timing_load": "idle"},
    {"model": "m", "variant": "int4", "gate": "PASS", "ppl_delta_pct": 0.7412, "kl_mean": 0.020123, "top1_pct": 91.83,
     "task_problems": 16, "pass_at_1_pct": 43.75, "bytes_on_disk": 532200000, "decode_tok_s": 32.68, "ttft_ms": 1212.4, "timing_load": "idle"},
    {"model": "m", "variant": "llama.cpp", "gate": None, "ppl_delta_pct": None, "kl_mean": None, "top1_pct": None,
     "bytes_on_disk": 491000000, "decode_tok_s": 37.1, "ttft_ms": 800.0, "timing_load": "idle"},
]


@pytest.fixture
def run(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "metrics.json").write_text(json.dumps(ROWS))
    (results / "machine.json").write_text(json.dumps(MACHINE))
    (results / "report.md").write_text("# qwen-onnx report\n\n## Which variant to ship\n\nint4\n")
    return results


def test_publish_writes_the_readme_block_and_the_page_from_the_run(run, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n{BEGIN}\nstale figures\n{END}\nafter\n")
    done = publish(run, readme=readme, page=tmp_path / "docs" / "measurements" / "p.md", commit="abc1234")
    text = readme.read_text()
    assert text.startswith("# x\n\nbefore\n" + BEGIN + "\n") and text.endswith(END + "\nafter\n")
    assert "stale figures" not in text
    assert f"**m**: measured {done['date']} at commit abc1234 on AMD EPYC, AVX2 (2 cores, 23.5 GiB)" in text
    assert "[docs/measurements/p.md](docs/measurements/p.md)" in text
    assert "pass@1: HumanEval, 16 problems, greedy" in text
    assert "| int4 | PASS | +0.74 | 0.0201 | 91.8 | 43.8 | 532 | 32.7 | 1212 | idle |" in text
    assert "| pytorch | reference | +0.00 | 0 | 100.0 | – | 2521 | 6.4 | 1354 | idle |" in text
    assert "| llama.cpp | peer | – | – | – | – | 491 | 37.1 | 800 | idle |" in text
    page = (tmp_path / "docs" / "measurements" / "p.md").read_text()
    assert page.startswith(f"# Measured {done['date']} on AMD EPYC, AVX2 (2 cores, 23.5 GiB)\n")
    assert "at commit abc1234" in page and page.endswith("## Which variant to ship\n\nint4\n")


def test_publish_refuses_a_readme_without_the_block_and_an_unfinished_run(run, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# x\n")
    with pytest.raises(QwenOnnxError, match="README.md has no '<!-- measured:begin"):
        publish(run, readme=readme, page=tmp_path / "p.md", commit="abc1234")
    (run / "report.md").unlink()
    assert main(["publish", str(run), "--page", str(tmp_path / "q.md"), "--commit", "abc1234"]) == 2
    assert not (tmp_path / "q.md").exists()


def test_publish_writes_the_index_block_too_and_checks_every_block_before_writing(run, tmp_path):
    readme, index = tmp_path / "README.md", tmp_path / "docs" / "measurements.md"
    index.parent.mkdir()
    readme.write_text(f"{BEGIN}\n{END}\n")
    index.write_text("# Measurements\n")  # no block: nothing may be written
    with pytest.raises(QwenOnnxError, match="measurements.md has no '<!-- measured:begin"):
        publish(run, readme=readme, index=index, page=tmp_path / "docs" / "measurements" / "p.md", commit="abc1234")
    assert readme.read_text() == f"{BEGIN}\n{END}\n" and not (tmp_path / "docs" / "measurements" / "p.md").exists()
    index.write_text(f"# Measurements\n\n## Latest run\n{BEGIN}\n{END}\n")
    publish(run, readme=readme, index=index, page=tmp_path / "docs" / "measurements" / "p.md", commit="abc1234")
    assert "[measurements/p.md](measurements/p.md)" in index.read_text()
    assert "[docs/measurements/p.md](docs/measurements/p.md)" in readme.read_text()
    assert "| int4 | PASS | +0.74 | 0.0201 | 91.8 | 43.8 | 532 | 32.7 | 1212 | idle |" in index.read_text()


def test_the_readme_and_the_index_have_the_block():
    from pathlib import Path

    for document in ("README.md", "docs/measurements.md"):
        text = (Path(__file__).resolve().parents[2] / document).read_text()
        assert text.count(BEGIN) == 1 and text.index(BEGIN) < text.index(END), document


def test_a_run_of_one_model_keeps_the_other_models_tables_with_their_provenance(run, tmp_path):
    """The block of the older form (one provenance line for all models): the kept model's table gets that line."""
    readme = tmp_path / "README.md"
    old = (f"{BEGIN}\nMeasured 2026-12-01 at commit 0ld0000 on Xeon, AVX-512 (2 cores, 23.5 GiB) by the main command; "
           "the whole report: [docs/measurements/old.md](docs/measurements/old.md). Timing: `idle` when ...\n\n"
           "**big**\n\n| variant |\n|---|\n| int4 |\n\n**m**\n\n| variant |\n|---|\n| stale |\n"
           f"{END}\n")
    readme.write_text(old)
    done = publish(run, readme=readme, page=tmp_path / "docs" / "measurements" / "p.md", commit="abc1234")
    block = readme.read_text().split(BEGIN)[1].split(END)[0]
    assert "| stale |" not in block and block.count("Timing: `idle`") == 1
    big, m = block.index("**big**: measured 2026-12-01 at commit 0ld0000 on Xeon"), block.index("**m**: measured")
    assert big < m  # each model keeps its place
    assert "[docs/measurements/old.md](docs/measurements/old.md).\n\n| variant |\n|---|\n| int4 |" in block
    assert f"**m**: measured {done['date']} at commit abc1234" in block
    # a second run of m keeps big's section as it now is
    publish(run, readme=readme, page=tmp_path / "docs" / "measurements" / "p2.md", commit="def5678")
    block = readme.read_text().split(BEGIN)[1].split(END)[0]
    assert block.count("**big**: measured 2026-12-01 at commit 0ld0000") == 1 and "commit def5678" in block
    assert "abc1234" not in block


def test_the_provenance_line_gives_the_runs_time_from_its_jobs(run, tmp_path):
    """The run's span (first start to last end, from the benchmarks and the logs' times) and core bound
    (the measuring jobs' wall time plus the others' CPU time over the cores) stand in each model's line."""
    import os

    header = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    day = 86_400 * 20_000  # the epoch's 20,000th day: 2024-10-04 00:00 UTC
    # the main run, then a day later the `task` target's HumanEval jobs (which rewrote report.md)
    for job, wall, cpu, ended in (("resolve", 60.0, 50, day + 1060), ("export", 120.0, 200, day + 1180),
                                  ("sitting", 600.0, 300, day + 1780), ("task_accuracy.fp32", 900.0, 1700, day + 86_400),
                                  ("task_accuracy.int4", 300.0, 590, day + 86_710)):
        (run / "benchmarks" / "m").mkdir(parents=True, exist_ok=True)
        (run / "benchmarks" / "m" / f"{job}.tsv").write_text(header + f"{wall}\t0:01:00\t100\t1\t1\t1\t1\t1\t50\t{cpu}\n")
        log = run / "logs" / "m" / f"{job}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("done\n")
        os.utime(log, (ended, ended))
    (run / "machine.json").write_text(json.dumps({**MACHINE, "affinity_cores": 2}))
    readme = tmp_path / "README.md"
    readme.write_text(f"{BEGIN}\n{END}\n")
    publish(run, readme=readme, page=tmp_path / "p.md", commit="abc1234")
    # span 1000 -> 1780 s = 13.0 min; core bound 600 + (50 + 200) / 2 = 725 s = 12.1 min; the task jobs: 2 in
    # 1,210 s = 20.2 min; the date is the main run's, not the report's rewrite
    assert ("**m**: measured 2024-10-04 at commit abc1234 on AMD EPYC, AVX2 (2 cores, 23.5 GiB) by the main command "
            "in 13.0 min (its last run: 3 jobs, setup excluded; core bound 12.1 min on 2 cores); its `task` target "
            "(HumanEval) 2024-10-05: 2 jobs in 20.2 min; the whole report:") in readme.read_text()
