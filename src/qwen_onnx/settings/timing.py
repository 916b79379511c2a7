"""The timing protocol's settings (the config's ``latency:`` section) as one typed, frozen object,
:class:`TimingSettings`, handed from the config or the command line to every measuring function.

Each field is declared once, here: its type, its default (:data:`qwen_onnx.settings.defaults.LATENCY`) and
its meaning with its unit (the field's ``doc``, and ``choices`` where only a few values are allowed). The
CLI's timing options are generated from these declarations (``qwen_onnx.cli.parser``), and
``tests/settings/test_timing.py`` checks the workflow's schema, ``config.yaml`` and the defaults table
against them, so a key added in one place only fails a test.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from qwen_onnx.errors import OptionError, QwenOnnxError
from qwen_onnx.settings.defaults import LATENCY
from qwen_onnx.settings.options import check_option

__all__ = ["WARMUP_SCOPES", "TimingSettings"]

#: Where :func:`qwen_onnx.measure.latency.timing_protocol`'s untimed runs go: before each prompt length's
#: prefills and the decode, or once per row before its first timed pass.
WARMUP_SCOPES = ("length", "row")


def _option(key: str, doc: str, **declared: Any) -> Any:
    """A field of :class:`TimingSettings`: its default from the defaults table, its ``doc`` (with its unit)
    and any other declaration (``choices``) in the field's metadata."""
    return field(default=LATENCY[key], metadata={"doc": doc, **declared})


#: The fields that count something (tokens, runs, rounds, threads), each checked against its range.
_COUNTS = ("decode_prompt_tokens", "new_tokens", "warmup", "repeats", "rounds", "threads")


