"""The peers' accuracy: the same figures as our variants', on the same evaluation windows, against the
same PyTorch reference (the ``accuracy_peer`` stage, ``results/{model}/reports/{peer}.accuracy.json``).

- ``llama.cpp``: the source GGUF (the embedded models' Q4_K_M) through llama-cpp-python's logits
  (:class:`qwen_onnx.run.llama_cpp.LlamaCppCausalLM`), in a child process so that a build this CPU
  cannot run (SIGILL) is recorded with its cause instead of ending the job.
- ``llama.cpp-{recipe}``: llama.cpp's own quantizer on the Hugging Face folder (``results/{model}/peers/
  llama.cpp-{recipe}/model.gguf``, :mod:`qwen_onnx.convert.llama_quantize`), the same way, in a child process.
- ``genai-builder-int4``: onnxruntime-genai's builder INT4 graph through our accuracy stage
  (:class:`qwen_onnx.run.runtime.OnnxCausalLM`, the graph the ``genai-builder-int4-ort`` row times).
- ``openvino-int4``: optimum-intel's INT4 OpenVINO IR (:mod:`qwen_onnx.convert.openvino_export`) through
  :class:`qwen_onnx.run.openvino_ir.OpenVinoIrCausalLM` (its stateful model, the CPU plugin's defaults), in
  a child process.
- ``{variant}-openvino`` (``int4-openvino``, ...): our variant folder run by OpenVINO's CPU plugin
  (:class:`qwen_onnx.run.openvino.OpenVinoCausalLM`, f32 precision hint), in a child process like
  llama.cpp, so that a crash is recorded with its signal.

The three peers are scored against the int4 gate (``gates.int4``): whether the peer would pass ours. An
OpenVINO row is scored against its variant's own gate kind (the folder's,
:func:`qwen_onnx.settings.gates.folder_gate_kind`: int4's for ``int4-openvino``). A peer that cannot
run here (package missing, no GGUF source, a failed build, a graph OpenVINO does not compile) gets a
record with ``skipped`` and the reason, never a missing file.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.measure.accuracy import accuracy_from_reference
from qwen_onnx.measure.peers_table import llama_cpp_recipe, openvino_variant
from qwen_onnx.measure.sitting import ChildCrashed, run_in_child
from qwen_onnx.run.machine import machine_isa
from qwen_onnx.run.openvino import INSTALL_HINT as OPENVINO_INSTALL_HINT
from qwen_onnx.run.openvino_ir import IR_FILE
from qwen_onnx.settings import defaults
from qwen_onnx.settings.gates import folder_gate_kind
from qwen_onnx.source.resolve import source_gguf
from qwen_onnx.store.artifacts import read_json, write_json

log = logging.getLogger(__name__)

#: The peers whose accuracy is measured, by their row names in the sitting (and every ``{variant}-openvino`` row).
ACCURACY_PEERS = ("llama.cpp", "genai-builder-int4", "openvino-int4")


def peer_accuracy(peer: str, reference_dir: str | os.PathLike, *, source: Any = None,
                  genai_dir: str | os.PathLike | None = None, variant_dir: str | os.PathLike | None = None,
                  openvino_ir_dir: str | os.PathLike | None = None,
                  llama_cpp_dir: str | os.PathLike | None = None,
                  threads: int | None = None, kv_decode_steps: int = defaults.EVALUATION["kv_decode_steps"],
                  gate_limits: Mapping[str, float] | None = None, scratch_dir: str | os.PathLike | None = None,
                  output: str | os.PathLike | None = None) -> dict[str, Any]:
    """A peer's accuracy against the reference, or why it was skipped.

    Args:
        peer: one of :data:`ACCURACY_PEERS`, ``llama.cpp-{recipe}`` (``llama_cpp_dir``), or ``{variant}-openvino``
            (our ``variant_dir`` run by OpenVINO).
        reference_dir: the model's ``reference/`` folder (:func:`qwen_onnx.measure.reference.write_reference`).
        source: the model's configured source (llama.cpp: a ``.gguf`` file or GGUF parts, reassembled
            into ``scratch_dir`` and deleted afterwards).
        genai_dir: the builder's INT4 folder (``results/{model}/peers/genai-builder-int4``).
        variant_dir: an OpenVINO row's variant folder (``results/{model}/int4`` for ``int4-openvino``).
        openvino_ir_dir: optimum-intel's INT4 IR folder (``results/{model}/peers/openvino-int4``).
        llama_cpp_dir: a same-start llama.cpp folder (``results/{model}/peers/llama.cpp-{recipe}``).
        threads: CPU threads of the runtime.
        kv_decode_steps: decode steps of the KV-cache check, as our variants' (``evaluation.kv_decode_steps``).
        gate_limits: the limits of the peer's gate (the int4 gate; an OpenVINO row's, its variant's).
        output: JSON file to write, if given.

    Returns:
        :func:`qwen_onnx.measure.accuracy.accuracy_from_reference`'s result with ``peer``, or
        ``{"peer", "skipped"}`` with the reason.

    Raises:
        QwenOnnxError: an unknown ``peer``.
    """
    if peer not in ACCURACY_PEERS and openvino_variant(peer) is None and llama_cpp_recipe(peer) is None:
        raise QwenOnnxError(f"unknown peer {peer!r}; one of {', '.join(ACCURACY_PEERS)}, llama.cpp-RECIPE or "
                            "VARIANT-openvino")
    kwargs = dict(threads=threads, kv_decode_steps=kv_decode_steps, gate_limits=gate_limits, gate_kind="int4")
    if llama_cpp_recipe(peer) is not None:
        result = _llama_cpp_recipe(Path(llama_cpp_dir) if llama_cpp_dir else None, reference_dir, kwargs)
    elif openvino_variant(peer) is not None:
        result = _openvino(Path(variant_dir) if variant_dir else None, reference_dir, kwargs)
    elif peer == "openvino-int4":
        result = _openvino_ir(Path(openvino_ir_dir) if openvino_ir_dir else None, reference_dir, kwargs)
    elif peer == "genai-builder-int4":
        result = _genai(Path(genai_dir) if genai_dir else None, reference_dir, kwargs)
    else:
        result = _llama_cpp(source, reference_dir, scratch_dir, kwargs)
    result = {"peer": peer, **result}
    if "skipped" in result:
        log.warning("%s accuracy skipped: %s", peer, result["skipped"])
        result.update(machine_isa())
    if output is not None:
        write_json(output, result)
    return result


def _genai(folder: Path | None, reference_dir, kwargs) -> dict[str, Any]:
    if folder is None or not (folder / "model.onnx").is_file():
        record = folder / "builder.json" if folder is not None else None
        error = read_json(record).get("error") if record is not None and record.is_file() else None
        return {"skipped": f"no builder graph: {error or 'the genai_builder stage wrote none'}"}
    return accuracy_from_reference(folder, reference_dir, **kwargs)


def _llama_cpp(source, reference_dir, scratch_dir, kwargs) -> dict[str, Any]:
    if importlib.util.find_spec("llama_cpp") is None:
        return {"skipped": "llama-cpp-python is not installed; envs/setup.sh --peers installs it"}
    if scratch_dir is not None:
        Path(scratch_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="qwen-onnx-gguf-", dir=scratch_dir) as scratch:
        gguf, note = source_gguf(source, scratch)
        if gguf is None:
            return {"skipped": note}
        try:
            return run_in_child(accuracy_from_reference, str(gguf), str(reference_dir), **kwargs)
        except ChildCrashed as exc:
            return {"skipped": f"llama.cpp crashed: the process was {exc}"}


def _llama_cpp_recipe(folder: Path | None, reference_dir, kwargs) -> dict[str, Any]:
    if importlib.util.find_spec("llama_cpp") is None:
        return {"skipped": "llama-cpp-python is not installed; envs/setup.sh --peers installs it"}
    if folder is None or not (folder / "model.gguf").is_file():
        return {"skipped": f"no llama.cpp quantization at {folder}: the llama_quantize stage wrote none"}
    record = read_json(folder / "quantize.json")
    try:
        result = run_in_child(accuracy_from_reference, str(folder / "model.gguf"), str(reference_dir), **kwargs)
    except ChildCrashed as exc:
        return {"skipped": f"llama.cpp crashed: the process was {exc}"}
    return {**result, "recipe": record.get("recipe"), "imatrix": record.get("imatrix"),
            "decode_weight_bytes": record.get("decode_weight_bytes")}


def _openvino_ir(folder: Path | None, reference_dir, kwargs) -> dict[str, Any]:
    if importlib.util.find_spec("openvino") is None:
        return {"skipped": f"openvino is not installed; {OPENVINO_INSTALL_HINT}"}
    record = folder / "export.json" if folder is not None else None
    error = read_json(record).get("error") if record is not None and record.is_file() else None
    if error or folder is None or not (folder / IR_FILE).is_file():
        return {"skipped": f"no OpenVINO IR: {error or 'the openvino_export stage wrote none'}"}
    return _in_child(folder, reference_dir, kwargs)


def _in_child(folder: Path, reference_dir, kwargs, **more) -> dict[str, Any]:
    try:
        return run_in_child(accuracy_from_reference, str(folder), str(reference_dir), **kwargs, **more)
    except ChildCrashed as exc:
        return {"skipped": f"OpenVINO crashed: the process was {exc}"}
    except RuntimeError as exc:  # the child's error, "Type: message"
        if str(exc).startswith("RunnerError: "):
            return {"skipped": str(exc).removeprefix("RunnerError: ")}
        raise


def _openvino(folder: Path | None, reference_dir, kwargs) -> dict[str, Any]:
    if importlib.util.find_spec("openvino") is None:
        return {"skipped": f"openvino is not installed; {OPENVINO_INSTALL_HINT}"}
    if folder is None or not (folder / "model.onnx").is_file():
        return {"skipped": f"no ONNX variant folder at {folder}: build the variant first"}
    return _in_child(folder, reference_dir, {**kwargs, "gate_kind": folder_gate_kind(folder)}, runtime="openvino")
