"""The sandbox that runs generated code: a hang, a crash, a fork, a socket, a stray file or an early exit fails
that program and nothing else, and leaves nothing behind."""

from __future__ import annotations

import os
import socket

import pytest

from qwen_onnx.errors import OptionError
from qwen_onnx.measure.sandbox import Limits, network_isolation, run_program

QUICK = Limits(timeout_s=2.0, memory_mb=512)


def test_a_program_that_runs_to_its_end_passes_and_leaves_no_scratch_folder(tmp_path):
    outcome = run_program("import os\nprint(os.getcwd())\nopen('left-behind.txt', 'w').write('x')\n", QUICK,
                          scratch_dir=tmp_path)
    assert (outcome.outcome, outcome.reason, outcome.returncode) == ("passed", "", 0)
    cwd = outcome.stdout.split()[0]  # the end mark comes after the flushed output
    assert cwd.startswith(str(tmp_path / "qwen-onnx-sandbox-"))
    assert not os.path.exists(cwd) and list(tmp_path.iterdir()) == []  # the file written there went with it


def test_a_hanging_program_is_killed_at_the_wall_time_limit_with_its_process_group(tmp_path):
    outcome = run_program("import os\nprint(os.getpid(), flush=True)\nwhile True:\n    pass\n", QUICK,
                          scratch_dir=tmp_path)
    assert (outcome.outcome, outcome.reason, outcome.returncode) == ("timeout", "still running after 2 s (wall time)",
                                                                    None)
    pid = int(outcome.stdout.split()[0])
    with pytest.raises(ProcessLookupError):  # the session's group (the program was its leader) is gone
        os.killpg(pid, 0)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("source, signal_name", [
    ("import os\nos.abort()\n", "SIGABRT"),
    ("import ctypes\nctypes.string_at(0)\n", "SIGSEGV"),  # a read of address 0
])
def test_a_crashing_program_is_recorded_as_crashed(source, signal_name, tmp_path):
    outcome = run_program(source, QUICK, scratch_dir=tmp_path)
    assert (outcome.outcome, outcome.reason) == ("crashed", f"killed by {signal_name}")
    assert list(tmp_path.iterdir()) == []  # no core file either (RLIMIT_CORE 0, and the folder is gone)


def test_a_fork_bomb_fails_on_its_first_fork_and_process_creation_is_refused():
    outcome = run_program("import os\nwhile True:\n    os.fork()\n", QUICK)
    assert (outcome.outcome, outcome.reason) == ("failed", "PermissionError: os.fork is refused in the sandbox")
    for call, name in (("import subprocess\nsubprocess.run(['true'])", "subprocess.run"),
                       ("import os\nos.system('true')", "os.system"),
                       ("import os\nos.kill(1, 9)", "os.kill"),
                       ("import os\nos.remove('/etc/hostname')", "os.remove")):
        assert run_program(call, QUICK).reason == f"PermissionError: {name} is refused in the sandbox", name
    assert run_program("import multiprocessing\n", QUICK).reason.startswith("ModuleNotFoundError: import of "
                                                                           "multiprocessing halted")


def test_a_socket_cannot_reach_even_a_listening_port_of_this_machine():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        refused = run_program(f"import socket\nsocket.create_connection(('127.0.0.1', {port}))\n", QUICK)
        assert refused.outcome == "failed"
        assert refused.reason == "PermissionError: socket.create_connection is refused in the sandbox"
        raw = run_program(f"import _socket\ns = _socket.socket()\ns.connect(('127.0.0.1', {port}))\n", QUICK)
    if network_isolation() == "namespace":  # past the refused functions, the namespace has no network at all
        assert raw.outcome == "failed" and raw.reason.startswith(("OSError: [Errno 101]", "ConnectionRefusedError"))


def test_an_early_exit_a_memory_flood_and_an_output_flood_fail():
    early = run_program("import sys\nsys.exit(0)\n", QUICK)
    assert (early.outcome, early.reason) == ("failed", "exited with status 0 before the tests' end")
    assert run_program("raise SystemExit(3)\n", QUICK).reason == "exit status 3"
    memory = run_program("x = [0] * 10**10\n", QUICK)
    assert (memory.outcome, memory.reason) == ("failed", "MemoryError")
    flood = run_program("print('x' * 10**8)\n", Limits(timeout_s=5.0, file_mb=1))
    assert flood.outcome == "failed" and flood.reason == "OSError: [Errno 27] File too large"
    assert len(flood.stdout) <= 1000  # only the end of the output is kept


def test_the_child_gets_none_of_the_jobs_environment(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    outcome = run_program("import os, sys\nprint(sorted(os.environ), 'site' in sys.modules)\n", QUICK)
    assert outcome.stdout.splitlines()[0] == "['HOME', 'LANG', 'LC_ALL', 'PATH', 'TMPDIR'] False"


def test_limits_out_of_range_are_refused_in_one_line():
    with pytest.raises(OptionError, match="^task_accuracy memory_mb 32 is out of range; give an integer of at least"):
        run_program("pass", Limits(memory_mb=32))
    with pytest.raises(OptionError, match="must be positive"):
        run_program("pass", Limits(timeout_s=0))
