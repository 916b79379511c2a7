"""Decode-shaped MatMulNBits time per precision option on the CPU at hand, as a table: the command line of
:func:`qwen_onnx.measure.kernels.compare_kernels` (the precision search's time cost measures the same way,
:func:`qwen_onnx.measure.kernels.kernel_costs`).
"""

from __future__ import annotations

import argparse
import sys

from lab.command import run_command
from qwen_onnx.measure.kernels import OPTIONS, compare_kernels


def parse_option(text: str) -> tuple[int, int, int]:
    """``"4/32"`` or ``"4/32/0"`` -> (bits, block, accuracy_level); the level defaults to 4."""
    parts = text.split("/")
    if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not BITS/BLOCK[/LEVEL], e.g. 4/32 or 4/32/0")
    bits, block, level = (*map(int, parts), 4)[:3]
    return bits, block, level


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="decode-shaped MatMulNBits time per precision option, measured in turns")
    p.add_argument("options", nargs="*", type=parse_option, default=list(OPTIONS),
                   help="BITS/BLOCK[/LEVEL] options, the first the baseline (default: %(default)s)")
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--intermediate", type=int, default=4864)
    p.add_argument("--kv-width", type=int, default=128, help="key (= value) projection width: kv heads x head size")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", type=int, default=40)
    p.add_argument("-o", "--output", default=None)
    return p


def run(a: argparse.Namespace) -> dict:
    """The command: :func:`compare_kernels` with the parsed options."""
    return compare_kernels(a.options, hidden=a.hidden, intermediate=a.intermediate, kv_width=a.kv_width,
                           layers=a.layers, threads=a.threads, rounds=a.rounds, runs=a.runs, output=a.output)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m lab.kernels --help`` from the repository root; 2 and one line on bad input."""
    return run_command("lab.kernels", build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
