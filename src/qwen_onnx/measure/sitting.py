"""The timing sitting's protocol: each measurement in a fresh child process, rounds interleaved across
variants, a crashed child named by its signal.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
from typing import Any, Callable, Iterator, Sequence

from qwen_onnx.quiet import quiet_third_party
from qwen_onnx.run.machine import load_between, load_snapshot, measure_load
from qwen_onnx.settings.defaults import LATENCY

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _main_script_hidden() -> Iterator[None]:
    """Keep ``spawn`` children from re-running the parent's main script.

    A ``spawn`` child imports the parent's ``__main__`` from its ``__file__`` when the parent was
    started as a script (Snakemake's ``script:`` wrappers are), which would run the wrapper again
    in every child. The measured functions live in this package, so the children do not need it.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None) if getattr(main, "__spec__", None) is None else None
    if path is None:
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


def exit_cause(returncode: int | None) -> str:
    """A child's exit status in words: ``killed by SIGILL (illegal instruction: built for an
    instruction set this CPU lacks)`` for -4, ``exit status 1`` for 1 (``subprocess``'s and
    ``multiprocessing``'s convention: minus the signal number for a child killed by a signal)."""
    import signal

    if returncode is None or returncode >= 0:
        return f"exit status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    causes = {"SIGILL": "illegal instruction: built for an instruction set this CPU lacks",
              "SIGSEGV": "segmentation fault", "SIGBUS": "bus error",
              "SIGKILL": "killed from outside, often the kernel's out-of-memory killer",
              "SIGABRT": "aborted by the library"}
    return f"killed by {name}" + (f" ({causes[name]})" if name in causes else "")


class ChildCrashed(RuntimeError):
    """A measuring child process died without returning (a signal or ``os._exit``)."""


def _child_main(connection, function, args, kwargs) -> None:

    quiet_third_party()
    try:
        result = ("ok", function(*args, **kwargs))
    except BaseException as exc:  # noqa: BLE001 - sent to the parent, which raises it
        result = ("error", f"{type(exc).__name__}: {exc}")
    connection.send(result)
    connection.close()


def run_in_child(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)`` in a new ``spawn`` process; its return value.

    Raises:
        ChildCrashed: the child died by a signal or exited without a result (the message says
            which signal and its usual cause, :func:`exit_cause`).
        RuntimeError: the child's call raised (its type and message).
    """
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    with _main_script_hidden():
        child = context.Process(target=_child_main, args=(send, function, args, kwargs))
        child.start()
    send.close()
    try:
        status, value = receive.recv()
    except EOFError:
        child.join()
        raise ChildCrashed(exit_cause(child.exitcode)) from None
    finally:
        receive.close()
    child.join()
    if status == "error":
        raise RuntimeError(value)
    return value


def interleaved_rounds(
    jobs: Sequence[tuple[str, Callable[..., Any], tuple]],
    rounds: int,
    failures: dict[int, str] | None = None,
    loads: list[list[dict[str, Any]]] | None = None,
    load_watch_s: float = LATENCY["load_watch_s"],
) -> list[list[Any]]:
    """Run each job once per round, every call in a fresh process, the order rotating each round.

    Round ``r`` runs the jobs in the order ``r, r + 1, ...`` (modulo their count), so a slow spell
    of a shared machine falls on every job alike; each call runs alone in a new ``spawn`` process,
    so no measurement shares a process (allocator, thread pools, caches) with another.

    The other load on the machine is measured for every call (:func:`qwen_onnx.run.machine.measure_load`
    for ``load_watch_s`` seconds before it, :func:`qwen_onnx.run.machine.load_between` while it runs). A function with a
    ``cores_busy`` parameter is told whether the cores were busy just before its call (the ONNX
    rows then turn intra-op spinning off, :data:`qwen_onnx.run.session.SHARED_CORES_SETTINGS`).

    Args:
        jobs: ``(label, function, args)``; ``function(*args)`` runs in the child and returns a
            picklable figure. Functions must be importable (module level).
        rounds: how many times each job runs.
        failures: if given, a job whose call raises (a child killed by a signal included, with the
            signal's name, :func:`exit_cause`) is dropped from later rounds and its error recorded
            here under its index, instead of the error propagating.
        loads: if given, filled per job (in the given order) with one record per completed call:
            ``round`` (1-based), ``before`` and ``during`` (:func:`qwen_onnx.run.machine.load_between`),
            ``busy`` (either was) and ``cores_busy_setting`` (what the function was told).
        load_watch_s: seconds of :func:`qwen_onnx.run.machine.measure_load` before each call (``latency.load_watch_s``).

    Returns:
        Per job (in the given order) its figures, one per round it completed.
    """
    per_round: list[list[Any]] = [[] for _ in jobs]
    if loads is not None:
        loads[:] = [[] for _ in jobs]
    for r in range(rounds):
        for k in range(len(jobs)):
            i = (r + k) % len(jobs)
            if failures is not None and i in failures:
                continue
            label, function, args = jobs[i]
            before = measure_load(load_watch_s)
            kwargs = {"cores_busy": before["busy"]} if "cores_busy" in inspect.signature(function).parameters else {}
            start = load_snapshot()
            try:
                figures = run_in_child(function, *args, **kwargs)
            except (ChildCrashed, RuntimeError) as exc:
                if failures is None:
                    raise
                failures[i] = f"{type(exc).__name__}: {exc}" if not isinstance(exc, ChildCrashed) else f"the process was {exc}"
                log.warning("round %d: %s failed: %s", r + 1, label, failures[i])
                continue
            during = load_between(start, load_snapshot())
            per_round[i].append(figures)
            if loads is not None:
                loads[i].append({"round": r + 1, "before": before, "during": during,
                                 "busy": before["busy"] or during["busy"], "cores_busy_setting": kwargs.get("cores_busy")})
            log.info("round %d: %s done%s", r + 1, label,
                     f" beside other load ({during['others_cores']} cores, steal {during['steal_pct']}%)"
                     if before["busy"] or during["busy"] else "")
    return per_round
