"""llama.cpp (through llama-cpp-python) on a GGUF file, batch 1: the peer's logits for the accuracy stage.

:class:`LlamaCppCausalLM` gives ``llama_cpp.Llama`` the two calls the accuracy loop and the parity
checks make of :class:`qwen_onnx.run.runtime.OnnxCausalLM`: ``forward`` (a prefill of a window, or
decode steps after it, each position's logits read from ``Llama.scores`` with ``logits_all``) and
greedy ``generate``. The ids are the reference's own token ids, so llama.cpp's tokenizer is not
used and both sides score the same tokens.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from qwen_onnx.errors import ArtifactError, ExportError, OptionError


def is_gguf(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a GGUF file (by its 4-byte magic ``GGUF``, not its name)."""
    path = Path(path)
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


class LlamaCppCausalLM:
    """A GGUF file run by llama-cpp-python, batch 1, with the KV cache held between calls.

    Args:
        gguf: the GGUF file.
        context: the most tokens a sequence holds (prompt plus generated), llama.cpp's ``n_ctx``.
        threads: llama.cpp's ``n_threads`` and ``n_threads_batch`` (CPU threads).

    Raises:
        ArtifactError: ``gguf`` is not a GGUF file.
        ExportError: llama-cpp-python is not installed (``envs/setup.sh --peers`` installs it).
        OptionError: ``context`` or ``threads`` below 1.
    """

    def __init__(self, gguf: str | os.PathLike, context: int, threads: int = 2):
        if not is_gguf(gguf):
            raise ArtifactError(f"{gguf} is not a GGUF file (no GGUF magic); give the peer's .gguf")
        if context < 1 or threads < 1:
            raise OptionError(f"context {context} and threads {threads} must be at least 1")
        try:
            import llama_cpp
        except ImportError as exc:
            raise ExportError(f"llama-cpp-python is not installed ({exc}); envs/setup.sh --peers installs it") from exc
        self.path = Path(gguf)
        self.context = context
        self.llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=context, n_batch=min(512, context), n_threads=threads,
                                   n_threads_batch=threads, logits_all=True, verbose=False)
        self.vocab = int(self.llm.n_vocab())

    @property
    def position(self) -> int:
        """Tokens in the KV cache."""
        return int(self.llm.n_tokens)

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray | None = None,
                past: int | None = None) -> tuple[np.ndarray, int]:
        """Without ``past``, a prefill of ``input_ids`` int64 [1, sequence] from an empty cache; with it
        (the position the previous call returned), the tokens appended after it. ``attention_mask`` is
        all ones (batch 1, no padding) and not used.

        Returns:
            ``logits`` float32 [1, sequence, vocab] and the next position.

        Raises:
            OptionError: a batch of more than one sequence, or more tokens than ``context``.
        """
        ids = np.asarray(input_ids)
        if ids.ndim != 2 or ids.shape[0] != 1:
            raise OptionError(f"llama.cpp runs batch 1 here; got input_ids of shape {list(ids.shape)}")
        if past is None:
            self.llm.reset()
        start = self.position
        if start + ids.shape[1] > self.context:
            raise OptionError(f"{start + ids.shape[1]} tokens do not fit llama.cpp's context of {self.context}")
        self.llm.eval([int(t) for t in ids[0]])
        logits = np.array(self.llm.scores[start:self.position], dtype=np.float32)
        return logits[None], self.position

    def generate(self, prompt_ids: np.ndarray, max_new_tokens: int, *, eos_ids: Sequence[int] = (),
                 loop: str = "bound", stop: Callable[[list[int]], bool] | None = None) -> tuple[np.ndarray, None]:
        """Greedy generation after a prefill of ``prompt_ids``: up to ``max_new_tokens`` argmax tokens,
        stopping at a token of ``eos_ids`` (included), a full context, or when ``stop`` (called with the new
        ids after each token) returns True (``loop`` has no meaning here).

        Returns:
            The generated ids int64 [generated] and None (no prefill time measured).
        """
        logits, _ = self.forward(np.asarray(prompt_ids).reshape(1, -1))
        last = logits[0, -1]
        eos, new = set(int(e) for e in eos_ids), []
        while len(new) < max_new_tokens:
            token = int(np.argmax(last))
            new.append(token)
            if token in eos or self.position >= self.context or (stop is not None and stop(new)):
                break
            last = self.forward(np.asarray([[token]]), past=self.position)[0][0, -1]
        return np.asarray(new, dtype=np.int64), None
