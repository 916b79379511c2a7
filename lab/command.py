"""The lab tools' command line: parse, run, print the result as JSON; a QwenOnnxError is one line on
stderr and exit status 2, as the ``qwen-onnx`` command does."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any, Callable

from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.quiet import quiet_third_party


def run_command(name: str, parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], Any],
                argv: list[str] | None = None) -> int:
    """``run(parser.parse_args(argv))``; 0, or 2 with ``name: message`` on stderr."""
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    quiet_third_party()
    try:
        result = run(args)
    except QwenOnnxError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    if result is not None:
        print(json.dumps(result, indent=2, default=str))
    return 0
