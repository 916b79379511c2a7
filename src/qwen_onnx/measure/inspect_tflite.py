"""A LiteRT (TFLite) variant read from its flatbuffer without running it: operators per signature, weight bytes
per dtype, the embedding table, the bytes a decode step reads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from qwen_onnx.errors import ArtifactError
from qwen_onnx.run.tflite import read_tflite_info
from qwen_onnx.run.tflite_env import call_with_litert, litert_here
from qwen_onnx.store.artifacts import TFLITE_FILE

#: Ops that read one row of a table per token (the embedding lookup).
_LOOKUP_OPS = ("EMBEDDING_LOOKUP", "GATHER")


def _enum_names(enum_class) -> dict[int, str]:
    return {v: k for k, v in vars(enum_class).items() if not k.startswith("_") and isinstance(v, int)}


def read_tflite_graph(tflite_path: str | os.PathLike) -> dict[str, Any]:
    """The structure of a ``.tflite`` file read from its flatbuffer (memory-mapped; no interpreter, no tensors allocated).

    Uses the LiteRT flatbuffer schema shipped with ai-edge-litert (``ai_edge_litert.schema_py_generated``).

    Returns:
        ``subgraphs``: per signature (its key, else ``subgraph_<i>``) ``ops`` (op-type histogram, most
        common first) and ``nodes`` (operator count); ``constant_tensors`` (distinct weight buffers),
        ``constant_bytes`` and ``constant_bytes_per_dtype`` (bytes of those buffers by tensor type,
        e.g. ``{"int8": 311296, "float32": 1024}``), ``constant_tensors_per_dtype`` (their count); ``embedding`` (the table an ``EMBEDDING_LOOKUP``
        or ``GATHER`` reads: ``shape`` [vocab, hidden], ``dtype``, ``bytes``, ``row_bytes``, and
        ``shared`` when another op, the tied lm_head, reads the same buffer), or None when no such table is found.

    Raises:
        ArtifactError: the file is missing or not a TFLite flatbuffer.
    """
    import mmap

    from ai_edge_litert import schema_py_generated as schema

    path = Path(tflite_path)
    if not path.is_file():
        raise ArtifactError(f"no TFLite file at {path}: run `qwen-onnx tflite` to write the folder")
    op_names = _enum_names(schema.BuiltinOperator)
    type_names = {k: v.lower() for k, v in _enum_names(schema.TensorType).items()}
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[4:8] != b"TFL3":
            raise ArtifactError(f"{path} is not a TFLite flatbuffer (no TFL3 identifier); delete the folder and "
                                "rerun the stage that wrote it")
        model = schema.Model.GetRootAs(data, 0)
        codes = []
        for i in range(model.OperatorCodesLength()):
            code = model.OperatorCodes(i)
            codes.append(op_names.get(max(code.BuiltinCode(), code.DeprecatedBuiltinCode()), "CUSTOM"))

        def buffer_bytes(index: int) -> int:
            buffer = model.Buffers(index)
            return int(buffer.Size()) if buffer.Offset() > 1 else int(buffer.DataLength())

        names = {model.SignatureDefs(i).SubgraphIndex(): model.SignatureDefs(i).SignatureKey().decode()
                 for i in range(model.SignatureDefsLength())}
        subgraphs: dict[str, dict[str, Any]] = {}
        constant: dict[int, str] = {}  # buffer -> tensor type
        readers: dict[int, set[str]] = {}  # constant buffer -> op types reading it
        lookup: dict[int, tuple[list[int], str]] = {}  # table buffer -> (shape, dtype)
        for g in range(model.SubgraphsLength()):
            graph = model.Subgraphs(g)
            tensors = [graph.Tensors(t) for t in range(graph.TensorsLength())]
            for tensor in tensors:
                if tensor.Buffer() > 0 and buffer_bytes(tensor.Buffer()) > 0:
                    constant[tensor.Buffer()] = type_names.get(tensor.Type(), str(tensor.Type()))
            ops = []
            for o in range(graph.OperatorsLength()):
                op = graph.Operators(o)
                name = codes[op.OpcodeIndex()]
                ops.append(name)
                inputs = [int(i) for i in op.InputsAsNumpy()] if op.InputsLength() else []
                for position, index in enumerate(inputs):
                    if index < 0 or tensors[index].Buffer() not in constant:
                        continue
                    buffer = tensors[index].Buffer()
                    readers.setdefault(buffer, set()).add(name)
                    if name in _LOOKUP_OPS and tensors[index].ShapeLength() == 2 and \
                            (name == "GATHER" and position == 0 or name == "EMBEDDING_LOOKUP" and position == 1):
                        lookup[buffer] = ([int(d) for d in tensors[index].ShapeAsNumpy()], constant[buffer])
            histogram = {}
            for name in sorted(set(ops), key=lambda n: (-ops.count(n), n)):
                histogram[name] = ops.count(name)
            subgraphs[names.get(g, f"subgraph_{g}")] = {"nodes": len(ops), "ops": histogram}
        per_dtype: dict[str, int] = {}
        count_per_dtype: dict[str, int] = {}
        for buffer, dtype in constant.items():
            per_dtype[dtype] = per_dtype.get(dtype, 0) + buffer_bytes(buffer)
            count_per_dtype[dtype] = count_per_dtype.get(dtype, 0) + 1
        embedding = None
        if lookup:
            buffer, (shape, dtype) = max(lookup.items(), key=lambda item: buffer_bytes(item[0]))
            size = buffer_bytes(buffer)
            embedding = {"shape": shape, "dtype": dtype, "bytes": size, "row_bytes": size // max(shape[0], 1),
                         "shared": bool(readers[buffer] - set(_LOOKUP_OPS))}
        return {"subgraphs": subgraphs, "constant_tensors": len(constant), "constant_bytes": sum(per_dtype.values()),
                "constant_bytes_per_dtype": dict(sorted(per_dtype.items(), key=lambda kv: -kv[1])),
                "constant_tensors_per_dtype": dict(sorted(count_per_dtype.items(), key=lambda kv: -kv[1])),
                "embedding": embedding}


def tflite_weight_bytes_per_token(folder: str | os.PathLike) -> tuple[int, str]:
    """Bytes read to decode one token from a tflite folder, and how they were counted.

    The ``model.tflite`` bytes minus its embedding table plus one row of it (a lookup reads one
    row per token), as :func:`qwen_onnx.measure.inspect_graph.decode_weight_bytes` counts ONNX graphs; the
    whole file when the table is not found or is also the (tied) lm_head's weight, which reads all of it.

    Returns:
        ``(bytes, note)``.
    """
    path = Path(folder) / TFLITE_FILE
    total = path.stat().st_size
    embedding = read_tflite_graph(path)["embedding"]
    if embedding is None:
        return total, "the model.tflite bytes (no embedding lookup table found)"
    if embedding["shared"]:
        return total, "the model.tflite bytes (the embedding table is also the tied lm_head's weight)"
    return (total - embedding["bytes"] + embedding["row_bytes"],
            f"the model.tflite bytes minus the {embedding['dtype']} embedding table {embedding['shape']} "
            f"({embedding['bytes']} bytes) plus one row")


def inspect_tflite(folder: str | os.PathLike) -> dict[str, Any]:
    """The ``inspect`` stage's summary of a tflite folder (the ONNX variants' is :func:`qwen_onnx.measure.inspect_graph.inspect_model`).

    Returns:
        ``format`` (``tflite``), ``path``; ``signatures`` as ``tflite.json`` records them (per
        signature its input and output tensors with ``shape``, ``dtype`` and named ``axes``, e.g.
        ``logits`` float32 [batch_size=1, sequence_length, vocab]); ``prefill_length``,
        ``kv_cache_length`` (tokens), ``quantize`` (the litert-torch recipe); ``subgraphs`` (per
        signature, op-type histogram and operator count), ``other_subgraphs`` (the composite ops'
        decompositions), ``nodes`` (the prefill signature's operator count) and ``op_types`` (its
        histogram); ``quant_ops`` (``{"int8 weights": count}``: weight buffers stored int8, int4 or float16), ``initializers`` (``count``,
        ``bytes``, ``bytes_per_dtype`` of the weight buffers); ``embedding`` (see
        :func:`read_tflite_graph`); ``bytes_on_disk`` (``model.tflite``, bytes); ``opsets`` ({}: a
        TFLite file has none); ``litert_torch_version``.

    Raises:
        ArtifactError: the folder has no ``tflite.json`` or ``model.tflite``.
        ExportError: ai-edge-litert (its flatbuffer schema) is not installed here and there is no TFLite environment.
    """
    if not litert_here():  # the schema ships with ai-edge-litert, in the TFLite environment (.venv-tflite)
        return call_with_litert(inspect_tflite, (folder,))
    folder = Path(folder)
    info = read_tflite_info(folder)
    graph = read_tflite_graph(folder / TFLITE_FILE)
    prefill = graph["subgraphs"].get(info["prefill_signature"]) or next(iter(graph["subgraphs"].values()))
    quantized = {dtype: n for dtype, n in graph["constant_tensors_per_dtype"].items() if dtype in ("int8", "int4", "float16")}
    signatures = {name: ops for name, ops in graph["subgraphs"].items() if name in info["signatures"]}
    return {
        "format": "tflite",
        "path": str(folder / TFLITE_FILE),
        "quantize": info["quantize"],
        "prefill_length": info["prefill_length"],
        "kv_cache_length": info["kv_cache_length"],
        "signatures": info["signatures"],
        "subgraphs": signatures,
        "other_subgraphs": len(graph["subgraphs"]) - len(signatures),  # decompositions of composite ops (RMSNorm, SDPA)
        "nodes": prefill["nodes"],
        "op_types": prefill["ops"],
        "quant_ops": {f"{dtype} weights": n for dtype, n in quantized.items()},
        "initializers": {"count": graph["constant_tensors"], "bytes": graph["constant_bytes"],
                         "bytes_per_dtype": graph["constant_bytes_per_dtype"]},
        "embedding": graph["embedding"],
        "bytes_on_disk": (folder / TFLITE_FILE).stat().st_size,
        "opsets": {},
        "litert_torch_version": info.get("litert_torch_version"),
    }


def inspect_tflite_markdown(info: Mapping[str, Any]) -> str:
    """:func:`inspect_tflite`'s summary as Markdown: the signatures' tensors, the ops, the bytes."""
    lines = [f"# {info['path']}", "",
             f"LiteRT (TFLite) through litert-torch {info.get('litert_torch_version')}; quantization "
             f"`{info['quantize']}`; prefill {info['prefill_length']} tokens, KV cache {info['kv_cache_length']} "
             f"positions; {info['bytes_on_disk']:,} bytes on disk, weight buffers "
             + ", ".join(f"{d} {b:,} bytes" for d, b in info["initializers"]["bytes_per_dtype"].items()) + ".", ""]
    for name, signature in info["signatures"].items():
        lines += [f"## Signature `{name}`", "", "| | tensor | dtype | shape | axes |", "|---|---|---|---|---|"]
        for side in ("inputs", "outputs"):
            for tensor, d in signature[side].items():
                lines.append(f"| {side[:-1]} | `{tensor}` | {d['dtype']} | {d['shape']} | "
                             f"{', '.join(d['axes']) if d.get('axes') else '–'} |")
        ops = info["subgraphs"].get(name, {})
        if ops:
            lines += ["", f"{ops['nodes']} operators: " + ", ".join(f"{k} {v}" for k, v in ops["ops"].items())]
        lines.append("")
    return "\n".join(lines)
