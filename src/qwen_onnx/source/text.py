"""Text shipped with the package (calibration and evaluation) and its split into token windows."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

import numpy as np

from qwen_onnx.errors import TextError

#: Names of the texts shipped in ``qwen_onnx/data`` (see ``data/SOURCES.md`` for their origin).
CALIBRATION_TEXT = "calibration.txt"
EVALUATION_TEXT = "evaluation.txt"


def shipped_text(name: str) -> Path:
    """Path of a text shipped in ``qwen_onnx/data``."""
    return Path(str(resources.files("qwen_onnx") / "data" / name))


#: transformers 4.57.3 to 4.x warns "incorrect regex pattern ... set `fix_mistral_regex=True`" on
#: loading the tokenizer of any local folder whose config.json was written by those versions
#: (``PreTrainedTokenizerBase._patch_mistral_regex`` looks at ``transformers_version`` and
#: ``model_type`` in config.json, not at the tokenizer): a false alarm for Qwen, whose pre-tokenizer
#: regex is its own, and following it would change Qwen's tokenization ("HelloWorld" becomes two
#: tokens instead of one with Qwen2.5-Coder's tokenizer). The flag given as False silences the
#: check and keeps the tokenizer as saved.
TOKENIZER_KWARGS = {"fix_mistral_regex": False}


def load_tokenizer(folder: str | os.PathLike, **kwargs):
    """``AutoTokenizer.from_pretrained(folder)`` without transformers' false Mistral-regex warning
    (see :data:`TOKENIZER_KWARGS`); ``kwargs`` go to ``from_pretrained`` (e.g. ``gguf_file``)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, **{**TOKENIZER_KWARGS, **kwargs})


class TokenEncoder:
    """A folder's ``tokenizer.json`` run by the ``tokenizers`` library itself, for the jobs that only turn a text
    into token ids (the profile, latency, the sitting's prompt, calibration windows): called as a Hugging Face tokenizer is, ``encoder(text,
    add_special_tokens=False)["input_ids"]``, with the same ids, since transformers' fast tokenizers wrap this
    same object (``PreTrainedTokenizerFast._tokenizer``), without importing transformers and torch (5 s of CPU a
    job). Truncation and padding are off, as transformers' call leaves them by default."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(os.fspath(path))
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids}


def load_token_encoder(folder: str | os.PathLike):
    """The folder's :class:`TokenEncoder` when it has a ``tokenizer.json``, else :func:`load_tokenizer`'s."""
    path = Path(folder) / "tokenizer.json"
    return TokenEncoder(path) if path.is_file() else load_tokenizer(folder)


def read_text(path: str | os.PathLike) -> str:
    """Read a UTF-8 text file.

    Raises:
        TextError: the file is missing or empty.
    """
    path = Path(path)
    if not path.is_file():
        raise TextError(f"text file {path} does not exist; point the config at an existing UTF-8 file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TextError(
            f"text file {path} is not UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
            f"convert it, e.g. `iconv -f GB18030 -t UTF-8 {path.name} > {path.stem}.utf8{path.suffix}`"
        ) from None
    if not text.strip():
        raise TextError(f"text file {path} is empty")
    return text


def evenly_spaced(count: int, total: int) -> list[int]:
    """``count`` indices spread evenly over ``0 … total - 1``: ``floor(i * total / count)`` for
    ``i = 0 … count - 1`` (every index when ``count`` is ``total``), so that a subset samples the whole of
    a text or set (mixed sections, problems that grow harder) rather than one end of it.

    Raises:
        ValueError: ``count`` is not within ``1 … total``.
    """
    if not 1 <= count <= total:
        raise ValueError(f"{count} of {total} indices: the count must be within 1 ... {total}")
    return [i * total // count for i in range(count)]


def token_windows(tokenizer, path: str | os.PathLike, length: int, count: int | None = None) -> np.ndarray:
    """Split the tokenized text at ``path`` into consecutive non-overlapping windows.

    Args:
        tokenizer: a Hugging Face tokenizer, or the :class:`TokenEncoder` of its tokenizer.json.
        path: UTF-8 text file.
        length: tokens per window.
        count: windows wanted; None for as many as the text holds.

    Returns:
        int64 [windows, length].

    Raises:
        TextError: the text holds fewer than ``count`` windows (or none) of ``length`` tokens.
    """
    ids = tokenizer(read_text(path), add_special_tokens=False)["input_ids"]
    available = len(ids) // length
    wanted = available if count is None else count
    if available == 0 or wanted > available:
        raise TextError(
            f"{path} has {len(ids)} tokens: {available} window(s) of {length} tokens, {wanted or 1} requested; "
            "lower the sample count or sequence length, or use a longer text"
        )
    return np.asarray(ids[: wanted * length], dtype=np.int64).reshape(wanted, length)


def prompt_tokens(tokenizer, text_path: str | os.PathLike, length: int) -> np.ndarray:
    """The first ``length`` tokens of the text: int64 [length].

    Raises:
        TextError: the text is shorter than ``length`` tokens (a ValueError too).
    """
    ids = tokenizer(read_text(text_path), add_special_tokens=False)["input_ids"]
    if len(ids) < length:
        raise TextError(f"{text_path} has {len(ids)} tokens, fewer than the {length} a prompt needs; "
                        "use a longer text or shorter prompts")
    return np.asarray(ids[:length], dtype=np.int64)
