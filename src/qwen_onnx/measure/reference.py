"""PyTorch's reference outputs on the evaluation windows and prompts, computed once per model.

:func:`write_reference` loads the PyTorch fp32 model (eager attention) once and writes a folder
(the workflow's ``results/{model}/reference/``) that every accuracy job reads with
:func:`read_reference`, without loading PyTorch:

- ``logits.npy``: PyTorch's logits of every evaluation window, float32 [windows, window - 1, vocab]
  (the positions that predict a next token inside their window), an ``.npy`` file read
  memory-mapped (``np.load(..., mmap_mode="r")``). float32 is the default because float16 changes
  printed figures. Measured on Qwen2.5-Coder 0.5B (6 windows of 256 tokens of ``evaluation.txt``,
  logits up to 33.7 in magnitude): rounding to float16 moves a logit by up to 1.3e-2 (mean
  7.2e-4), 140 times the fp32 and optimized variants' own max |Δlogit| (9e-5), which would be
  reported as theirs; int8-dynamic's top-1 agreement went from 96.86% to 96.67% (3 of 1,530
  positions flip between near-tied tokens) and its KL median from 0.00113 to 0.00112, while its
  perplexity change (+0.375% / +0.377%), KL mean and max |Δlogit| kept their printed digits.
  ``dtype="float16"`` halves the file (930 MB -> 465 MB for 6 windows of 256 tokens at vocabulary
  151,936) at that cost.
- ``windows.npy``: the token ids of the windows, int64 [windows, window]: ``max_windows`` of the
  text's consecutive windows, spread evenly over it (its first window always among them).
- ``tokenizer/``: the model's tokenizer, config and generation config files (byte copies), so that
  the accuracy stage decodes generated ids without the Hugging Face folder.
- ``reference.json``, written last (its presence marks the folder complete): the settings, the
  library versions, the chat-templated prompt ids, PyTorch's greedy outputs (ids per prompt), the
  end-of-sequence and pad ids, and what each file holds.

The padded-batch and KV-cache checks compare a variant with itself (:mod:`qwen_onnx.measure.parity`), so
the reference keeps only their inputs: the prompt ids, the pad id and the first window.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from qwen_onnx.errors import ArtifactError, OptionError
from qwen_onnx.measure.parity import chat_mode, chat_prompt_ids, shipped_prompts, torch_generate
from qwen_onnx.measure.tokens import source_token_table
from qwen_onnx.settings import defaults
from qwen_onnx.settings.options import check_options
from qwen_onnx.source.text import evenly_spaced, load_tokenizer, token_windows
from qwen_onnx.source.tokenizer import eos_token_ids
from qwen_onnx.store.artifacts import copy_side_files, require_hf_checkpoint, write_json
from qwen_onnx.store.manifest import verify_manifest
from qwen_onnx.store.provenance import library_versions
from qwen_onnx.store.staging import staged_dir

log = logging.getLogger(__name__)

REFERENCE_JSON = "reference.json"
LOGITS_FILE = "logits.npy"
WINDOWS_FILE = "windows.npy"
TOKENIZER_DIR = "tokenizer"
#: Version of the folder's layout, bumped when a file changes meaning.
FORMAT = 1
#: dtypes the logits may be stored in (see the module docstring for float16's error).
LOGITS_DTYPES = ("float32", "float16")


def load_torch_model(hf_dir: str | os.PathLike, threads: int | None = None):
    """The PyTorch fp32 reference (eager attention), in eval mode on the CPU."""
    import torch
    from transformers import AutoModelForCausalLM

    if threads:
        torch.set_num_threads(int(threads))
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


def torch_logits(model, input_ids: np.ndarray) -> np.ndarray:
    """PyTorch logits float32 [batch, sequence, vocab] for ``input_ids`` int64 [batch, sequence]."""
    import torch

    with torch.inference_mode():
        out = model(input_ids=torch.from_numpy(np.asarray(input_ids, dtype=np.int64)), use_cache=False)
    return out.logits.float().numpy()


def write_window_logits(
    path: str | os.PathLike, windows: np.ndarray, forward: Callable[[np.ndarray], np.ndarray], *,
    dtype: str = "float32", desc: str | None = None,
) -> list[int]:
    """Write the logits of every window to an ``.npy`` file, one window at a time (memory-mapped).

    The one writer of reference logits: PyTorch's here (:func:`write_reference`) and the fp32
    graph's in :func:`qwen_onnx.recipes.reference_logits`.

    Args:
        path: the ``.npy`` file to write.
        windows: int64 [windows, window] token windows, each run as one prefill.
        forward: ``ids`` int64 [1, window] -> logits float32 [1, window, vocab].
        dtype: ``float32`` or ``float16`` on disk.
        desc: progress bar label (None: no progress bar).

    Returns:
        The stored shape ``[windows, window - 1, vocab]``: the positions that predict a next token
        inside their window.
    """
    from tqdm import tqdm

    store = None
    for i, ids in enumerate(tqdm(windows, desc=desc, unit="window", disable=desc is None)):
        logits = forward(ids.reshape(1, -1))[0, :-1]  # [window - 1, vocab]
        if store is None:
            store = np.lib.format.open_memmap(path, mode="w+", dtype=np.dtype(dtype),
                                              shape=(len(windows), *logits.shape))
        store[i] = logits
    store.flush()
    shape = list(store.shape)
    del store
    return shape


def write_reference(
    hf_dir: str | os.PathLike,
    text_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    window: int = defaults.EVALUATION["window"],
    max_windows: int | None = defaults.EVALUATION["max_windows"],
    generation_tokens: int = defaults.EVALUATION["generation_tokens"],
    prompts: Sequence[str] | None = None,
    threads: int | None = None,
    dtype: str = "float32",
) -> dict[str, Any]:
    """Run PyTorch fp32 once on the evaluation windows and prompts and write the reference folder.

    Args:
        hf_dir: the fp32 Hugging Face folder the variants came from.
        text_path: UTF-8 evaluation text (not the calibration text); recorded as given.
        out_dir: the folder to write (replaced atomically; see the module docstring for its files).
        window: tokens per evaluation window.
        max_windows: windows kept at most, spread evenly over the text's consecutive windows
            (:func:`~qwen_onnx.source.text.evenly_spaced`: the first one and every
            ``available / max_windows``-th after it), so that a mixed text (code, English and
            Chinese prose) is scored on all of its sections, not on its opening one; None for the
            whole text.
        generation_tokens: maximum new tokens of each greedy generation.
        prompts: user prompts of the generation and padded-batch checks (default: the shipped
            ``prompts.json``).
        threads: PyTorch CPU threads (None: PyTorch's default).
        dtype: ``float32`` or ``float16`` for ``logits.npy``.

    Returns:
        The content of ``reference.json``.

    Raises:
        OptionError: a number out of its range (:data:`qwen_onnx.settings.options.RANGES`) or an unknown dtype.
        TextError: the text holds no full window.
        ArtifactError: ``hf_dir`` is not a Hugging Face checkpoint (the message says what it holds:
            :func:`~qwen_onnx.store.artifacts.require_hf_checkpoint`).
    """
    from tqdm import tqdm


    check_options(window=window, max_windows=max_windows, threads=threads, generation_tokens=generation_tokens)
    if dtype not in LOGITS_DTYPES:
        raise OptionError(f"reference dtype {dtype!r} is not one of {', '.join(LOGITS_DTYPES)}")
    require_hf_checkpoint(hf_dir)  # an ONNX variant or a reference folder is named, not loaded
    started = time.time()
    tokenizer = load_tokenizer(hf_dir)
    available = token_windows(tokenizer, text_path, window)
    windows = available if max_windows is None else available[evenly_spaced(min(max_windows, len(available)),
                                                                            len(available))]
    prompts = list(prompts) if prompts is not None else shipped_prompts()
    prompt_ids = chat_prompt_ids(tokenizer, prompts)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    eos = eos_token_ids(hf_dir)

    with staged_dir(out_dir) as tmp:
        (tmp / TOKENIZER_DIR).mkdir()
        copied = copy_side_files(hf_dir, tmp / TOKENIZER_DIR)
        np.save(tmp / WINDOWS_FILE, windows)
        model = load_torch_model(hf_dir, threads)
        shape = write_window_logits(tmp / LOGITS_FILE, windows, lambda ids: torch_logits(model, ids), dtype=dtype,  # noqa: F821 (deleted after its last use)
                                    desc="PyTorch reference logits")

        outputs = [torch_generate(model, ids, generation_tokens, eos, pad_id)
                   for ids in tqdm(prompt_ids, desc="PyTorch greedy generation", unit="prompt")]
        del model
        gc.collect()
        meta = {
            "format": FORMAT,
            "hf_dir": os.fspath(hf_dir),
            "text": os.fspath(text_path),
            "window": int(window),
            "max_windows": max_windows,
            "windows": int(len(windows)),
            "generation_tokens": int(generation_tokens),
            "threads": threads,
            "logits_dtype": dtype,
            "logits_shape": shape,
            "eos_token_ids": eos,
            "pad_token_id": int(pad_id),
            "added_tokens": source_token_table(hf_dir),
            "chat_mode": chat_mode(tokenizer)[1],
            "generation": [{"prompt": text, "prompt_ids": ids.tolist(), "pytorch_ids": out}
                           for text, ids, out in zip(prompts, prompt_ids, outputs)],
            "files": {
                LOGITS_FILE: f"PyTorch fp32 logits, {dtype} [windows, window - 1, vocab], position t predicts "
                             "token t + 1 of its window",
                WINDOWS_FILE: "token ids of the evaluation windows, int64 [windows, window]",
                TOKENIZER_DIR: f"byte copies of {', '.join(copied)} from the Hugging Face folder",
                REFERENCE_JSON: "this file, written last: settings, prompt ids, PyTorch's greedy outputs, the "
                                "source's added tokens",
            },
            "seconds": round(time.time() - started, 1),
            "library_versions": library_versions(),
        }
        write_json(tmp / REFERENCE_JSON, meta)
    log.info("reference of %s: %d windows of %d tokens, %s logits %s, %d greedy outputs, in %.0f s",
             hf_dir, len(windows), window, dtype, shape, len(outputs), meta["seconds"])
    return meta


class TokenDecoder:
    """``decode(ids) -> str`` as transformers' fast tokenizer decodes with default arguments.

    It reads ``tokenizer.json`` with the ``tokenizers`` library (transformers'
    ``PreTrainedTokenizerFast._decode``: the backend's ``decode`` with special tokens kept, then
    ``clean_up_tokenization`` when ``tokenizer_config.json`` sets ``clean_up_tokenization_spaces``),
    so that the accuracy stage needs neither transformers nor PyTorch.
    """
    def __init__(self, folder: str | os.PathLike):
        from tokenizers import Tokenizer

        folder = Path(folder)
        self._tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        config = folder / "tokenizer_config.json"
        settings = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
        self.clean_up = bool(settings.get("clean_up_tokenization_spaces", False))

    def decode(self, ids: Sequence[int]) -> str:
        text = self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)
        if self.clean_up:  # transformers PreTrainedTokenizerBase.clean_up_tokenization
            for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                                  (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
                text = text.replace(before, after)
        return text


@dataclass
class Reference:
    """A reference folder read back (see :func:`read_reference`)."""

    folder: Path
    meta: dict[str, Any]
    #: int64 [windows, window]
    windows: np.ndarray
    #: float32 or float16 [windows, window - 1, vocab], memory-mapped read-only
    logits: np.ndarray
    prompts: list[str] = field(default_factory=list)
    #: int64 [prompt] each
    prompt_ids: list[np.ndarray] = field(default_factory=list)
    #: PyTorch's greedy output ids per prompt (prompt excluded, end-of-sequence id kept)
    generations: list[list[int]] = field(default_factory=list)

    @property
    def tokenizer_dir(self) -> Path:
        return self.folder / TOKENIZER_DIR

    def decoder(self) -> TokenDecoder:
        return TokenDecoder(self.tokenizer_dir)


def read_reference(folder: str | os.PathLike) -> Reference:
    """Open a folder written by :func:`write_reference` (logits memory-mapped, nothing of PyTorch loaded).

    Raises:
        ArtifactError: ``reference.json`` is missing (the folder is incomplete or not a reference),
            or a file's shape disagrees with it.
        IntegrityError: a file listed in the folder's ``manifest.json`` is missing, truncated or
            changed (:func:`qwen_onnx.store.manifest.verify_manifest`).
    """
    folder = Path(folder)
    index = folder / REFERENCE_JSON
    if not index.is_file():
        raise ArtifactError(
            f"{folder} has no {REFERENCE_JSON}: not a complete reference folder; write it with "
            "`qwen-onnx reference HF_DIR -o FOLDER` (the workflow's `reference` rule)"
        )
    verify_manifest(folder)
    meta = json.loads(index.read_text(encoding="utf-8"))
    try:
        windows = np.load(folder / WINDOWS_FILE)
        logits = np.load(folder / LOGITS_FILE, mmap_mode="r")
    except FileNotFoundError as exc:
        raise ArtifactError(f"reference folder {folder} lacks {Path(exc.filename).name}; rewrite it") from None
    expected = (meta["windows"], meta["window"] - 1)
    if windows.shape != (meta["windows"], meta["window"]) or list(logits.shape) != meta["logits_shape"] \
            or logits.shape[:2] != expected:
        raise ArtifactError(
            f"reference folder {folder}: windows {windows.shape} and logits {logits.shape} do not match "
            f"{REFERENCE_JSON} ({meta['windows']} windows of {meta['window']} tokens); rewrite it"
        )
    generation = meta.get("generation", [])
    return Reference(
        folder=folder, meta=meta, windows=windows, logits=logits,
        prompts=[g["prompt"] for g in generation],
        prompt_ids=[np.asarray(g["prompt_ids"], dtype=np.int64) for g in generation],
        generations=[list(g["pytorch_ids"]) for g in generation],
    )
