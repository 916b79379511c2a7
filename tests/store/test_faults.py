"""Faults: stages killed with SIGKILL, Snakemake's metadata deleted, a full disk, truncated
or damaged external data and an unreadable results folder.

Every staged folder carries ``manifest.json`` (each file's size and sha256, written last); every
stage opens a variant through ``artifacts.check_external_data``, which checks it. The kills use the
one test hook, ``staging.fault_point`` (``QWEN_ONNX_TEST_PAUSE_AT``): the stage pauses with its
partial output on disk and the test kills Snakemake's process group, as a power cut or the OOM
killer would.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from other_user import NOBODY, nobody_runs_qwen_onnx

from qwen_onnx.cli import main
from qwen_onnx.store.artifacts import DATA_FILE, MODEL_FILE, read_json
from qwen_onnx.store.manifest import MANIFEST_FILE, verify_manifest
from qwen_onnx.store.staging import staged_dir

REPO = Path(__file__).resolve().parents[2]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _leftovers(folder: Path) -> list[str]:
    """Temporary files and folders of a stage that a finished run must not leave."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if ".partial" in p.name or p.name.startswith((".qwen-onnx-", "qwen-onnx-")))


# --- the manifest ----------------------------------------------------------------------------------


def test_every_staged_folder_carries_a_manifest_of_its_files(pipeline):
    for name in ("hf", "fp32", "preprocessed", "int8-static", "optimized", "int4"):
        folder = pipeline[name]
        manifest = read_json(folder / MANIFEST_FILE)
        listed = [f["name"] for f in manifest["files"]]
        assert listed == sorted(p.name for p in folder.iterdir() if p.name != MANIFEST_FILE), name
        for entry in manifest["files"]:
            assert entry["bytes"] == (folder / entry["name"]).stat().st_size
        assert verify_manifest(folder) is True
    data = next(f for f in read_json(pipeline["fp32"] / MANIFEST_FILE)["files"] if f["name"] == DATA_FILE)
    assert data["sha256"] == _sha256(pipeline["fp32"] / DATA_FILE) and data["bytes"] > 100_000


