"""Every staged folder's manifest: each file's size and sha256, written last and checked by every stage that
reads the folder (a verified folder is stamped so later reads skip the hashing).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from qwen_onnx.errors import IntegrityError

log = logging.getLogger(__name__)


#: Written last into every staged folder: each file's size and sha256 (see :func:`write_manifest`).
MANIFEST_FILE = "manifest.json"

MANIFEST_FORMAT = "qwen-onnx manifest 1"


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
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
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
    try:
        stamped = stamp.is_file()
    except OSError:  # a stamp folder this user may not search (another user's cache): hash again
        stamped = False
    if stamped:
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
