"""Staged writes: a stage writes into a sibling folder owned by its process and renames it into place only when
complete (with its manifest), so no later run takes a half-written folder for a finished one; leftovers of
dead processes are swept; a full disk is named with the space it needed.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
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

from qwen_onnx.errors import DiskFullError
from qwen_onnx.store.manifest import write_manifest

log = logging.getLogger(__name__)


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


#: Environment variables of the fault-injection hook (:func:`fault_point`), used by tests/store/test_faults.py.
PAUSE_AT_ENV = "QWEN_ONNX_TEST_PAUSE_AT"

PAUSE_SIGNAL_ENV = "QWEN_ONNX_TEST_PAUSE_SIGNAL"


def fault_point(name: str) -> None:
    """Test hook, the only one: pause a stage with its partial output on disk, so that a test can
    SIGKILL it there (tests/store/test_faults.py).

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


def failed_path(exc: BaseException | None) -> Path | None:
    """The file a full-disk error names, first in ``exc``'s chain of causes: the destination
    (``filename2``) of a copy or rename, else ``filename``; None when no ``OSError`` of the chain
    names one (onnxruntime's and protobuf's writers, a bare ``write``)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and is_disk_full(exc):
            name = exc.filename2 or exc.filename
            if isinstance(name, (str, bytes, os.PathLike)) and not isinstance(name, int):
                return Path(os.path.abspath(os.fsdecode(name)))
        exc = exc.__cause__ or exc.__context__
    return None


def _existing(path: Path) -> Path:
    """``path``'s nearest folder that exists (a failed file is usually removed by then)."""
    for folder in [path, *path.parents]:
        if folder.is_dir():
            return folder
    return Path("/")


def _is_part_of(path: Path, target: Path) -> bool:
    """Whether ``path`` lies in ``target`` or in one of its temporary siblings (``TARGET.partial-*``:
    :func:`staged_dir`'s folder, :func:`~qwen_onnx.store.artifacts.write_text`'s file)."""
    for step in [path, *path.parents]:
        if step == target or (step.parent == target.parent and step.name.startswith(target.name + ".partial-")):
            return True
    return False


def disk_full_error(target: Path | None, free_before: int | None = None,
                    exc: BaseException | None = None) -> DiskFullError:
    """The one line for a full disk met while a stage wrote ``target``.

    It names the path whose write failed (:func:`failed_path`) when ``exc`` gives one outside
    ``target``: ``no space left on device writing PATH (FOLDER has 1.2 MB free now; the output's
    disk has 56.6 GB free); free disk space there, then rerun``, FOLDER being the failed path's
    folder (``writing into FOLDER`` when the path is a folder: scratch files written there; the
    output's disk is named when it is another one). Otherwise it names ``target`` and its disk:
    ``no space left on device writing TARGET (PARENT had 2.10 GB free when the stage started, has
    2.31 GB free now that the partial output is removed); free disk space or put the results on a
    larger disk, then rerun``.

    Args:
        target: the output being written (a folder or file); None when no output is known.
        free_before: bytes free on ``target``'s disk when the stage started.
        exc: the error met, searched for the path that failed.
    """
    failed = failed_path(exc)
    if target is not None:
        target = Path(os.path.abspath(target))
    if failed is not None and (target is None or not _is_part_of(failed.resolve(), target.resolve())):
        folder = failed if failed.is_dir() else _existing(failed.parent)
        free = shutil.disk_usage(folder).free
        output = ""
        if target is not None:
            out_folder = _existing(target.parent)
            if os.stat(out_folder).st_dev != os.stat(folder).st_dev:
                output = f"; the output's disk has {_size(shutil.disk_usage(out_folder).free)} free"
        tmp = Path(tempfile.gettempdir()).resolve()
        ours = any(step.parent == tmp and step.name.startswith((".qwen-onnx-", "qwen-onnx-"))
                   for step in [failed.resolve(), *failed.resolve().parents])  # a temporary folder of ours in TMPDIR
        where = " (or point TMPDIR at a larger disk)" if ours else ""
        written = f"into {failed}" if failed.is_dir() else str(failed)
        return DiskFullError(
            f"no space left on device writing {written} ({folder} has {_size(free)} free now{output}); free disk "
            f"space there{where}, then rerun")
    if target is None:
        return DiskFullError(f"no space left on device ({exc}); free disk space, then rerun")
    free = shutil.disk_usage(_existing(target.parent)).free
    before = f"had {_size(free_before)} free when the stage started, " if free_before is not None else ""
    return DiskFullError(
        f"no space left on device writing {target} ({target.parent} {before}has {_size(free)} free now that the "
        "partial output is removed); free disk space or put the results on a larger disk, then rerun"
    )


#: The outputs of the :func:`staged_dir` blocks running in this context, innermost last.
_STAGES: contextvars.ContextVar[tuple[Path, ...]] = contextvars.ContextVar("qwen_onnx_stages", default=())


def current_output() -> Path | None:
    """The final path of the innermost :func:`staged_dir` block running in this context, or None.

    :func:`qwen_onnx.store.external.lazy_model` puts the scratch files of an input folder it may
    not write beside it, on the disk the stage's output goes to.
    """
    stages = _STAGES.get()
    return stages[-1] if stages else None


@contextlib.contextmanager
def staged_dir(final: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty sibling folder; on success it gets a manifest and atomically replaces ``final``.

    The folder is ``<final>.partial-PID@HOST~XXXX``. A stage that raises leaves nothing (the
    folder is removed); one killed (SIGKILL, OOM killer, power cut) leaves only that folder, which
    the next stage writing ``final`` removes (:func:`sweep_stale`), never a ``final`` folder a later
    run could take as complete. On success :func:`write_manifest` lists every file (written last),
    then the folder is renamed to ``final``; an existing ``final`` is first renamed aside, so a kill
    at any moment leaves either the old or the new folder whole.

    While inside, :func:`current_output` gives ``final``.

    Raises:
        DiskFullError: the disk filled up while the stage wrote (``ENOSPC``/``EDQUOT``, or any error
            with less than 1 MiB left on the disk); the message names the path whose write failed
            (the folder, or a file elsewhere such as scratch beside the input: :func:`disk_full_error`)
            and its disk's free space, and nothing is left behind.
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
    token = _STAGES.set((*_STAGES.get(), final))
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
            raise disk_full_error(final, free_before, exc) from exc
        raise
    finally:
        _STAGES.reset(token)
    if final.exists():
        old = final.with_name(f"{prefix}{owner_tag()}replaced-{uuid.uuid4().hex[:8]}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
