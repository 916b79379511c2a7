"""Read-only inputs: a stage that only reads its input folder needs no write access to it.

Scratch files that must sit beside the weights (``external.lazy_model``) go to a temporary folder
beside the output, with a copy of the weights, when the input may not be written: a read-only
mount (a bind mount in a private mount namespace, ``unshare -m``, or ``unshare -rm`` for a user
without root), or a folder of another user (the stage run as uid 65534 through ``setpriv``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from other_user import NOBODY, nobody_runs_qwen_onnx

from qwen_onnx.store.artifacts import DATA_FILE, MODEL_FILE

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}


def _snapshot(folder: Path) -> dict:
    """Every entry of ``folder`` with its size and modification time, and the folder's own modification
    time (not its access time, which listing it may move)."""
    return {".": folder.stat().st_mtime_ns,
            **{p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}}


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith((".qwen-onnx-", "qwen-onnx-"))
                  or ".partial" in p.name)


# --- lazy_model itself, wherever the platform can run it -------------------------------------------


def test_lazy_model_writes_nothing_into_a_folder_it_may_not_write(pipeline, tmp_path, monkeypatch):
    import qwen_onnx.store.external as external
    from qwen_onnx.store.staging import staged_dir

    source = tmp_path / "fp32"
    shutil.copytree(pipeline["fp32"], source)
    before = _snapshot(source)
    monkeypatch.setattr(external, "may_write_in_place", lambda folder: False)
    utimes = []
    monkeypatch.setattr(external.os, "utime", lambda *a, **k: utimes.append(a))
    with staged_dir(tmp_path / "out") as stage, external.lazy_model(source) as (proto, scratch):
        weight = next(t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL)
        expected = numpy_helper.to_array(weight, base_dir=str(source))
        assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == [stage.name]  # no copy until asked
        graph = scratch / "input.onnx"
        onnx.save_model(proto, str(graph))
        assert graph.parent.parent == tmp_path and graph.parent.name.startswith(".qwen-onnx-")  # beside the output
        np.testing.assert_array_equal(numpy_helper.to_array(weight), expected)  # read from the copy
        ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])  # the copy passes onnxruntime's checks
        loaded = onnx.load(str(graph), load_external_data=False)
        np.testing.assert_array_equal(
            numpy_helper.to_array(next(t for t in loaded.graph.initializer if t.name == weight.name)), expected)
        (stage / MODEL_FILE).write_bytes(b"x")
    assert _snapshot(source) == before and utimes == []
    assert _leftovers(tmp_path) == []


# --- a read-only mount ------------------------------------------------------------------------------


def _read_only_prefix() -> list[str] | None:
    """The command prefix that runs a shell in a private mount namespace where ``mount -o bind,ro`` works,
    or None (no unshare, no mount namespaces, no user namespaces for a user without root)."""
    if not shutil.which("unshare"):
        return None
    with tempfile.TemporaryDirectory() as probe:
        script = f"mkdir {probe}/a {probe}/b && mount --bind {probe}/a {probe}/b && " \
                 f"mount -o remount,bind,ro {probe}/b && ! touch {probe}/b/x 2>/dev/null"
        for prefix in (["unshare", "-m"], ["unshare", "-r", "-m"]):
            done = subprocess.run([*prefix, "sh", "-c", script], capture_output=True)
            if done.returncode == 0:
                return prefix
    return None


READ_ONLY = _read_only_prefix()

#: (stage, the pipeline folder it reads, extra arguments): every stage that only reads its input folder.
STAGES = [
    ("preprocess", "fp32", []),
    ("float16", "fp32", []),
    ("quantize-dynamic", "preprocessed", []),  # blockwise MatMulNBits: scratch graphs beside the weights
    ("quantize-static", "preprocessed", ["--samples", "2", "--sequence-length", "16"]),
    ("quantize-int4", "preprocessed", ["--importance-samples", "4", "--sequence-length", "16"]),
]


@pytest.mark.skipif(READ_ONLY is None, reason="needs unshare with mount namespaces (as root, or with user "
                                              "namespaces) to bind-mount a folder read-only")
@pytest.mark.parametrize("command,source,extra", STAGES, ids=[s[0] for s in STAGES])
def test_a_stage_reads_an_input_on_a_read_only_mount(pipeline, texts, tmp_path, command, source, extra):
    mount = tmp_path / "results" / "tiny" / source
    mount.mkdir(parents=True)
    out = tmp_path / "results" / "tiny" / "out"
    if command in ("quantize-static", "quantize-int4"):
        extra = [*extra, "--calibration-text", str(texts["calibration"])]
    before = _snapshot(pipeline[source])
    script = (f"mount --bind {pipeline[source]} {mount} && mount -o remount,bind,ro {mount} && "
              f"! touch {mount}/probe 2>/dev/null && "
              f"{sys.executable} -m qwen_onnx.cli {command} {mount} -o {out} {' '.join(extra)}")
    done = subprocess.run([*READ_ONLY, "sh", "-c", script], capture_output=True, text=True, env=ENV, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Operation not permitted" not in done.stderr and "Read-only file system" not in done.stderr
    assert (out / MODEL_FILE).is_file() and (out / DATA_FILE).is_file()
    assert _snapshot(pipeline[source]) == before
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(["out", source])  # no scratch folder left


@pytest.mark.skipif(READ_ONLY is None, reason="needs unshare with mount namespaces (as root, or with user "
                                              "namespaces) to bind-mount a folder read-only")
def test_a_variant_from_a_read_only_input_is_the_one_from_a_writable_input(pipeline, tmp_path):
    from qwen_onnx.quantize.int8 import DynamicSettings, quantize_dynamic_variant

    writable = tmp_path / "writable"
    quantize_dynamic_variant(pipeline["preprocessed"], writable, DynamicSettings())
    mount, out = tmp_path / "ro", tmp_path / "out"
    mount.mkdir()
    script = (f"mount --bind {pipeline['preprocessed']} {mount} && mount -o remount,bind,ro {mount} && "
              f"{sys.executable} -m qwen_onnx.cli quantize-dynamic {mount} -o {out}")
    done = subprocess.run([*READ_ONLY, "sh", "-c", script], capture_output=True, text=True, env=ENV, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in (MODEL_FILE, DATA_FILE):
        assert (out / name).read_bytes() == (writable / name).read_bytes(), name


# --- a folder of another user ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o755, 0o777], ids=["read-only-to-others", "writable-by-others"])
def test_a_stage_reads_a_folder_of_another_user(pipeline, mode):
    """uid 65534 reads root's folder: one it may not write, and one it may write but whose times it may not
    restore (os.utime on another user's folder: "Operation not permitted")."""
    env = {**ENV, "HOME": "/tmp"}
    if not nobody_runs_qwen_onnx(env):
        pytest.skip("needs root, setpriv, and a checkout that uid 65534 can read")
    root = Path(tempfile.mkdtemp(prefix="qwen-onnx-owned-", dir="/tmp"))
    try:
        root.chmod(0o777)
        variant = root / "theirs" / "preprocessed"
        shutil.copytree(pipeline["preprocessed"], variant)
        for path in variant.iterdir():
            path.chmod(0o644)  # readable by others (onnx writes external data 0600)
        (root / "theirs").chmod(0o755)
        variant.chmod(mode)
        before = _snapshot(variant)
        mine = root / "mine"
        mine.mkdir()
        os.chown(mine, 65534, 65534)
        env["QWEN_ONNX_VERIFIED_CACHE"] = str(mine / ".cache")  # the user's own stamps
        for command in ("quantize-dynamic", "float16"):
            done = subprocess.run([*NOBODY, sys.executable, "-m", "qwen_onnx.cli", command, str(variant), "-o",
                                   str(mine / command)], capture_output=True, text=True, env=env, timeout=900)
            assert done.returncode == 0, done.stderr[-3000:]
            assert (mine / command / MODEL_FILE).is_file()
        assert _snapshot(variant) == before
        assert sorted(p.name for p in mine.iterdir()) == [".cache", "float16", "quantize-dynamic"]
    finally:
        shutil.rmtree(root)
