"""Running a LiteRT (TFLite) variant: the interpreter with its prefill and decode signatures and KV cache
(:class:`TfliteCausalLM`), and what each signature takes and returns.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from qwen_onnx.errors import ArtifactError, ExportError, OptionError
from qwen_onnx.run.tflite_env import VENV, tflite_python
from qwen_onnx.settings.options import check_option
from qwen_onnx.store.artifacts import (
    SIGNATURES_FILE,
    TFLITE_FILE,
    read_json,
    require_readable,
)
from qwen_onnx.store.manifest import verify_manifest

DECODE_SIGNATURE = "decode"


def prefill_signature(prefill_length: int) -> str:
    """The name litert-torch gives the prefill signature of one fixed length: ``prefill_<length>``."""
    return f"prefill_{prefill_length}"


def is_tflite_folder(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` is a tflite variant folder (it holds ``tflite.json``, written last but the manifest).

    Raises:
        ArtifactError: ``folder`` or a folder above it cannot be read by this process (one line
            naming it, its owner and mode, and the fix; :func:`qwen_onnx.store.artifacts.require_readable`).
    """
    require_readable(folder)
    return (Path(folder) / SIGNATURES_FILE).is_file()


def require_litert(converter: bool = True) -> None:
    """ai-edge-litert (the interpreter) and, to convert, litert-torch are importable.

    Raises:
        ExportError: one is missing (the message names the TFLite environment, where they are installed).
    """
    try:
        import ai_edge_litert.interpreter  # noqa: F401

        if converter:
            import litert_torch  # noqa: F401
    except ImportError as exc:
        raise ExportError(
            f"the tflite variant needs litert-torch and ai-edge-litert ({exc}), which live in the TFLite "
            f"environment {VENV} (envs/setup.sh makes it): run this with {tflite_python()}") from exc


#: Named axes of litert-torch's signature tensors, by name (``kv_cache_k_0`` ... by its prefix).
TENSOR_AXES = {
    "tokens": ("batch_size", "sequence_length"),
    "input_pos": ("sequence_length",),
    "logits": ("batch_size", "sequence_length", "vocab"),
    "kv_cache_": ("batch_size", "kv_cache_length", "kv_heads", "head_dim"),
}


def _axes(name: str, rank: int) -> list[str] | None:
    axes = TENSOR_AXES.get(name) or TENSOR_AXES.get("kv_cache_" if name.startswith("kv_cache_") else "")
    return list(axes) if axes and len(axes) == rank else None


def _tensor_table(details: dict) -> dict[str, dict]:
    return {name: {"shape": [int(d) for d in d_["shape"]], "axes": _axes(name, len(d_["shape"])),
                   "dtype": np.dtype(d_["dtype"]).name}
            for name, d_ in sorted(details.items())}


def describe_signatures(tflite_path: str | os.PathLike) -> dict[str, dict]:
    """Every signature of a ``.tflite`` file with its input and output tensors, read by the LiteRT interpreter.

    Returns:
        ``{signature: {"inputs": {name: {"shape": [1, 8], "axes": ["batch_size", "sequence_length"],
        "dtype": "int32"}}, "outputs": {...}}}`` (axes from :data:`TENSOR_AXES`, ``None`` for a
        tensor it does not name).
    """
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(tflite_path), num_threads=1)
    table = {}
    for name in interpreter.get_signature_list():
        runner = interpreter.get_signature_runner(name)
        table[name] = {"inputs": _tensor_table(runner.get_input_details()),
                       "outputs": _tensor_table(runner.get_output_details())}
    return table


