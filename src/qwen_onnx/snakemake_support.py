"""Helpers for the thin ``workflow/scripts`` wrappers: logging into the rule's log file."""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import sys
import warnings
from typing import Iterator

from .artifacts import permission_message
from .errors import QwenOnnxError


@contextlib.contextmanager
def logged(snakemake) -> Iterator[None]:
    """Send logging, warnings and the process's stdout/stderr (C libraries included) to ``snakemake.log[0]``.

    The log ends with the job's peak RSS (``getrusage`` high-water mark).

    A :class:`~qwen_onnx.errors.QwenOnnxError` (or a ``PermissionError``, see
    :func:`~qwen_onnx.artifacts.permission_message`) is written to the log and, as one line, to the
    original stderr (so the Snakemake console shows it), then the job exits with status 1.
    """
    log_path = snakemake.log[0]
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    saved_stderr = os.dup(2)
    with open(log_path, "w", encoding="utf-8") as handle:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(handle.fileno(), 1)
        os.dup2(handle.fileno(), 2)
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True,
            handlers=[logging.StreamHandler(sys.stderr)],
        )
        logging.captureWarnings(True)
        warnings.simplefilter("default")
        try:
            yield
        except (QwenOnnxError, PermissionError) as exc:
            message = permission_message(exc) if isinstance(exc, PermissionError) else str(exc)
            logging.getLogger("qwen_onnx").error("%s", message)
            sys.stderr.flush()
            os.write(saved_stderr, f"qwen-onnx error in rule {snakemake.rule}: {message}\n".encode())
            sys.exit(1)
        finally:
            # The kernel's high-water mark, exact where the benchmark file's periodic samples can
            # miss a short peak (getrusage ru_maxrss is in KiB on Linux).
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
            logging.getLogger("qwen_onnx").info(
                "peak RSS of rule %s: %.0f MiB (largest child process: %.0f MiB)", snakemake.rule, peak, children
            )
            sys.stdout.flush()
            sys.stderr.flush()
