"""Helpers for the thin ``workflow/scripts`` wrappers: logging into the rule's log file, and the
OpenMP wait policy of jobs that share cores."""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import sys
import warnings
from typing import Iterator

from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.quiet import quiet_third_party
from qwen_onnx.settings.defaults import MEASURING_RULES
from qwen_onnx.store.artifacts import permission_message


def share_cores_politely(rule: str) -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` for a job that runs beside others (every rule but
    :data:`qwen_onnx.settings.defaults.MEASURING_RULES`).

    PyTorch's OpenMP runtime (libgomp) lets idle worker threads spin by default; with more
    runnable threads than cores (two torch jobs on 2 cores, or a torch job beside an onnxruntime
    one) the spinning threads take the cores the working ones need. Measured on the 2-core build
    machine with the embedded 0.5B, PyTorch greedy generation of 32 tokens (the ``reference``
    stage's loop) beside other jobs (load average 3-4), two interleaved rounds: 47.0 and 38.6 s
    with the default policy, 10.0 and 8.5 s with ``PASSIVE`` (4.5x). libgomp reads the variable
    when it is loaded, so this must run before ``torch`` is imported (the wrappers import it only
    inside the stage functions; ``tests/test_layout.py`` checks). A value set by the user wins.

    Returns:
        Whether the policy was set here.
    """
    if rule in MEASURING_RULES or "OMP_WAIT_POLICY" in os.environ:
        return False
    if "torch" in sys.modules:
        logging.getLogger("qwen_onnx").warning("torch was imported before the OpenMP wait policy was set")
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True


@contextlib.contextmanager
def logged(snakemake) -> Iterator[None]:
    """Send logging, warnings and the process's stdout/stderr (C libraries included) to ``snakemake.log[0]``.

    The log ends with the job's peak RSS (``getrusage`` high-water mark). Jobs that share cores get
    ``OMP_WAIT_POLICY=PASSIVE`` (:func:`share_cores_politely`).

    A :class:`~qwen_onnx.errors.QwenOnnxError` (or a ``PermissionError``, see
    :func:`~qwen_onnx.store.artifacts.permission_message`) is written to the log and, as one line, to the
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
        quiet_third_party()
        if share_cores_politely(snakemake.rule):
            logging.getLogger("qwen_onnx").info("OMP_WAIT_POLICY=PASSIVE: this job shares the cores")
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
