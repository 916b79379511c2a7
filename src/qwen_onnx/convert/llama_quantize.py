"""llama.cpp's own quantizer on the resolved weights: the same-start llama.cpp peer.

The ``hf`` folder is written as a float32 GGUF (:func:`qwen_onnx.convert.gguf_writer.write_gguf`, in a
temporary file) and quantized by llama.cpp's ``llama_model_quantize`` through llama-cpp-python, with
llama.cpp's defaults and no importance matrix, to one of :data:`RECIPES`: ``Q4_K_M``, llama.cpp's
recommended default (``tools/quantize/README.md``), and ``Q5_K_M``, its accurate option. The result, a
folder ``results/{model}/peers/llama.cpp-{recipe}/`` with ``model.gguf`` and ``quantize.json`` (the recipe,
``imatrix: none``, each weight's GGML type, the bytes llama.cpp reads per decoded token, the versions and
seconds), starts from the very weights our variants start from: its rows compare quantizers, where the
``llama.cpp`` row on a source GGUF compares runtimes (the source file is the reference's own weights).
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from qwen_onnx.errors import OptionError, RunnerError
from qwen_onnx.store.artifacts import require_hf_checkpoint, write_json
from qwen_onnx.store.provenance import library_versions, package_version
from qwen_onnx.store.staging import staged_dir

log = logging.getLogger(__name__)

#: The recipes (llama.cpp's ``llama_ftype`` names, lower case) and their ``LLAMA_FTYPE_MOSTLY_*`` values
#: (``include/llama.h``).
RECIPES = {"q4_k_m": 15, "q4_k_s": 14, "q5_k_m": 17, "q5_k_s": 16, "q6_k": 18, "q8_0": 7}
#: The file and the record of a quantized folder.
GGUF_FILE = "model.gguf"
RECORD_FILE = "quantize.json"


def llama_quantize(hf_dir: str | os.PathLike, output_dir: str | os.PathLike, *, recipe: str = "q4_k_m",
                   threads: int | None = None, scratch_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """Quantize the ``hf`` folder with llama.cpp's own quantizer into ``output_dir`` (module docstring).

    Args:
        hf_dir: the resolved Hugging Face folder (float32 safetensors).
        output_dir: the folder to write (``model.gguf``, ``quantize.json``); replaced when present.
        recipe: one of :data:`RECIPES`.
        threads: the quantizer's threads (``nthread``; None: all cores).
        scratch_dir: where the temporary float32 GGUF goes (4 bytes a weight: 2.0 GB for the 0.5B, 6.2 GB
            for the 1.5B; deleted at the end); default: beside ``output_dir``.

    Returns:
        The record written to ``quantize.json``.

    Raises:
        OptionError: an unknown recipe.
        RunnerError: llama-cpp-python is not installed, or its quantizer fails (its return code).
        ArtifactError: ``hf_dir`` is not a Hugging Face checkpoint.
    """
    import ctypes

    from qwen_onnx.convert.gguf_writer import write_gguf
    from qwen_onnx.source.gguf_file import gguf_weight_types
    from qwen_onnx.store.artifacts import read_json

    if recipe not in RECIPES:
        raise OptionError(f"llama.cpp recipe {recipe!r} is unknown; give one of {', '.join(RECIPES)}")
    hf_dir, output_dir = require_hf_checkpoint(hf_dir), Path(output_dir)
    try:
        import llama_cpp
    except ImportError as exc:
        raise RunnerError("llama-cpp-python is not installed; envs/setup.sh --peers installs it") from exc
    started = time.time()
    scratch_parent = Path(scratch_dir) if scratch_dir is not None else output_dir.parent
    scratch_parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="qwen-onnx-f32-gguf-", dir=scratch_parent) as scratch, \
            staged_dir(output_dir) as stage:
        start = write_gguf(hf_dir, Path(scratch) / "model-f32.gguf")
        written = time.time()
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = RECIPES[recipe]
        params.nthread = int(threads or os.cpu_count() or 1)
        code = llama_cpp.llama_model_quantize(str(start).encode(), str(stage / GGUF_FILE).encode(),
                                              ctypes.byref(params))
        if code != 0:
            raise RunnerError(f"llama.cpp's quantizer returned {code} on {start} ({recipe}); see its log above")
        layers = int(read_json(hf_dir / "config.json")["num_hidden_layers"])
        types = gguf_weight_types(stage / GGUF_FILE, layers)
        record = {
            "peer": f"llama.cpp-{recipe}", "recipe": recipe.upper(), "imatrix": "none",
            "quantizer": "llama.cpp llama_model_quantize (llama-cpp-python), its defaults",
            "start": "the hf folder as a float32 GGUF (qwen_onnx.convert.gguf_writer)",
            "weight_types": types, "bytes": (stage / GGUF_FILE).stat().st_size,
            "decode_weight_bytes": decode_bytes(hf_dir, types),
            "llama_cpp": package_version("llama_cpp_python"), "threads": params.nthread,
            "seconds": {"write_f32": round(written - started, 1), "quantize": round(time.time() - written, 1)},
            "library_versions": library_versions(),
        }
        write_json(stage / RECORD_FILE, record)
    log.info("llama.cpp %s of %s: %.1f MB, %.1f MB read per token, in %.0f s", record["recipe"], hf_dir,
             record["bytes"] / 1e6, record["decode_weight_bytes"] / 1e6, time.time() - started)
    return record


def decode_bytes(hf_dir: Path, weight_types: dict[str, str]) -> int:
    """Bytes llama.cpp reads per decoded token with these weight types over the checkpoint's shapes
    (:func:`qwen_onnx.source.gguf_file.gguf_decode_weight_bytes`)."""
    from safetensors import safe_open

    from qwen_onnx.source.gguf_file import gguf_decode_weight_bytes

    shapes = {}
    for file in sorted(Path(hf_dir).glob("*.safetensors")):
        with safe_open(str(file), framework="numpy") as f:
            for name in f.keys():
                shapes[name] = f.get_slice(name).get_shape()
    return gguf_decode_weight_bytes(shapes, weight_types)
