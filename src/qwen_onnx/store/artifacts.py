"""Variant folders on disk: atomic creation, the Hugging Face side files, ONNX with external data.

A variant folder holds ``model.onnx``, its weights as one external data file ``model.onnx_data``
(ONNX external data: https://onnx.ai/onnx/repo-docs/ExternalData.html), and the Hugging Face
``config.json``, ``generation_config.json`` and tokenizer files, so that
``optimum.onnxruntime.ORTModelForCausalLM.from_pretrained(folder)`` loads it on its own.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib.metadata
import json
import logging
import os
import re
import shutil
import socket
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterator

import onnx

from qwen_onnx.errors import ArtifactError, DiskFullError, IntegrityError

log = logging.getLogger(__name__)

MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx_data"
#: Written last into every staged folder: each file's size and sha256 (see :func:`write_manifest`).
MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "qwen-onnx manifest 1"

#: Files copied next to every ONNX variant so that it is self-contained.
HF_SIDE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)

#: Distributions whose versions are recorded in every provenance file.
TRACKED_PACKAGES = (
    "qwen-onnx",
    "torch",
    "transformers",
    "optimum",
    "optimum-onnx",
    "onnx",
    "onnxruntime",
    "gguf",
    "numpy",
)


def package_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (a pip name), ``None`` when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def library_versions() -> dict[str, str | None]:
    """Installed versions of the libraries that shape the artifacts, ``None`` for a missing one."""
    return {name: package_version(name) for name in TRACKED_PACKAGES}


def owner_tag() -> str:
    """``PID@HOST~``: marks the temporary files and folders this process makes beside outputs, so a
    later run can tell a leftover of a killed process (PID gone on this host) from one in use."""
    return f"{os.getpid()}@{socket.gethostname()}~"


_OWNED = re.compile(r"(?P<pid>\d+)@(?P<host>[^~/]+)~")


def _owner_gone(pid: int, host: str) -> bool:
    """Whether the process ``pid`` on ``host`` has ended (``False`` for another host: unknown)."""
    if host != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:  # a killed process nobody reaped yet (a container without an init) is a zombie: gone too
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def sweep_stale(folder: str | os.PathLike, prefix: str) -> list[Path]:
    """Remove the entries of ``folder`` named ``prefix`` + ``PID@HOST~...`` (see :func:`owner_tag`)
    whose process has ended on this host: what a SIGKILL, an OOM kill or a power cut left behind.

    Entries of live processes and of other hosts are kept (two runs may share a folder over NFS).

    Returns:
        The paths removed.
    """
    folder = Path(folder)
    removed = []
    try:
        entries = list(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return removed
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        match = _OWNED.match(entry.name[len(prefix):])
        if match and _owner_gone(int(match["pid"]), match["host"]):
            log.info("removing %s, left by process %s that no longer runs", entry, match["pid"])
            try:
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink(missing_ok=True)
            except OSError as exc:  # not ours to remove (another user's folder): leave it
                log.warning("could not remove %s: %s", entry, exc)
                continue
            removed.append(entry)
    return removed


_LEFTOVER = re.compile(r"(?:\.partial-|^\.qwen-onnx-(?:linked-)?)(?P<pid>\d+)@(?P<host>[^~/]+)~")


def sweep_tree(root: str | os.PathLike) -> list[Path]:
    """Remove, anywhere under ``root``, the temporary files and folders of stages whose process has
    ended on this host (``*.partial-PID@HOST~*``, ``.qwen-onnx-PID@HOST~*``; see :func:`owner_tag`).

    The workflow calls it when a run starts (``onstart`` in ``workflow/rules/common.smk``; not on
    dry runs), so a killed job's leftovers go even when no rerun of that job is needed. Entries of live
    processes and of other hosts are kept.

    Returns:
        The paths removed.
    """
    removed: list[Path] = []
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            match = _LEFTOVER.search(name)
            if match and _owner_gone(int(match["pid"]), match["host"]):
                entry = Path(folder) / name
                log.info("removing %s, left by process %s that no longer runs", entry, match["pid"])
                try:
                    if name in dirs:
                        shutil.rmtree(entry)
                    else:
                        entry.unlink(missing_ok=True)
                except OSError as exc:
                    log.warning("could not remove %s: %s", entry, exc)
                    continue
                removed.append(entry)
        dirs[:] = [d for d in dirs if Path(folder, d) not in removed]
    return removed


#: Environment variables of the fault-injection hook (:func:`fault_point`), used by tests/test_faults.py.
PAUSE_AT_ENV = "QWEN_ONNX_TEST_PAUSE_AT"
PAUSE_SIGNAL_ENV = "QWEN_ONNX_TEST_PAUSE_SIGNAL"


def fault_point(name: str) -> None:
    """Test hook, the only one: pause a stage with its partial output on disk, so that a test can
    SIGKILL it there (tests/test_faults.py).

    When the environment variable ``QWEN_ONNX_TEST_PAUSE_AT`` equals ``name`` (an output's file
    or folder name, e.g. ``fp32``, ``int8-static.accuracy.json``, ``report.md``), the process
    creates the file named by ``QWEN_ONNX_TEST_PAUSE_SIGNAL`` and sleeps for 600 s. Called by
    :func:`staged_dir` when the stage has written its folder (before the manifest and the rename),
    and by :func:`write_json`/:func:`write_text` when the temporary file is written (before the
    rename). Unset, it costs one dictionary look-up.
    """
    if os.environ.get(PAUSE_AT_ENV) != name:
        return
    signal = os.environ.get(PAUSE_SIGNAL_ENV)
    log.warning("%s=%s: pausing for a fault test (pid %d)", PAUSE_AT_ENV, name, os.getpid())
    if signal:  # whole or absent: a test polling for it never reads an empty file
        Path(signal + ".tmp").write_text(str(os.getpid()), encoding="ascii")
        os.replace(signal + ".tmp", signal)
    time.sleep(600)


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) reports a full disk or quota:
    ``OSError`` with ``ENOSPC``/``EDQUOT``, or a C++ library's error text (onnxruntime, protobuf)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(exc)
        if "No space left on device" in text or "Disk quota exceeded" in text:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _size(n: int) -> str:
    """``n`` bytes in decimal units: ``512 B``, ``3.1 MB``, ``2.52 GB``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.{2 if unit == 'GB' else 1}f} {unit}"
    return f"{n} B"


