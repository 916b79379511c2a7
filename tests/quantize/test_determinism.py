"""Same inputs, same commit, same CPU: the same bytes. Every quantizer (the calibrated, searched and
smoothed ones included) builds the tiny Qwen2's variant three times, in three fresh processes, on 2
cores, 2 cores again and 1 core; model.onnx and its external data must be byte-identical. Each process
builds every kind in turn, the second in the reverse order, so that a kind's bytes also do not depend on
what the process built before it."""

import os

import pytest
from child_jobs import BUILD_KINDS, build_variants

from qwen_onnx.measure.sitting import run_in_child


@pytest.fixture(scope="module")
def builds(pipeline, texts, tmp_path_factory) -> list[dict]:
    """Per process (2, 2 and 1 cores): kind -> {file name: sha256}, or the error its build raised."""
    dirs = {k: str(v) for k, v in pipeline.items()}
    root = tmp_path_factory.mktemp("determinism")
    orders = (list(BUILD_KINDS), list(reversed(BUILD_KINDS)), list(BUILD_KINDS))
    return [run_in_child(build_variants, kinds, dirs, str(texts["calibration"]), str(root / f"build{i}"), cores)
            for i, (kinds, cores) in enumerate(zip(orders, (2, 2, 1)))]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to compare 1 and 2")
@pytest.mark.parametrize("kind", BUILD_KINDS)
def test_rebuilding_a_variant_gives_the_same_bytes(builds, kind):
    hashes = [built[kind] for built in builds]
    for h in hashes:
        assert isinstance(h, dict), f"{kind}: {h}"
    assert "model.onnx" in hashes[0]
    assert any(name.endswith(".onnx_data") for name in hashes[0]) or kind == "fp16", hashes[0]
    different = {name for name in hashes[0] if len({h.get(name) for h in hashes}) > 1}
    assert not different, f"{kind}: {sorted(different)} differ between builds on 2, 2 and 1 cores"
