"""Errors that end a command with a one-line message and an exit code.

`PackError` is bad input or environment (exit 2): its message names the file, key or node and
says what to do. `Terminated` is SIGTERM turned into the same clean-up path as Ctrl-C
(KeyboardInterrupt). Anything else escaping a command is a bug and shows a traceback.
"""

from __future__ import annotations

import signal
import sys

from pipeline.urls import mask_urls


class PackError(Exception):
    """Bad input or environment: one line, names the culprit and the fix; exit code 2."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, so every `finally`/`except BaseException` clean-up
    that Ctrl-C runs runs for it too."""


# Shell convention: 128 + the signal number.
EXIT_SIGINT = 128 + signal.SIGINT
EXIT_SIGTERM = 128 + signal.SIGTERM


def interrupt_exit_code(error: KeyboardInterrupt) -> int:
    return EXIT_SIGTERM if isinstance(error, Terminated) else EXIT_SIGINT


def raise_terminated(signum: int, frame) -> None:  # noqa: ARG001 - signal handler signature
    raise Terminated()


def warn(message: str) -> None:
    """One line on stderr for something pack did on the user's behalf (stdout stays clean for --json)."""
    print(f"warning: {mask_urls(message)}", file=sys.stderr, flush=True)