@dataclass(frozen=True)
class TimingSettings:
    """How every runtime is timed (docs/timing.md): the same prompts, warm-up, repeats and threads for every
    row. Checked on construction; the field docs below are the declarations (units included).

    Raises:
        OptionError: on construction, a value out of its range or not of its kind, in one line naming the
            key and the values allowed (:meth:`check`).
    """

    prompt_lengths: tuple[int, ...] = _option(
        "prompt_lengths", "prompt lengths whose prefill is timed (median and p90), in tokens; each prompt is the "
                          "first tokens of the evaluation text")
    decode_prompt_tokens: int = _option(
        "decode_prompt_tokens", "prompt length before each decode run, in tokens; its prefill plus the argmax of "
                                "its last logits is the time to first token")
    new_tokens: int = _option(
        "new_tokens", "greedy tokens generated per decode run with the KV cache, in tokens (new_tokens - 1 timed "
                      "single-token steps; end-of-sequence ignored)")
    warmup: int = _option(
        "warmup", "untimed runs inside each measuring process before the timed ones, in runs (an untimed decode "
                  "is at most 16 tokens long)")
    warmup_scope: str = _option(
        "warmup_scope", "where the untimed runs go: before each prompt length's prefills and before the decode "
                        "(length, the protocol), or once per row before its first timed pass (row; its prefill "
                        "figures are not comparable, docs/timing.md)", choices=WARMUP_SCOPES)
    repeats: int = _option(
        "repeats", "timed runs inside each measuring process, in runs (their median is the process's figure)")
    rounds: int = _option(
        "rounds", "interleaved rounds of the timing sitting, in rounds (every figure is the median over them); "
                  "read by the sitting only")
    load_watch_s: float = _option(
        "load_watch_s", "seconds the sitting watches the machine's load before each measuring process (its "
                        "rounds beside other load are named in the report); read by the sitting only")
    threads: int = _option(
        "threads", "number of threads of every measured runtime (ONNX Runtime's intra-op threads, "
                   "torch.set_num_threads, llama.cpp's n_threads, LiteRT's num_threads, OpenVINO's "
                   "INFERENCE_NUM_THREADS)")
    provider: str = _option(
        "provider", "ONNX Runtime execution provider of `qwen-onnx latency` and of the profile stage (the "
                    "sitting runs every row on the CPU)")
    profile: bool = _option(
        "profile", "`qwen-onnx latency` only: also profile one prefill and 16 decode steps in a separate "
                   "ONNX Runtime session, kernel time per op type")

    def __post_init__(self) -> None:
        """:meth:`check`, then ``prompt_lengths`` kept as a tuple and whole numbers as ints (``8.0`` -> ``8``)."""
        if isinstance(self.prompt_lengths, list):
            object.__setattr__(self, "prompt_lengths", tuple(self.prompt_lengths))
        self.check()
        object.__setattr__(self, "prompt_lengths", tuple(int(n) for n in self.prompt_lengths))
        for name in _COUNTS:
            object.__setattr__(self, name, int(getattr(self, name)))

    def check(self) -> None:
        """Raises OptionError (a QwenOnnxError) in one line naming the key and what to give: a count out of its
        range (:data:`qwen_onnx.settings.options.RANGES`), no prompt length, an unknown ``warmup_scope``, a
        ``provider`` that is not a name, a ``profile`` that is not true or false."""
        if not isinstance(self.prompt_lengths, tuple):
            raise OptionError(f"prompt_lengths {self.prompt_lengths!r} is not a list; give prompt lengths in tokens, "
                              "e.g. [32, 128, 512]")
        if not self.prompt_lengths:
            raise OptionError("prompt_lengths is empty; give at least one prompt length in tokens, e.g. [32, 128, 512]")
        check_option("prompt_lengths", self.prompt_lengths)
        for name in _COUNTS:
            check_option(name, getattr(self, name))
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            if choices and getattr(self, f.name) not in choices:
                raise OptionError(f"{f.name} {getattr(self, f.name)!r} is unknown; give one of {', '.join(choices)}")
        if isinstance(self.load_watch_s, bool) or not isinstance(self.load_watch_s, (int, float)) or not (
                0 < self.load_watch_s <= 60):
            raise OptionError(f"load_watch_s {self.load_watch_s!r} is not a number of seconds in (0, 60]; give one "
                              "such as 1.0")
        if not isinstance(self.provider, str) or not self.provider:
            raise OptionError(f"provider {self.provider!r} is not an execution provider's name; give one such as "
                              "CPUExecutionProvider")
        if not isinstance(self.profile, bool):
            raise OptionError(f"profile {self.profile!r} is not true or false; give true or false")

    @classmethod
    def from_config(cls, section: Mapping[str, Any]) -> TimingSettings:
        """From the config's ``latency`` section (or a model's own, merged over it); keys left out keep
        their defaults.

        Raises:
            QwenOnnxError: a key that is no timing setting (named, with the keys known); OptionError for
                a bad value (:meth:`check`).
        """
        known = [f.name for f in dataclasses.fields(cls)]
        for key in section:
            if key not in known:
                raise QwenOnnxError(f"the latency section has no setting {key!r}; remove it, or use one of "
                                    f"{', '.join(known)}")
        return cls(**section)

    @property
    def longest_prompt(self) -> int:
        """The prompt tokens the protocol needs: the longest of ``prompt_lengths`` and ``decode_prompt_tokens``."""
        return max([*self.prompt_lengths, self.decode_prompt_tokens])

    def record(self) -> dict[str, Any]:
        """The protocol's settings as a result records them: ``prompt_lengths`` (a list), ``decode_prompt_tokens``,
        ``new_tokens``, ``threads``, ``warmup``, ``warmup_scope``, ``repeats``."""
        return {
            "prompt_lengths": list(self.prompt_lengths),
            "decode_prompt_tokens": self.decode_prompt_tokens,
            "new_tokens": self.new_tokens,
            "threads": self.threads,
            "warmup": self.warmup,
            "warmup_scope": self.warmup_scope,
            "repeats": self.repeats,
        }

