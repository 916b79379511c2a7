"""Shared fixtures: tiny random Qwen checkpoints and the pipeline stages run once on them."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny_models import FAMILY_TIMED, build_tiny_qwen  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

# pytest-xdist runs the tests in one worker per core and one more (pyproject.toml's addopts: -n auto, and
# pytest_xdist_auto_num_workers below): libgomp's spinning idle threads (PyTorch's default OMP_WAIT_POLICY) would take
# the cores the other workers need. Read when torch loads, so set before anything imports it; the workflow's jobs
# inherit it (a value set by the user wins).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Never reach for the network in tests: hub look-ups must come from the (empty) cache.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# verify_manifest's stamps (qwen_onnx.store.manifest.verified_cache_dir) go to a folder of this run, not ~/.cache
if "QWEN_ONNX_VERIFIED_CACHE" not in os.environ:
    import tempfile

    os.environ["QWEN_ONNX_VERIFIED_CACHE"] = tempfile.mkdtemp(prefix="qwen-onnx-verified-")


def _words_text(seed: int, words: int = 4000) -> str:
    vocab = (
        "def class return import the model data token cache value for in range print self "
        "量化 模型 数据 延迟 困惑度 export onnx runtime layer attention key value decode prefill"
    ).split()
    rng = random.Random(seed)
    lines = []
    for _ in range(words // 12):
        lines.append(" ".join(rng.choice(vocab) for _ in range(12)))
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def texts(tmp_path_factory) -> dict[str, Path]:
    """Small calibration and evaluation texts (different seeds) for the tiny tokenizer."""
    folder = tmp_path_factory.mktemp("texts")
    calibration = folder / "calibration.txt"
    evaluation = folder / "evaluation.txt"
    calibration.write_text(_words_text(1), encoding="utf-8")
    evaluation.write_text(_words_text(2), encoding="utf-8")
    return {"calibration": calibration, "evaluation": evaluation}


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory) -> Path:
    """A tiny random Qwen2 checkpoint (2 layers, 4 heads, 2 KV heads, hidden 64)."""
    return build_tiny_qwen(tmp_path_factory.mktemp("tiny-qwen2") / "model", "qwen2")


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory, tiny_qwen2, texts) -> dict[str, Path]:
    """The stages run once on the tiny Qwen2: hf, fp32, preprocessed, int8-dynamic, int8-static, optimized, int4, fp16."""
    from qwen_onnx.convert.export import export_onnx, preprocess
    from qwen_onnx.convert.float16 import convert_float16_variant
    from qwen_onnx.convert.optimize import optimize_variant
    from qwen_onnx.quantize.int4 import Int4Settings, quantize_int4_variant
    from qwen_onnx.quantize.int8 import (
        DynamicSettings,
        StaticSettings,
        quantize_dynamic_variant,
        quantize_static_variant,
    )
    from qwen_onnx.source.resolve import resolve

    root = tmp_path_factory.mktemp("pipeline")
    dirs = {name: root / name for name in ("hf", "fp32", "preprocessed", "int8-dynamic", "int8-static", "optimized", "int4",
                                              "fp16")}
    resolve(str(tiny_qwen2), dirs["hf"])
    export_onnx(dirs["hf"], dirs["fp32"], opset=17)
    preprocess(dirs["fp32"], dirs["preprocessed"])
    # onnxruntime's own quantize_dynamic here; the default blockwise scheme is tested in test_sensitivity
    # and runs in the workflow test
    quantize_dynamic_variant(dirs["preprocessed"], dirs["int8-dynamic"], DynamicSettings(scheme="per_tensor"))
    quantize_static_variant(
        dirs["preprocessed"], dirs["int8-static"], texts["calibration"], StaticSettings(samples=4, sequence_length=32)
    )
    optimize_variant(dirs["hf"], dirs["optimized"])
    # int4 from the fused graph, as the workflow builds it (round-to-nearest: fast on the tiny model)
    quantize_int4_variant(dirs["optimized"], dirs["int4"], Int4Settings(algorithm="rtn", block_size=16, block_size_8bit=16, embedding_block_size=16))
    convert_float16_variant(dirs["fp32"], dirs["fp16"])
    return dirs


@pytest.fixture(scope="session")
def families(tmp_path_factory):
    """Tiny Qwen1.5-style (as many KV heads as heads) and Qwen3 (q/k RMSNorm) checkpoints, as `models:` entries
    (:data:`FAMILY_TIMED` timed, no peers)."""
    root = tmp_path_factory.mktemp("families")
    measured = {"variants": {"timed": list(FAMILY_TIMED)}, "peers": {"enabled": False}}
    return {
        "tiny-qwen1.5": {"source": str(build_tiny_qwen(root / "qwen1.5", "qwen1.5")), "params_billion": 0.001,
                         **measured},
        "tiny-qwen3": {"source": str(build_tiny_qwen(root / "qwen3", "qwen3")), "params_billion": 0.001, **measured,
                       "quantize_static": {"sensitive": {"max_nodes": 2, "scheme": "blockwise"}, "block_size": 16}},
    }


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory, tiny_qwen2, texts, families):
    """The whole workflow run once on the tiny Qwen2, Qwen1.5 and Qwen3, then its `task` target (test_workflow.py reads it,
    test_faults.py kills stages in a copy of it)."""
    from test_workflow import UNEXCLUSIVE, snakemake, write_config

    folder = tmp_path_factory.mktemp("workflow")
    write_config(folder, str(tiny_qwen2), texts, extra_models=families)
    # --cores 4 on 2 cores, as the README's main command: two 2-thread jobs overlap (with --cores 2 every job but
    # inspect, diff and the latency rows would run alone); and the measuring jobs, which claim every core Snakemake
    # is given (test_the_measuring_jobs_claim_every_core), on their one measured thread: they run beside the others
    # (no figure of this run is compared with another), not alone one after the other
    result = snakemake(folder, *UNEXCLUSIVE, cores=4)
    assert result.returncode == 0, result.stderr[-4000:]
    # the default run scores no HumanEval; its report says how to (test_workflow.py reads the `task` run's)
    assert not list(folder.glob("results/*/reports/*.task.json"))
    assert "HumanEval pass@1 not measured in this run: `snakemake --cores 4 task` scores all 164 problems" in (
        folder / "results" / "report.md").read_text()
    result = snakemake(folder, "task", *UNEXCLUSIVE, cores=4)
    assert result.returncode == 0, result.stderr[-4000:]
    return folder


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one pytest-xdist worker per core this process may run on, and one more. A worker often waits
    (on a subprocess's start, a Snakemake job's end, a file): on 2 cores, two workers kept the cores busy 85% of a
    run, and a third fills those waits."""
    return len(os.sched_getaffinity(0)) + 1