class TfliteCausalLM:
    """Runs a folder written by :func:`convert_tflite` with the LiteRT interpreter, batch 1.

    Holds the KV cache between calls: :meth:`prefill` starts a sequence at position 0,
    :meth:`decode` extends it one token at a time. ``position`` counts the tokens already in the
    cache; a sequence holds at most ``kv_cache_length`` tokens.

    Args:
        folder: the tflite variant folder (``model.tflite`` + ``tflite.json``).
        threads: the interpreter's ``num_threads`` (CPU threads, as the ONNX sessions' intra-op threads).

    Raises:
        OptionError: ``threads`` below 1.
        ArtifactError: the folder has no ``model.tflite`` or ``tflite.json``.
        IntegrityError: a file differs from the folder's manifest.
        ExportError: ai-edge-litert is not installed (it lives in ``.venv-tflite``:
            :mod:`qwen_onnx.run.tflite_env`).
    """
    def __init__(self, folder: str | os.PathLike, threads: int = 1):

        folder = Path(folder)
        for name in (TFLITE_FILE, SIGNATURES_FILE):
            if not (folder / name).is_file():
                raise ArtifactError(f"{folder} has no {name}: run `qwen-onnx tflite` to write the folder")
        check_option("threads", threads)
        verify_manifest(folder)
        require_litert(converter=False)
        from ai_edge_litert.interpreter import Interpreter

        self.folder = folder
        self.info = read_json(folder / SIGNATURES_FILE)
        self.prefill_length: int = self.info["prefill_length"]
        self.kv_cache_length: int = self.info["kv_cache_length"]
        self.threads = threads
        self._interpreter = Interpreter(model_path=str(folder / TFLITE_FILE), num_threads=threads)
        self._prefill = self._interpreter.get_signature_runner(self.info["prefill_signature"])
        self._decode = self._interpreter.get_signature_runner(self.info["decode_signature"])
        inputs = self.info["signatures"][self.info["decode_signature"]]["inputs"]
        self._kv_names = [n for n in inputs if n.startswith("kv_cache_")]
        self._kv_empty = {n: np.zeros(inputs[n]["shape"], dtype=inputs[n]["dtype"]) for n in self._kv_names}
        self.vocab_size: int = self.info["signatures"][self.info["decode_signature"]]["outputs"]["logits"]["shape"][-1]
        self._kv: dict[str, np.ndarray] = dict(self._kv_empty)
        self.position = 0

    def _keep_kv(self, outputs: dict) -> np.ndarray:
        self._kv = {n: outputs[n] for n in self._kv_names}
        return outputs["logits"]

    def prefill(self, ids: Iterable[int]) -> np.ndarray:
        """Start a sequence with the prompt ``ids`` and return the logits of every prompt position.

        Runs the fixed-length prefill signature over chunks of ``prefill_length`` tokens: a short
        last chunk is padded with token 0 at the following positions (their cache rows are
        overwritten by the next decode steps and never attended to before), or, when the prompt is at
        least ``prefill_length`` long, moved back to end at the last token (its overlap recomputes
        cache rows already there from the same context).

        Args:
            ids: prompt token ids, 1 to ``kv_cache_length`` of them.

        Returns:
            float32 [sequence_length, vocab]: logits of every prompt position.

        Raises:
            OptionError: an empty prompt or one longer than ``kv_cache_length``.
        """
        ids = np.asarray(list(ids), dtype=np.int32)
        n, length = len(ids), self.prefill_length
        if not 1 <= n <= self.kv_cache_length:
            raise OptionError(f"a prompt of {n} tokens does not fit this tflite model; give 1 to "
                              f"{self.kv_cache_length} tokens (its kv_cache_length)")
        self._kv = dict(self._kv_empty)
        logits = np.empty((n, self.vocab_size), dtype=np.float32)
        start = 0
        while start < n:
            if start + length > n and n >= length:
                start = n - length
            end = min(start + length, n)
            tokens = np.zeros((1, length), dtype=np.int32)  # [batch=1, prefill_length]
            tokens[0, : end - start] = ids[start:end]
            # [prefill_length]; never past the cache: n < length starts at 0, else the last chunk ends at n
            positions = np.arange(start, start + length, dtype=np.int32)
            out = self._keep_kv(self._prefill(tokens=tokens, input_pos=positions, **self._kv))  # [1, L, vocab]
            logits[start:end] = out[0, : end - start]
            start = end
        self.position = n
        return logits

    def decode(self, token: int, position: int | None = None) -> np.ndarray:
        """Feed one token at ``position`` (default: the next one) and return its logits.

        Returns:
            float32 [vocab]: the logits predicting the token after ``token``.

        Raises:
            OptionError: ``position`` outside 0 to ``kv_cache_length - 1``.
        """
        position = self.position if position is None else position
        if not 0 <= position < self.kv_cache_length:
            raise OptionError(f"decode position {position} is outside the KV cache; this tflite model holds "
                              f"positions 0 to {self.kv_cache_length - 1} (its kv_cache_length)")
        out = self._keep_kv(self._decode(tokens=np.array([[token]], dtype=np.int32),  # [batch=1, 1]
                                         input_pos=np.array([position], dtype=np.int32), **self._kv))
        self.position = position + 1
        return out[0, 0]

    def generate(self, ids: Iterable[int], max_new_tokens: int, eos_token_ids: Iterable[int] = (),
                 stop: Callable[[list[int]], bool] | None = None) -> list[int]:
        """Greedy generation: the prompt's prefill, then up to ``max_new_tokens`` argmax tokens.

        Stops early at a token of ``eos_token_ids`` (included), when the KV cache is full, or when
        ``stop`` (called with the new ids after each token) returns True.

        Returns:
            The new token ids (without the prompt).
        """
        eos = set(eos_token_ids)
        logits = self.prefill(ids)[-1]
        new: list[int] = []
        while len(new) < max_new_tokens:
            token = int(np.argmax(logits))
            new.append(token)
            if token in eos or self.position >= self.kv_cache_length or (stop is not None and stop(new)):
                break
            logits = self.decode(token)
        return new


def read_tflite_info(folder: str | os.PathLike) -> dict:
    """``folder/tflite.json`` (see :func:`convert_tflite`'s return value).

    Raises:
        ArtifactError: the folder has no ``tflite.json``.
    """
    path = Path(folder) / SIGNATURES_FILE
    if not path.is_file():
        raise ArtifactError(f"{folder} has no {SIGNATURES_FILE}: run `qwen-onnx tflite` to write the folder")
    return read_json(path)
