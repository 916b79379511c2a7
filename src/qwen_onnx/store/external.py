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
import logging
import os
import uuid
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import onnx

from qwen_onnx.errors import ArtifactError
from qwen_onnx.store.artifacts import DATA_FILE, MODEL_FILE, all_tensors
from qwen_onnx.store.staging import owner_tag, sweep_stale

log = logging.getLogger(__name__)

_CHUNK = 1 << 24  # 16 MiB
_INLINE_BELOW = 1024  # bytes; ORT must read small shape-like constants from the graph itself


class ScratchFiles:
    """Names for temporary files beside a model's weights: ``scratch / "x.onnx"`` is
    ``folder/.qwen-onnx-<tag>-x.onnx``. All of them are removed when :func:`lazy_model` exits."""

    def __init__(self, folder: Path, tag: str) -> None:
        self.folder = folder
        self.tag = tag

    def __truediv__(self, name: str) -> Path:
        return self.folder / f"{self.tag}-{name}"


@contextlib.contextmanager
def lazy_model(folder: str | os.PathLike) -> Iterator[tuple[onnx.ModelProto, ScratchFiles]]:
    """Yield ``(proto, scratch)``: the graph of ``folder/model.onnx`` without weight data, with the
    working directory set to ``folder`` while inside.

    Tensors keep their external data references, so ``numpy_helper.to_array(tensor)`` with the
    default base directory reads the tensor from ``folder/model.onnx_data`` when needed, and a
    model saved at ``scratch / name`` (in the same folder, without external-data conversion) still
    points at the weights. Temporary files must live in the weights' own folder: both ONNX and
    ONNX Runtime refuse external data reached through a symbolic or hard link, or outside the
    model's folder. They carry a hidden per-call prefix, are removed on exit, and the folder's
    access and modification times are restored so that Snakemake does not see it as changed.

    Raises:
        ArtifactError: ``folder`` has no ``model.onnx`` or no ``model.onnx_data``.
    """
    folder = Path(folder).resolve()
    source, data = folder / MODEL_FILE, folder / DATA_FILE
    if not source.is_file() or not data.is_file():
        raise ArtifactError(f"{folder} needs {MODEL_FILE} and {DATA_FILE}; found {sorted(os.listdir(folder))}")
    times = folder.stat()
    sweep_stale(folder, ".qwen-onnx-")  # a killed stage's scratch files
    scratch = ScratchFiles(folder, f".qwen-onnx-{owner_tag()}{uuid.uuid4().hex[:10]}")
    cwd = os.getcwd()
    proto = onnx.load(str(source), load_external_data=False)
    try:
        os.chdir(folder)
        yield proto, scratch
    finally:
        os.chdir(cwd)
        for leftover in folder.glob(scratch.tag + "*"):
            leftover.unlink()
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
    memory stays at one chunk plus the graph. Tensors under 1 KiB are kept inline.

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
    for folder in search:
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