def _damaged_copy(pipeline, tmp_path: Path, how: str, keep_manifest: bool = True) -> tuple[Path, int]:
    broken = tmp_path / "broken"
    shutil.copytree(pipeline["preprocessed"], broken)
    data = broken / DATA_FILE
    size = data.stat().st_size
    if how == "truncated":
        os.truncate(data, size - 4096)
    else:  # the same size, 16 bytes in the middle changed
        with open(data, "r+b") as f:
            f.seek(size // 2)
            chunk = f.read(16)
            f.seek(size // 2)
            f.write(bytes(b ^ 0xFF for b in chunk))
    if not keep_manifest:
        (broken / MANIFEST_FILE).unlink()
    return broken, size


def _commands(broken: Path, pipeline, texts, out: Path) -> dict[str, list[str]]:
    return {
        "inspect": ["inspect", str(broken), "--json", str(out / "i.json")],
        "accuracy": ["accuracy", str(broken), "--reference", str(pipeline["hf"]), "--text", str(texts["evaluation"]),
                     "--window", "16", "--max-windows", "1", "-o", str(out / "a.json")],
        "latency": ["latency", str(broken), "--text", str(texts["evaluation"]), "--prompt-lengths", "8",
                    "--decode-prompt-tokens", "8", "--new-tokens", "2", "-o", str(out / "l.json")],
        "quantize-dynamic": ["quantize-dynamic", str(broken), "-o", str(out / "q")],
        "sensitivity": ["sensitivity", str(broken), "--calibration-text", str(texts["calibration"]), "--samples", "1",
                        "--sequence-length", "16", "-o", str(out / "s.json")],
    }


@pytest.mark.parametrize("keep_manifest", [True, False], ids=["manifest", "no-manifest"])
def test_a_truncated_external_data_file_is_named_by_every_stage_that_reads_it(
        pipeline, texts, tmp_path, capsys, keep_manifest):
    broken, size = _damaged_copy(pipeline, tmp_path, "truncated", keep_manifest)
    out = tmp_path / "out"
    for command, argv in _commands(broken, pipeline, texts, out).items():
        assert main(argv) == 2, command
        err = capsys.readouterr().err
        line = err.strip().splitlines()[-1]
        assert re.fullmatch(
            rf"qwen-onnx {command}: external data file {re.escape(str(broken / DATA_FILE))} is truncated: "
            rf"{size - 4096:,} bytes, but tensor '[^']+' of model.onnx ends at byte {size:,}; "
            rf"delete {re.escape(str(broken))} and rerun the stage that wrote it", line), line
        assert "Traceback" not in err and not out.exists(), command


def test_damaged_external_data_of_the_right_size_is_named_by_its_manifest(pipeline, texts, tmp_path, capsys):
    broken, _ = _damaged_copy(pipeline, tmp_path, "damaged")
    out = tmp_path / "out"
    for command in ("inspect", "latency", "quantize-dynamic"):
        assert main(_commands(broken, pipeline, texts, out)[command]) == 2
        err = capsys.readouterr().err
        assert err.strip().splitlines()[-1] == (
            f"qwen-onnx {command}: {broken / DATA_FILE} does not match the sha256 in manifest.json (damaged or "
            f"changed after it was written); delete {broken} and rerun the stage that wrote it (the workflow "
            "rebuilds a deleted folder)")
        assert "Traceback" not in err and not out.exists()
    # without a manifest (a folder from elsewhere) the same bytes are accepted: only the size can be checked
    (broken / MANIFEST_FILE).unlink()
    assert main(_commands(broken, pipeline, texts, out)["inspect"]) == 0


def test_a_file_missing_from_a_folder_is_named_by_its_manifest(pipeline, tmp_path):
    from qwen_onnx.errors import IntegrityError
    from qwen_onnx.measure.inspect_graph import inspect_model

    folder = tmp_path / "fp32"
    shutil.copytree(pipeline["fp32"], folder)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(IntegrityError, match=rf"^{re.escape(str(folder / 'tokenizer.json'))} is missing, though "
                                             "manifest.json lists it; delete "):
        inspect_model(folder)


# --- leftovers of a killed stage -------------------------------------------------------------------


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def test_the_next_stage_removes_what_a_killed_one_left(tmp_path):
    host, dead = socket.gethostname(), _dead_pid()
    left = {
        "killed": tmp_path / f"variant.partial-{dead}@{host}~abc123",
        "running": tmp_path / f"variant.partial-{os.getpid()}@{host}~def456",  # a live process: kept
        "other host": tmp_path / f"variant.partial-{dead}@elsewhere.example~gh789",  # unknown: kept
        "other output": tmp_path / f"other.partial-{dead}@{host}~ij012",  # another stage's: kept
    }
    for folder in left.values():
        folder.mkdir()
        (folder / DATA_FILE).write_bytes(b"half")
    with staged_dir(tmp_path / "variant") as stage:
        (stage / MODEL_FILE).write_bytes(b"whole")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["variant", *(p.name for k, p in left.items() if k != "killed")])
    assert [f["name"] for f in read_json(tmp_path / "variant" / MANIFEST_FILE)["files"]] == [MODEL_FILE]
    # replacing a finished folder: the old one is renamed aside first, then removed
    with staged_dir(tmp_path / "variant") as stage:
        (stage / MODEL_FILE).write_bytes(b"again")
    assert (tmp_path / "variant" / MODEL_FILE).read_bytes() == b"again"
    assert len(list(tmp_path.glob("variant.partial-*"))) == 2


# --- a full disk -----------------------------------------------------------------------------------


def test_a_full_disk_while_writing_external_data_is_named_in_one_line(pipeline, tmp_path, capsys, monkeypatch):
    import builtins

    import qwen_onnx.store.external as external

    class FullDisk:
        """A file that takes 64 KiB, then fails as a full disk does."""

        def __init__(self, path, mode):
            self.file = builtins.open(path, mode)
            self.written = 0

        def write(self, data):
            if self.written + len(data) > 65536:
                raise OSError(errno.ENOSPC, "No space left on device", str(self.file.name))
            self.written += self.file.write(data)
            return len(data)

        def __getattr__(self, name):
            return getattr(self.file, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

    def full_open(path, mode="r", *args, **kwargs):
        if str(path).endswith(DATA_FILE + ".partial") and "w" in mode:
            return FullDisk(path, mode)
        return builtins.open(path, mode, *args, **kwargs)

    monkeypatch.setattr(external, "open", full_open, raising=False)
    out = tmp_path / "fp32"
    assert main(["export", str(pipeline["hf"]), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(
        rf"qwen-onnx export: no space left on device writing {re.escape(str(out))} \({re.escape(str(tmp_path))} had "
        r"[\d.]+ [KMG]?B free when the stage started, has [\d.]+ [KMG]?B free now that the partial output is "
        r"removed\); free disk space or put the results on a larger disk, then rerun", err.strip().splitlines()[-1])
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def _can_mount_tmpfs() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs root and mount namespaces (unshare -m) for a small tmpfs")
def test_a_real_full_disk_leaves_nothing(pipeline, tmp_path):
    """A 256 KiB tmpfs in a private mount namespace: onnxruntime's writer (preprocess) and ours (export)."""
    assert (pipeline["fp32"] / DATA_FILE).stat().st_size > 400_000  # the output cannot fit
    disk = tmp_path / "disk"
    disk.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    for command, source in (("preprocess", pipeline["fp32"]), ("export", pipeline["hf"])):
        script = (f"mount -t tmpfs -o size=256k tmpfs {disk} && {sys.executable} -m qwen_onnx.cli {command} {source} "
                  f"-o {disk}/out; echo rc=$?; ls -A {disk}")
        done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=env,
                              timeout=600)
        assert done.stdout.strip().splitlines() == ["rc=2"], (command, done.stdout, done.stderr[-3000:])
        line = done.stderr.strip().splitlines()[-1]
        assert re.fullmatch(
            rf"qwen-onnx {command}: no space left on device writing {disk}/out \({disk} had 262.1 KB free when the "
            r"stage started, has 262.1 KB free now that the partial output is removed\); free disk space or put the "
            "results on a larger disk, then rerun", line), line
        assert "Traceback" not in done.stderr


def _bytes(figure: str) -> float:
    number, unit = figure.split()
    return float(number) * {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9}[unit]


def test_a_full_disk_outside_the_output_names_that_path_and_its_free_space(pipeline, tmp_path, capsys, monkeypatch):
    """A scratch write beside the input fails with ENOSPC naming its file: the message names that file and its
    disk's free space, not the output's."""
    import onnx

    source = tmp_path / "input" / "preprocessed"
    shutil.copytree(pipeline["preprocessed"], source)
    failed = []
    save_model = onnx.save_model

    def full_input_disk(proto, path, *args, **kwargs):
        if str(path).startswith(str(source)):
            failed.append(str(path))
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return save_model(proto, path, *args, **kwargs)

    monkeypatch.setattr(onnx, "save_model", full_input_disk)
    out = tmp_path / "output" / "int8-dynamic"
    assert main(["quantize-dynamic", str(source), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]
    assert failed and Path(failed[0]).parent == source  # the scratch graph beside the weights
    match = re.fullmatch(
        rf"qwen-onnx quantize-dynamic: no space left on device writing {re.escape(failed[0])} "
        rf"\({re.escape(str(source))} has (?P<free>[\d.]+ [KMG]?B) free now\); free disk space there, then rerun", line)
    assert match, line
    assert _bytes(match["free"]) == pytest.approx(shutil.disk_usage(source).free, rel=0.01)
    assert "Traceback" not in err and not out.exists()
    assert sorted(p.name for p in source.iterdir()) == sorted(p.name for p in pipeline["preprocessed"].iterdir())


def test_the_path_a_full_disk_names_is_the_destination_of_a_copy(tmp_path):
    from qwen_onnx.store.staging import disk_full_error, failed_path

    # shutil.copyfile's ENOSPC carries the source as filename and the destination as filename2
    copy = OSError(errno.ENOSPC, "No space left on device", "/in/model.onnx_data", None, str(tmp_path / "copy"))
    assert failed_path(copy) == tmp_path / "copy"
    wrapped = RuntimeError("the stage failed")
    wrapped.__cause__ = copy
    assert failed_path(wrapped) == tmp_path / "copy"
    assert failed_path(RuntimeError("No space left on device")) is None  # onnxruntime's text: no path
    # a file of the output's own staged folder is the output
    staged = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "out.partial-1@h~x" / "model.onnx"))
    message = str(disk_full_error(tmp_path / "out", exc=staged))
    assert message.startswith(f"no space left on device writing {tmp_path / 'out'} (")


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs root and mount namespaces (unshare -m) for a small tmpfs")
def test_a_full_input_disk_is_named_not_the_output(pipeline, tmp_path):
    """The input on a tmpfs with room for its files only: the scratch graph written beside its weights
    fills it (onnx names no file); the output's disk has room. The message names the input's disk."""
    source = pipeline["preprocessed"]
    used = sum(-(-p.stat().st_size // 4096) * 4096 for p in source.iterdir())
    assert (source / MODEL_FILE).stat().st_size > 64 * 1024  # a scratch copy of the graph cannot fit
    disk, out = tmp_path / "disk", tmp_path / "out"
    disk.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    script = (f"mount -t tmpfs -o size={used // 1024 + 48}k tmpfs {disk} && cp -a {source}/. {disk}/ && "
              f"{sys.executable} -m qwen_onnx.cli quantize-dynamic {disk} -o {out}; echo rc=$?; ls -A {disk}")
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=600)
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "rc=2", (done.stdout, done.stderr[-3000:])
    assert sorted(lines[1:]) == sorted(p.name for p in source.iterdir())  # no scratch file left on the input
    line = done.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"qwen-onnx quantize-dynamic: no space left on device writing into {re.escape(str(disk))} "
        rf"\({re.escape(str(disk))} has [\d.]+ KB free now; the output's disk has [\d.]+ [KMG]?B free\); free disk "
        r"space there, then rerun", line), line
    assert "Traceback" not in done.stderr and list(tmp_path.iterdir()) == [disk]


# --- an unreadable results folder ------------------------------------------------------------------


def test_an_unreadable_results_folder_is_named_in_one_line(pipeline, texts, tmp_path_factory):
    """Run as uid 65534 (root reads everything), on a results folder of mode 0700 owned by root."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
           "HOME": "/tmp"}
    if not nobody_runs_qwen_onnx(env):
        pytest.skip("needs root, setpriv, and a checkout that uid 65534 can read")
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="qwen-onnx-unreadable-", dir="/tmp"))
    try:
        root.chmod(0o777)
        results = root / "results"
        shutil.copytree(pipeline["fp32"], results / "tiny" / "fp32")
        shutil.copy2(texts["evaluation"], root / "evaluation.txt")
        (root / "evaluation.txt").chmod(0o644)
        results.chmod(0o700)
        variant = results / "tiny" / "fp32"
        for argv in (["inspect", str(variant), "--json", str(root / "i.json")],
                     ["latency", str(variant), "--text", str(root / "evaluation.txt"), "-o", str(root / "l.json")],
                     ["quantize-dynamic", str(variant), "-o", str(root / "q")]):
            done = subprocess.run([*NOBODY, sys.executable, "-m", "qwen_onnx.cli", *argv], capture_output=True,
                                  text=True, env=env, timeout=300)
            assert done.returncode == 2, done.stderr[-3000:]
            assert done.stderr.strip().splitlines()[-1] == (
                f"qwen-onnx {argv[0]}: {results} is not readable by uid 65534 (owner uid 0, mode drwx------); make it "
                f"readable, e.g. `chmod -R u+rwX,go+rX {results}` as its owner, or run as the user who owns it")
            assert "Traceback" not in done.stderr
            assert sorted(p.name for p in root.iterdir()) == ["evaluation.txt", "results"]
    finally:
        shutil.rmtree(root)


# --- SIGKILL in the middle of a workflow stage, then a rerun ---------------------------------------


#: (rule, the output at which the stage pauses, the target asked for, whether to kill it twice); in
#: this order, so that a rebuilt upstream output does not make a later target's inputs newer. The
#: lock left by a killed Snakemake does not depend on the stage: accuracy, the slowest stage on the
#: tiny model, is killed only once (then .snakemake/ deleted).
KILLS = [
    ("report", "report.md", "results/report.md", True),
    ("accuracy", "int8-static.accuracy.json", "results/tiny/reports/int8-static.accuracy.json", False),
    ("quantize_static", "int8-static", "results/tiny/int8-static", True),
    ("export", "fp32", "results/tiny/fp32", True),
]


@pytest.fixture(scope="module")
def killable(finished_run, tmp_path_factory):
    """A copy of the finished three-model run (its .snakemake/ included), to kill stages in."""
    folder = tmp_path_factory.mktemp("killable") / "run"
    shutil.copytree(finished_run, folder, symlinks=True)
    return folder


def _fingerprint(folder: Path, target: str) -> dict:
    """What a rerun must reproduce: the model files of a variant, the accuracy figures, the report."""
    path = folder / target
    if path.is_dir():
        assert verify_manifest(path)
        return {f["name"]: f["sha256"] for f in read_json(path / MANIFEST_FILE)["files"]
                if f["name"] in (MODEL_FILE, DATA_FILE)}
    if path.name.endswith(".accuracy.json"):
        return {k: v for k, v in json.loads(path.read_text()).items() if k != "seconds"}
    return {name: _sha256(path.parent / name) for name in ("report.md", "metrics.csv", "metrics.json")}


def _kill_in(folder: Path, rule: str, pause_at: str, target: str) -> None:
    """Run ``rule`` for ``target``, wait until it pauses in :func:`qwen_onnx.store.staging.fault_point` with its
    partial output on disk, then SIGKILL Snakemake's process group (Snakemake and the job)."""
    from test_workflow import REPO as repo
    from test_workflow import SNAKEMAKE

    signal_file = folder / f"paused-{rule}"
    signal_file.unlink(missing_ok=True)
    env = {**os.environ, "QWEN_ONNX_TEST_PAUSE_AT": pause_at, "QWEN_ONNX_TEST_PAUSE_SIGNAL": str(signal_file)}
    with open(folder / f"killed-{rule}.log", "w") as log:
        # the target before --forcerun, which takes every argument after it
        run = subprocess.Popen([SNAKEMAKE, "-s", str(repo / "Snakefile"), "-d", str(folder), "--cores", "2", target,
                                "--forcerun", rule], env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    deadline = time.monotonic() + 600
    try:
        while not signal_file.exists():
            assert run.poll() is None and time.monotonic() < deadline, (folder / f"killed-{rule}.log").read_text()[-3000:]
            time.sleep(0.2)
        job = int(signal_file.read_text())
    finally:  # a failed wait must not leave a paused job behind for the next test
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    with contextlib.suppress(ProcessLookupError):
        os.kill(job, signal.SIGKILL)  # in case the job left Snakemake's group
    signal_file.unlink()
    assert [p for p in _leftovers(folder / "results") if pause_at in p], "the stage paused before its output"
    planned = {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", (folder / f"killed-{rule}.log").read_text(),
                                                   re.MULTILINE)}
    assert planned == {rule: 1, "total": 1}, planned  # only the target's job ran


@pytest.mark.parametrize("rule, pause_at, target, twice", KILLS, ids=[k[0] for k in KILLS])
def test_a_stage_killed_midway_reruns_to_the_same_result(killable, rule, pause_at, target, twice):
    from test_workflow import snakemake

    clean = _fingerprint(killable, target)
    assert _leftovers(killable / "results") == []
    if twice:
        _killed_then_unlocked(killable, rule, pause_at, target, clean)

    # killed, then .snakemake/ deleted: nothing to unlock, and no half-written output is taken as done
    _kill_in(killable, rule, pause_at, target)
    shutil.rmtree(killable / ".snakemake")
    rerun = snakemake(killable, target)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert _leftovers(killable / "results") == []
    assert _fingerprint(killable, target) == clean


def _killed_then_unlocked(killable: Path, rule: str, pause_at: str, target: str, clean: dict) -> None:
    """Killed with its Snakemake: the lock stays, so the rerun waits for --unlock (docs/recovery.md)."""
    from test_workflow import snakemake

    _kill_in(killable, rule, pause_at, target)
    refused = snakemake(killable, "--rerun-incomplete", target)
    state = (f"{target} exists: {(killable / target).exists()}; leftovers {_leftovers(killable / 'results')}; "
             f"killed run: {(killable / f'killed-{rule}.log').read_text()[-2500:]}; refused run: {refused.stderr[-1500:]}")
    assert refused.returncode != 0 and "Directory cannot be locked" in refused.stderr, state
    assert "--unlock" in refused.stderr
    assert snakemake(killable, "--unlock").returncode == 0
    rerun = snakemake(killable, "--rerun-incomplete", target)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert _leftovers(killable / "results") == []
    assert _fingerprint(killable, target) == clean


def test_a_verified_folder_is_not_hashed_again_by_a_later_process_until_a_file_changes(tmp_path, monkeypatch):
    """The stamp of verify_manifest stands for a later process (the in-process memo is cleared here)."""
    from qwen_onnx.errors import IntegrityError
    from qwen_onnx.store import manifest

    monkeypatch.setenv(manifest.VERIFIED_CACHE_ENV, str(tmp_path / "stamps"))
    folder = tmp_path / "variant"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"graph" * 100)
    (folder / "model.onnx_data").write_bytes(bytes(range(256)) * 40)
    manifest.write_manifest(folder)
    hashed = []
    real = manifest._sha256
    monkeypatch.setattr(manifest, "_sha256", lambda path: hashed.append(path.name) or real(path))
    assert manifest.verify_manifest(folder) is True
    assert sorted(hashed) == ["model.onnx", "model.onnx_data"]
    assert len(list((tmp_path / "stamps").iterdir())) == 1
    manifest._verified.clear()  # a new process
    hashed.clear()
    assert manifest.verify_manifest(folder) is True and hashed == []
    # same size, new bytes and a new mtime: the stamp no longer matches, and the sha256 names the damage
    data = folder / "model.onnx_data"
    data.write_bytes(bytes(reversed(range(256))) * 40)
    os.utime(data, ns=(data.stat().st_atime_ns, data.stat().st_mtime_ns + 1_000_000_000))
    manifest._verified.clear()
    with pytest.raises(IntegrityError, match=r"model.onnx_data does not match the sha256 in manifest.json"):
        manifest.verify_manifest(folder)
