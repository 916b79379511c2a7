"""The ``qwen-onnx`` command line: :func:`main` parses (:mod:`.parser`) and runs a command (:mod:`.commands`);
bad input ends in one line on stderr and exit status 2."""

from qwen_onnx.cli.parser import build_parser, main

__all__ = ["build_parser", "main"]
