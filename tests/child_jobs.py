"""Module-level functions for tests that run them in ``spawn`` children (they must be importable)."""

import os
import signal


def square(x: int) -> int:
    return x * x


def die_by_signal(number: int) -> None:
    os.kill(os.getpid(), number)


def raise_value_error(message: str) -> None:
    raise ValueError(message)


def told_busy(cores_busy: bool = False) -> dict:
    return {"decode_tok_s": 1.0, "cores_busy": cores_busy}


SIGILL = int(signal.SIGILL)
