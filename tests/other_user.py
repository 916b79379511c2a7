"""Running a command as another user (uid 65534, ``nobody``) through util-linux's ``setpriv``, for tests of
folders this user may not read or write."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

#: The prefix that runs a command as uid/gid 65534 with no supplementary groups.
NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]


def nobody_runs_qwen_onnx(env) -> bool:
    """Whether ``NOBODY`` can run this interpreter and import qwen_onnx (root and setpriv needed)."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        return False
    probe = subprocess.run([*NOBODY, sys.executable, "-c", "import qwen_onnx.cli"], capture_output=True, env=env)
    return probe.returncode == 0
