"""Command-line options generated from a settings declaration: the timing options of the ``latency`` and
``peers`` commands from :class:`qwen_onnx.settings.timing.TimingSettings`'s fields, and read back into one."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Mapping, Sequence

from qwen_onnx.settings.timing import TimingSettings

#: The :class:`TimingSettings` fields the ``latency`` command takes (``rounds`` is the sitting's).
LATENCY_OPTIONS = ("prompt_lengths", "decode_prompt_tokens", "new_tokens", "warmup", "warmup_scope", "repeats",
                   "threads", "provider", "profile")
#: The :class:`TimingSettings` fields the ``peers`` command takes (the sitting runs every row on the CPU, unprofiled).
PEERS_OPTIONS = ("rounds", "prompt_lengths", "decode_prompt_tokens", "new_tokens", "warmup", "warmup_scope", "repeats",
                 "threads", "load_watch_s")


def add_timing_options(p: argparse.ArgumentParser, names: Sequence[str],
                       aliases: Mapping[str, Sequence[str]] | None = None) -> None:
    """One option per :class:`TimingSettings` field in ``names``, generated from the field's declaration:
    ``--field-name`` (and the field's ``aliases``), its type (a list of integers for ``prompt_lengths``,
    ``--x``/``--no-x`` for a boolean), its default, its ``choices`` and its doc as the help.

    Raises:
        KeyError: a name that is no field of :class:`TimingSettings`.
    """
    types = typing.get_type_hints(TimingSettings)
    declared = {f.name: f for f in dataclasses.fields(TimingSettings)}
    for name in names:
        f = declared[name]
        flags = [f"--{name.replace('_', '-')}", *(aliases or {}).get(name, ())]
        options: dict[str, typing.Any] = {"default": f.default,
                                          "help": f.metadata["doc"].replace("%", "%%") + " (default: %(default)s)"}
        kind = types[name]
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(kind) is tuple:
            options.update(type=typing.get_args(kind)[0], nargs="+", default=list(f.default))
        else:
            options.update(type=kind, choices=f.metadata.get("choices"))
        p.add_argument(*flags, **options)


def timing_of(args: argparse.Namespace) -> TimingSettings:
    """The :class:`TimingSettings` of a command's parsed arguments: the options :func:`add_timing_options` added,
    the other fields at their defaults.

    Raises:
        OptionError: a value out of its range (:meth:`TimingSettings.check`), named as its config key.
    """
    return TimingSettings(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TimingSettings)
                             if hasattr(args, f.name)})
