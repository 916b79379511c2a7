"""Memory-light handling of ONNX models with external data (ONNX's external data format:
https://onnx.ai/onnx/repo-docs/ExternalData.html).

The weights of a 1.5B model in fp32 (about 6 GB) are past protobuf's 2 GiB limit and several times
the memory a library step may hold at once. Two tools keep a stage's memory near one tensor:

- :func:`lazy_model`: load ``model.onnx`` *without* its weights, with the working directory set to
  its folder, so that ``onnx.numpy_helper.to_array`` (which
  onnxruntime's quantizer and transformer optimizer call per initializer) reads each tensor from
  disk only when it is needed;
- :func:`consolidate_external_data`: rewrite a model so that every weight lives in one
  ``model.onnx_data`` beside it, copying tensor bytes from wherever they are in fixed-size chunks.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import logging
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import onnx

from qwen_onnx.errors import ArtifactError
from qwen_onnx.store.artifacts import DATA_FILE, MODEL_FILE, all_tensors
from qwen_onnx.store.staging import current_output, failed_path, is_disk_full, owner_tag, sweep_stale

log = logging.getLogger(__name__)

_CHUNK = 1 << 24  # 16 MiB
_INLINE_BELOW = 1024  # bytes; ORT must read small shape-like constants from the graph itself


#: The scratch folders (with their copy of the weights) of the :func:`lazy_model` blocks running in this
#: context that may not write their input: :func:`consolidate_external_data` finds scratch data files there
#: as it finds them in an input folder written in place.
_COPIES: contextvars.ContextVar[tuple[Path, ...]] = contextvars.ContextVar("qwen_onnx_scratch_copies", default=())


class ScratchFiles:
    """Names for temporary files beside a model's weights: ``scratch / "x.onnx"`` is
    ``FOLDER/.qwen-onnx-<tag>-x.onnx``. All of them are removed when :func:`lazy_model` exits.

    FOLDER is the model's own folder when this process may write it and restore its times;
    otherwise (another user's folder, a read-only mount) a temporary folder
    ``.qwen-onnx-PID@HOST~scratch-XXXX`` made in ``near`` when the first name is asked, holding a
    copy of the model's external data files (:func:`clone_or_copy`), which then becomes the
    working directory. Stages that write no scratch file never pay for the copy.
    """

    def __init__(self, folder: Path, tag: str, *, copy_to: Path | None = None,
                 locations: Sequence[str] = ()) -> None:
        self.source = folder
        self.tag = tag
        self.near = copy_to
        self.locations = list(locations)
        self.used = False
        self._folder = folder if copy_to is None else None

    @property
    def in_place(self) -> bool:
        """Whether the scratch files go in the model's own folder."""
        return self.near is None

    @property
    def folder(self) -> Path:
        """The folder of the scratch files (made, with the weights' copy, on first use when not in place)."""
        if self._folder is None:
            self._folder = self._make_copy()
        return self._folder

    def __truediv__(self, name: str) -> Path:
        self.used = True
        return self.folder / f"{self.tag}-{name}"

    def _make_copy(self) -> Path:
        self.near.mkdir(parents=True, exist_ok=True)
        sweep_stale(self.near, ".qwen-onnx-")  # a killed stage's scratch folder
        folder = Path(tempfile.mkdtemp(prefix=f".qwen-onnx-{owner_tag()}scratch-", dir=self.near))
        self._folder = folder  # removed on exit even when the copy fails
        _COPIES.set((*_COPIES.get(), folder))
        started, total, how = time.time(), 0, set()
        for location in self.locations:
            target = folder / location
            target.parent.mkdir(parents=True, exist_ok=True)
            how.add(clone_or_copy(self.source / location, target))
            total += target.stat().st_size
        log.info("%s may not be written by uid %d: its scratch files go to %s, with a %s of its weights "
                 "(%.1f MB, %.1f s)", self.source, os.geteuid(), folder, "/".join(sorted(how)) or "copy",
                 total / 1e6, time.time() - started)
        os.chdir(folder)  # relative external data references now read the copy, beside the scratch graphs
        return folder

    def remove(self) -> None:
        """Remove every scratch file (and the temporary folder, when not in place)."""
        if self.in_place:
            for leftover in self.source.glob(self.tag + "*"):
                leftover.unlink()
        elif self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            _COPIES.set(tuple(f for f in _COPIES.get() if f != self._folder))

    def full_disk(self, exc: BaseException) -> Path | None:
        """The scratch folder when ``exc`` is a full disk that names no file and the scratch
        folder's disk is the full one (under 1 MiB free) while the stage's output is on another disk
        (or there is none): the write that failed was a scratch write."""
        folder = self._folder
        if folder is None or not self.used or not is_disk_full(exc) or failed_path(exc) is not None:
            return None
        try:
            if shutil.disk_usage(folder).free >= 2**20:
                return None
            output = current_output()
            if output is not None:
                out_folder = next(p for p in [output.parent, *output.parents] if p.is_dir())
                if os.stat(out_folder).st_dev == os.stat(folder).st_dev:
                    return None  # the same disk: the output's message names it
        except OSError:
            return None
        return folder


#: Linux's ``FICLONE`` ioctl (linux/fs.h): the new file shares the source's blocks (btrfs, XFS, bcachefs).
_FICLONE = 0x40049409


def clone_or_copy(source: Path, target: Path) -> str:
    """Copy ``source`` to a new file ``target``: a reflink when the filesystem makes one (no bytes
    copied), else a byte copy. A hard link or a symbolic link would cost nothing but is refused when
    the model is read (onnx: "multiple hard links, indicating a potential hardlink attack"; onnx and
    onnxruntime: a symbolic link "escapes model directory"), and so is an absolute or ``../``
    external data path.

    Returns:
        ``reflink`` or ``copy``.
    """
    if sys.platform.startswith("linux"):
        import fcntl

        with open(source, "rb") as src, open(target, "wb") as dst:
            try:
                fcntl.ioctl(dst.fileno(), _FICLONE, src.fileno())
                return "reflink"
            except OSError:
                pass
    shutil.copyfile(source, target)
    return "copy"


def may_write_in_place(folder: Path) -> bool:
    """Whether :func:`lazy_model` may put its scratch files in ``folder``: this process can create
    files there and restore the folder's times afterwards (it owns the folder, or is root), so
    not a folder of another user or on a read-only mount."""
    if not os.access(folder, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        return False
    uid = os.geteuid()
    return uid == 0 or folder.stat().st_uid == uid


@contextlib.contextmanager
def lazy_model(folder: str | os.PathLike,
               scratch_near: str | os.PathLike | None = None) -> Iterator[tuple[onnx.ModelProto, ScratchFiles]]:
    """Yield ``(proto, scratch)``: the graph of ``folder/model.onnx`` without weight data, with the
    working directory set to ``folder`` while inside.

    Tensors keep their external data references, so ``numpy_helper.to_array(tensor)`` with the
    default base directory reads the tensor from ``folder/model.onnx_data`` when needed, and a
    model saved at ``scratch / name`` (without external-data conversion) still points at the
    weights. Temporary files must live beside the weights: ONNX and ONNX Runtime refuse external
    data reached through a symbolic link, an absolute path or one outside the model's folder, and
    ONNX refuses a hard link too. So they go in ``folder`` itself when this process may write it
    (:func:`may_write_in_place`): a hidden per-call prefix, removed on exit, and the folder's
    access and modification times restored so that Snakemake does not see it as changed. An input
    it may not write (another user's results, a read-only mount) is never written: the first
    scratch name asked for makes a temporary folder in ``scratch_near`` (default: beside the
    output of the running :func:`~qwen_onnx.store.staging.staged_dir`, else the system's temporary
    folder) with a reflink or copy of the external data, which becomes the working directory
    (see :class:`ScratchFiles`).

    Raises:
        ArtifactError: ``folder`` has no ``model.onnx`` or no ``model.onnx_data``.
        OSError: ``ENOSPC`` naming the scratch folder, when a scratch write filled its disk and
            the error named no file (:meth:`ScratchFiles.full_disk`).
    """
    folder = Path(folder).resolve()
    source, data = folder / MODEL_FILE, folder / DATA_FILE
    if not source.is_file() or not data.is_file():
        raise ArtifactError(f"{folder} needs {MODEL_FILE} and {DATA_FILE}; found {sorted(os.listdir(folder))}")
    proto = onnx.load(str(source), load_external_data=False)
    tag = f".qwen-onnx-{owner_tag()}{uuid.uuid4().hex[:10]}"
    in_place = may_write_in_place(folder)
    if in_place:
        times = folder.stat()
        sweep_stale(folder, ".qwen-onnx-")  # a killed stage's scratch files
        scratch = ScratchFiles(folder, tag)
    else:
        output = current_output()
        near = Path(scratch_near) if scratch_near is not None else (
            output.parent if output is not None else Path(tempfile.gettempdir()))
        scratch = ScratchFiles(folder, tag, copy_to=near.resolve(), locations=sorted(external_locations(proto)))
    cwd = os.getcwd()
    try:
        os.chdir(folder)
        yield proto, scratch
    except Exception as exc:
        full = scratch.full_disk(exc)
        if full is not None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(full)) from exc
        raise
    finally:
        os.chdir(cwd)
        scratch.remove()
        if in_place:
            os.utime(folder, ns=(times.st_atime_ns, times.st_mtime_ns))


def _location(tensor: onnx.TensorProto) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


def external_locations(proto: onnx.ModelProto) -> set[str]:
    """The external data file names that ``proto``'s tensors reference."""
    return {
        entry.value
        for tensor in all_tensors(proto.graph)
        if tensor.data_location == onnx.TensorProto.EXTERNAL
        for entry in tensor.external_data
        if entry.key == "location"
    }


def has_large_inline_tensor(proto: onnx.ModelProto) -> bool:
    """Whether a tensor of 1 KiB or more is stored inside the graph file."""
    return any(len(t.raw_data) >= _INLINE_BELOW for t in all_tensors(proto.graph))


def consolidate_external_data(
    proto: onnx.ModelProto,
    output: str | os.PathLike,
    search: Sequence[str | os.PathLike],
) -> None:
    """Save ``proto`` at ``output`` with every tensor of 1 KiB or more in ``model.onnx_data``.

    Tensors are initializers and node attributes (large ``Constant`` values are external in
    optimum's exports of big models), in subgraphs too.

    Tensor bytes come from the tensor itself (``raw_data``) or from its current external file,
    found in the first folder of ``search`` that holds it; they are copied in 16 MiB chunks, so
    memory stays at one chunk plus the graph. Tensors under 1 KiB are kept inline. Scratch data files
    of a :func:`lazy_model` whose input may not be written are found in its scratch folder too.

    Raises:
        ArtifactError: an external file named by a tensor is in none of the ``search`` folders.
    """
    output = Path(output)
    target = output.parent / DATA_FILE
    tmp_data = output.parent / (DATA_FILE + ".partial")
    handles: dict[Path, object] = {}
    try:
        with open(tmp_data, "wb") as out:
            for tensor in all_tensors(proto.graph):
                if tensor.data_location == onnx.TensorProto.EXTERNAL:
                    info = _location(tensor)
                    src = _find(info["location"], search)
                    handle = handles.get(src) or handles.setdefault(src, open(src, "rb"))
                    offset = int(info.get("offset", 0))
                    length = int(info["length"]) if "length" in info else src.stat().st_size - offset
                    if length < _INLINE_BELOW:
                        handle.seek(offset)
                        tensor.raw_data = handle.read(length)
                        del tensor.external_data[:]
                        tensor.data_location = onnx.TensorProto.DEFAULT
                        continue
                    start = out.tell()
                    handle.seek(offset)
                    remaining = length
                    while remaining:
                        block = handle.read(min(_CHUNK, remaining))
                        if not block:
                            raise ArtifactError(f"{src} ends before tensor {tensor.name!r} ({length} bytes at {offset})")
                        out.write(block)
                        remaining -= len(block)
                    _set_external(tensor, start, length)
                elif tensor.HasField("raw_data") and len(tensor.raw_data) >= _INLINE_BELOW:
                    start = out.tell()
                    out.write(tensor.raw_data)
                    length = len(tensor.raw_data)
                    tensor.ClearField("raw_data")
                    _set_external(tensor, start, length)
        for handle in handles.values():
            handle.close()
        handles.clear()
        os.replace(tmp_data, target)
        onnx.save_model(proto, str(output))
    finally:
        for handle in handles.values():
            handle.close()
        if tmp_data.exists():
            tmp_data.unlink()


def _set_external(tensor: onnx.TensorProto, offset: int, length: int) -> None:
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", DATA_FILE), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def _find(location: str, search: Sequence[str | os.PathLike]) -> Path:
    for folder in [*search, *_COPIES.get()]:  # a scratch file of an input not written in place: beside its copy
        candidate = Path(folder) / location
        if candidate.is_file():
            return candidate.resolve()
    raise ArtifactError(
        f"external data file {location!r} not found in {', '.join(str(s) for s in search)}"
    )


class DataWriter:
    """Appends new tensors to one external data file beside the graph (``location`` relative to it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "wb")

    def set(self, tensor: onnx.TensorProto, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array, dtype=np.float32)
        offset = self._file.tell()
        pad = (-offset) % 64  # ORT memory-maps external data; keep tensors aligned
        if pad:
            self._file.write(b"\0" * pad)
            offset += pad
        self._file.write(data.data)  # no bytes copy: lm_head [896, 151936] is 545 MB
        tensor.ClearField("raw_data")
        del tensor.float_data[:]
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", self.path.name), ("offset", str(offset)), ("length", str(data.nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value

    def close(self) -> None:
        self._file.close()


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