#: The group of the tests that read the finished workflow run (or a copy of it): one worker builds it, and starts
#: with it, the longest piece of work of the suite.
FINISHED_RUN_GROUP = "finished-run"


#: The niceness (``os.nice``) a worker takes for the tests outside :data:`FINISHED_RUN_GROUP`: the finished run and
#: the tests that read it are the suite's longest chain, one worker's, so the other workers (and the processes they
#: start) give it the cores first, as Snakemake's priorities give them to the critical path, and use what it leaves.
OTHER_GROUPS_NICENESS = 10
_NICED: list[int] = []  # this worker's niceness once it took OTHER_GROUPS_NICENESS


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Under pytest-xdist, a worker lowers its priority once, before its first test outside the finished run's
    group (:data:`OTHER_GROUPS_NICENESS`)."""
    marker = item.get_closest_marker("xdist_group")
    if (os.environ.get("PYTEST_XDIST_WORKER") and marker is not None and marker.args[0] != FINISHED_RUN_GROUP
            and not _NICED):
        _NICED.append(os.nice(OTHER_GROUPS_NICENESS))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist's ``--dist loadgroup`` (pyproject.toml): each module's tests go to one worker, so that its
    module-scoped fixtures are built once; the tests of :func:`finished_run` go to one worker, and first."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            group = FINISHED_RUN_GROUP if "finished_run" in item.fixturenames else item.path.relative_to(REPO).as_posix()
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: item.get_closest_marker("xdist_group").args[0] != FINISHED_RUN_GROUP)