def _disk_full_error(target: Path, free_before: int | None = None) -> DiskFullError:
    free = shutil.disk_usage(target.parent).free
    before = f"had {_size(free_before)} free when the stage started, " if free_before is not None else ""
    return DiskFullError(
        f"no space left on device writing {target} ({target.parent} {before}has {_size(free)} free now that the "
        "partial output is removed); free disk space or put the results on a larger disk, then rerun"
    )


@contextlib.contextmanager
def staged_dir(final: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty sibling folder; on success it gets a manifest and atomically replaces ``final``.

    The folder is ``<final>.partial-PID@HOST~XXXX``. A stage that raises leaves nothing (the
    folder is removed); one killed (SIGKILL, OOM killer, power cut) leaves only that folder, which
    the next stage writing ``final`` removes (:func:`sweep_stale`), never a ``final`` folder a later
    run could take as complete. On success :func:`write_manifest` lists every file (written last),
    then the folder is renamed to ``final``; an existing ``final`` is first renamed aside, so a kill
    at any moment leaves either the old or the new folder whole.

    Raises:
        DiskFullError: the disk filled up while the stage wrote (``ENOSPC``/``EDQUOT``, or any error
            with less than 1 MiB left on the disk); the message names the folder and the free
            space, and nothing is left behind.
    """
    final = Path(final).resolve()  # stages may change the working directory (lazy weight loading)
    final.parent.mkdir(parents=True, exist_ok=True)
    prefix = f"{final.name}.partial-"
    sweep_stale(final.parent, prefix)
    free_before = shutil.disk_usage(final.parent).free
    tmp = Path(tempfile.mkdtemp(prefix=prefix + owner_tag(), dir=final.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)
    try:
        yield tmp
        fault_point(final.name)
        write_manifest(tmp)
    except BaseException as exc:
        # onnxruntime's writer says only "Failed to write external initializers": a disk left with
        # less than 1 MiB when the stage fails counts as full too
        full = is_disk_full(exc) or (isinstance(exc, Exception) and shutil.disk_usage(tmp).free < 2**20)
        shutil.rmtree(tmp, ignore_errors=True)
        if full:
            log.warning("%s failed on a full disk: %s", final, exc)
            raise _disk_full_error(final, free_before) from exc
        raise
    if final.exists():
        old = final.with_name(f"{prefix}{owner_tag()}replaced-{uuid.uuid4().hex[:8]}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_manifest(folder: str | os.PathLike) -> Path:
    """Write ``folder/manifest.json``: every file under ``folder`` with its size (bytes) and sha256.

    Written last by :func:`staged_dir`, so a folder with a manifest was complete when written, and
    :func:`verify_manifest` proves it still is. sha256 of the whole file, not of sampled chunks:
    measured at 1.44 s for the 0.5B model's 2.52 GB fp32 ``model.onnx_data`` from the page cache
    (3.8 s cold) on this VM, a few percent of the stage that writes it.

    Returns:
        The manifest's path.
    """
    folder = Path(folder)
    files = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST_FILE):
        files.append({"name": path.relative_to(folder).as_posix(), "bytes": path.stat().st_size,
                      "sha256": _sha256(path)})
    target = folder / MANIFEST_FILE
    target.write_text(json.dumps({"format": MANIFEST_FORMAT, "files": files}, indent=1) + "\n", encoding="utf-8")
    return target


_verified: dict[tuple, None] = {}

#: Environment variable naming the folder of verification stamps (default
#: ``$XDG_CACHE_HOME/qwen-onnx/verified``, else ``~/.cache/qwen-onnx/verified``).
VERIFIED_CACHE_ENV = "QWEN_ONNX_VERIFIED_CACHE"


def verified_cache_dir() -> Path:
    """The folder of :func:`verify_manifest`'s stamps: one empty file per folder that passed,
    named by the sha256 of its identity (path, and each listed file's size, mtime and inode)."""
    if os.environ.get(VERIFIED_CACHE_ENV):
        return Path(os.environ[VERIFIED_CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "qwen-onnx" / "verified"


def _stamp(key: tuple) -> Path:
    return verified_cache_dir() / hashlib.sha256(repr(key).encode("utf-8")).hexdigest()


def verify_manifest(folder: str | os.PathLike) -> bool:
    """Check every file ``folder/manifest.json`` lists: present, of the recorded size and sha256.

    A folder without a manifest (written by hand, by another tool, or by qwen-onnx before
    manifests) is accepted as it is, and the check returns ``False``; files the manifest does not
    list (e.g. Snakemake's ``.snakemake_timestamp``) are ignored. A folder that passed is not
    hashed again, in this process or a later one (a stamp in :func:`verified_cache_dir`), while
    its manifest and files keep their size, modification time and inode: the stat data git's index
    trusts the same way. Reading a 6.7 GB fp32 folder of the 1.5B cold took most of a 54 s
    ``diff`` job, which needs no weights.

    Returns:
        Whether a manifest was found (and checked).

    Raises:
        IntegrityError: a listed file is missing, or its size or sha256 differs (truncated,
            damaged, or changed after it was written); the message names the file and the fix.
    """
    folder = Path(folder)
    manifest_path = folder / MANIFEST_FILE
    if not manifest_path.is_file():
        return False
    fix = f"delete {folder} and rerun the stage that wrote it (the workflow rebuilds a deleted folder)"
    try:
        manifest = read_json(manifest_path)
        files = manifest["files"]
    except (ValueError, KeyError, TypeError) as exc:
        raise IntegrityError(f"{manifest_path} is damaged ({exc}); {fix}") from exc
    stats = []
    for entry in files:
        path = folder / entry["name"]
        try:
            stat = path.stat()
        except FileNotFoundError:
            raise IntegrityError(f"{path} is missing, though {MANIFEST_FILE} lists it; {fix}") from None
        if stat.st_size != entry["bytes"]:
            raise IntegrityError(
                f"{path} has {stat.st_size:,} bytes, {MANIFEST_FILE} records {entry['bytes']:,} (truncated or "
                f"changed after it was written); {fix}")
        stats.append((entry["name"], stat.st_size, stat.st_mtime_ns, stat.st_ino))
    key = (str(folder.resolve()), manifest_path.stat().st_mtime_ns, tuple(stats))
    if key in _verified:
        return True
    stamp = _stamp(key)
    if stamp.is_file():
        _verified[key] = None
        return True
    for entry in files:
        path = folder / entry["name"]
        if _sha256(path) != entry["sha256"]:
            raise IntegrityError(
                f"{path} does not match the sha256 in {MANIFEST_FILE} (damaged or changed after it was "
                f"written); {fix}")
    _verified[key] = None
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.touch()
    except OSError as exc:  # a read-only home: every process hashes again, nothing else changes
        log.debug("no verification stamp written (%s)", exc)
    return True


def write_json(path: str | os.PathLike, obj: object) -> None:
    """Write ``obj`` as indented JSON through a temporary file and an atomic rename (see :func:`write_text`)."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) at ``path`` through ``<path>.partial-PID@HOST~`` and an atomic rename,
    so that ``path`` is either absent, the old file, or the whole new one (a killed writer's
    temporary file is removed by :func:`sweep_tree`).

    Raises:
        DiskFullError: the disk filled up (the message names the file and the free space).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.partial-{owner_tag()}")
    try:
        tmp.write_text(text, encoding="utf-8")
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if is_disk_full(exc):
            raise _disk_full_error(path) from exc
        raise
    fault_point(path.name)
    os.replace(tmp, path)


def copy_side_files(src: str | os.PathLike, dst: str | os.PathLike) -> list[str]:
    """Copy the Hugging Face config, generation config and tokenizer files present in ``src``.

    Returns:
        The names copied.

    Raises:
        ArtifactError: ``src`` has no ``config.json`` (it is not a Hugging Face model folder).
    """
    src, dst = Path(src), Path(dst)
    if not (src / "config.json").is_file():
        raise ArtifactError(
            f"{src} has no config.json: expected a Hugging Face model folder or an ONNX variant folder"
        )
    copied = []
    for name in HF_SIDE_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
            copied.append(name)
    return copied


def model_path(folder: str | os.PathLike) -> Path:
    """The ``model.onnx`` of a variant folder, checked together with its external data.

    Every stage opens a variant folder through this function or :func:`readable_variant`; both
    run :func:`check_external_data`, which also checks the folder's manifest when it has one.

    Raises:
        ArtifactError: the folder cannot be read, ``model.onnx`` is missing, or an external data
            file it names is missing or shorter than its tensors need (the message names the file).
        IntegrityError: a file differs from the folder's manifest.
    """
    folder = Path(folder)
    require_readable(folder)
    path = folder / MODEL_FILE if folder.is_dir() else folder
    if not path.is_file():
        raise ArtifactError(f"no ONNX model at {path}: run the stage that produces it first")
    check_external_data(path)
    return path


def require_readable(path: str | os.PathLike) -> None:
    """Check that this process can read ``path`` (and list it, for a folder) and search every
    folder above it.

    Raises:
        ArtifactError: one line naming the first path that cannot be read, its owner and mode, and
            the fix.
    """
    path = Path(path).absolute()
    for step in [*reversed(path.parents), path]:
        try:
            stat = step.stat()
        except (FileNotFoundError, NotADirectoryError):
            return  # the caller names a missing path
        is_dir = os.path.isdir(step)
        need = (os.X_OK if is_dir else 0) | (os.R_OK if step == path else 0)
        if need and not os.access(step, need):
            raise ArtifactError(unreadable_message(step, stat))


def unreadable_message(path: str | os.PathLike, stat: os.stat_result | None = None) -> str:
    """``PATH is not readable by uid N (owner uid M, mode drwx------); fix: ...``: the one line for a
    folder or file this process may not read (see :func:`require_readable`)."""
    import stat as stat_module

    path = Path(path)
    if stat is None:
        try:
            stat = path.stat()
        except OSError:
            stat = None
    owner = f"owner uid {stat.st_uid}, mode {stat_module.filemode(stat.st_mode)}" if stat else "no details"
    return (f"{path} is not readable by uid {os.geteuid()} ({owner}); make it readable, e.g. "
            f"`chmod -R u+rwX,go+rX {path}` as its owner, or run as the user who owns it")


def permission_message(exc: PermissionError) -> str:
    """The one line for a ``PermissionError`` that a check did not anticipate (an output folder this
    user may not write, a file inside a folder it may not read): the path, the user and the fix."""
    path = exc.filename or "a file"
    return (f"{path}: {exc.strerror or 'permission denied'} for uid {os.geteuid()}; fix its permissions "
            f"(e.g. `chmod -R u+rwX,go+rX` on it or its folder, as the owner) or run as the user who owns it")


def check_external_data(path: str | os.PathLike) -> list[str]:
    """Check the ONNX file at ``path``: every external data file it names exists beside it and holds
    every tensor's bytes (offset + length within the file's size: a cheap check that catches a
    truncated file without a manifest), then its folder's manifest, if any (:func:`verify_manifest`:
    damage that keeps the size is caught by the manifest's sha256 only).

    Returns:
        The external data file names (relative to the model's folder).

    Raises:
        ArtifactError: the file is not ONNX, or an external data file is missing or too short.
        IntegrityError: a file differs from the folder's manifest.
    """
    path = Path(path)
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except PermissionError:
        raise ArtifactError(unreadable_message(path)) from None
    except Exception as exc:  # onnx raises DecodeError or its own errors depending on the damage
        raise ArtifactError(f"{path} is not a readable ONNX model: {exc}") from exc
    ends: dict[str, tuple[int, str]] = {}
    for tensor in all_tensors(proto.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            info = {entry.key: entry.value for entry in tensor.external_data}
            if "location" not in info:
                continue
            end = int(info.get("offset", 0)) + int(info.get("length", 0))
            if end > ends.get(info["location"], (-1, ""))[0]:
                ends[info["location"]] = (end, tensor.name)
    for location in sorted(ends):
        data = path.parent / location
        if not data.is_file():
            raise ArtifactError(
                f"external data file {location!r} named by {path.name} is missing from {path.parent}; "
                "copy it beside the model or rerun the stage that wrote the model"
            )
        end, name = ends[location]
        size = data.stat().st_size
        if size < end:
            raise ArtifactError(
                f"external data file {data} is truncated: {size:,} bytes, but tensor {name!r} of {path.name} "
                f"ends at byte {end:,}; delete {path.parent} and rerun the stage that wrote it"
            )
    verify_manifest(path.parent)
    return sorted(ends)


def all_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor that can hold data: initializers and node attributes (``Constant`` values
    included), in subgraphs too."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
            elif attr.type == onnx.AttributeProto.TENSORS:
                yield from attr.tensors
            elif attr.type == onnx.AttributeProto.GRAPH:
                yield from all_tensors(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from all_tensors(sub)


def ort_optimize_to_file(
    source: str | os.PathLike, output: str | os.PathLike, level: str, provider: str = "CPUExecutionProvider"
) -> None:
    """Let ONNX Runtime optimize ``source`` at ``level`` (``ORT_ENABLE_BASIC``/``ORT_ENABLE_ALL``) and
    save the result at ``output`` through ``optimized_model_filepath``, tensors of 1 KiB or more in
    ``model.onnx_data`` beside it (session config ``session.optimized_model_external_initializers_*``,
    https://onnxruntime.ai/docs/performance/model-optimizations/graph-optimizations.html)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.optimized_model_filepath = str(output)
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name", DATA_FILE)
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    options.log_severity_level = 3
    ort.InferenceSession(str(source), options, providers=[provider])


def save_with_external_data(proto: onnx.ModelProto, path: str | os.PathLike) -> None:
    """Save ``proto`` at ``path`` with every initializer in one external data file ``model.onnx_data``.

    Tensors under 1 KiB stay inline (ONNX Runtime must read shape-like constants such as
    ``Unsqueeze`` axes from the graph itself); every weight goes to the external file, so a tiny
    test model has the same layout as the real ones past protobuf's 2 GiB limit.
    """
    path = Path(path)
    data = path.parent / DATA_FILE
    if data.exists():
        data.unlink()
    onnx.save_model(
        proto,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=DATA_FILE,
        size_threshold=1024,
        convert_attribute=False,
    )


def folder_bytes(folder: str | os.PathLike, names: tuple[str, ...] = (MODEL_FILE, DATA_FILE)) -> int:
    """Bytes on disk of the ONNX graph and its external data in ``folder``."""
    folder = Path(folder)
    return sum((folder / n).stat().st_size for n in names if (folder / n).is_file())


def read_json(path: str | os.PathLike) -> dict:
    """Read a JSON file written by this package."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _escapes(path: Path, folder: Path) -> bool:
    """Whether ``path`` is a symlink whose target lies outside ``folder``."""
    if not path.is_symlink():
        return False
    return os.path.dirname(os.path.realpath(path)) != os.path.realpath(folder)


@contextlib.contextmanager
def readable_variant(model: str | os.PathLike, near: str | os.PathLike | None = None) -> Iterator[Path]:
    """A variant folder (or ``model.onnx``) whose model and external data are real files in one folder.

    The Hugging Face hub cache stores a downloaded model as symlinks from ``snapshots/REV/`` into
    ``blobs/``; onnxruntime (1.17+) and onnx refuse external data whose real path leaves the
    model's folder ("External data path validation failed ... escapes model directory"), and onnx
    refuses hard links too ("multiple hard links, indicating a potential hardlink attack"). Such a
    folder is copied into a temporary folder beside ``near`` (the stage's output; else the system's
    temporary folder), deleted on exit; any other input is yielded as given.

    Yields:
        The path to read: ``model`` itself, or its mirror (a folder, or the mirror's ``model.onnx``
        when ``model`` named a file).
    """
    given = Path(model)
    require_readable(given)
    path = given / MODEL_FILE if given.is_dir() else given
    if not path.is_file():
        yield given
        return
    folder = path.parent
    try:
        linked = [path, *(folder / name for name in check_external_data(path))]
    except ArtifactError:
        yield given  # the stage names the problem
        return
    if not any(_escapes(p, folder) for p in linked):
        yield given
        return
    parent = Path(near).parent if near is not None else None
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
        sweep_stale(parent, ".qwen-onnx-linked-")
    with tempfile.TemporaryDirectory(prefix=".qwen-onnx-linked-" + owner_tag(), dir=parent) as scratch:
        mirror = Path(scratch)
        log.info("%s links out of its folder (Hugging Face cache layout): reading a copy in %s (%.1f MB)",
                 folder, mirror, sum(p.stat().st_size for p in linked) / 1e6)
        for entry in folder.iterdir():
            if entry.is_file():
                shutil.copy2(entry, mirror / entry.name)
        yield mirror if given.is_dir() else mirror / path.name


def reads_variant(*names: str, near: str | None = "output_dir"):
    """Decorator: the named path arguments of a stage are passed through :func:`readable_variant`,
    its copies made beside the stage's argument ``near`` when the stage has it."""
    import functools
    import inspect

    def decorate(fn):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            with contextlib.ExitStack() as stack:
                beside = bound.arguments.get(near) if near else None
                for name in names:
                    if bound.arguments.get(name) is not None:
                        bound.arguments[name] = stack.enter_context(readable_variant(bound.arguments[name], beside))
                return fn(*bound.args, **bound.kwargs)

        return wrapper

    return decorate
