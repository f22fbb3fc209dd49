"""Errors that end a command with a one-line message and an exit code.

`PackError` is bad input or environment (exit 2): its message names the file, key or node and
says what to do. An OSError the machine causes (a full disk, a quota, no permission, a read-only
file system) becomes one too, naming the folder as the user gave it (`environment_error`). `Terminated` is SIGTERM turned into the same clean-up path as Ctrl-C
(KeyboardInterrupt). Anything else escaping a command is a bug and shows a traceback.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from pipeline.urls import mask_urls


class PackError(Exception):
    """Bad input or environment: one line, names the culprit and the fix; exit code 2."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


# errno -> what happened, for the errors the machine causes rather than the input or pack
_ENVIRONMENT_ERRNOS = {
    errno.ENOSPC: "no space left on its file system",
    errno.EDQUOT: "disk quota exceeded",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "read-only file system",
}
_FULL = (errno.ENOSPC, errno.EDQUOT)


def is_environment_error(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in _ENVIRONMENT_ERRNOS


_ERRNO_IN_MESSAGE = re.compile(r"\[Errno (\d+)\] ([^:'\"]+)")


def raise_child_environment_error(message: str, folder: Path) -> None:
    """A child process's last error line, when it is an environment error on its scratch files in
    `folder` (a full temporary folder), raised here as that OSError naming `folder`: it then ends
    as one line about the folder (exit 2), not as a failure of the model the child ran."""
    found = _ERRNO_IN_MESSAGE.search(message)
    if found and int(found[1]) in _ENVIRONMENT_ERRNOS:
        raise OSError(int(found[1]), found[2].strip(), str(folder))


def error_path(error: OSError) -> Path | None:
    """The file an OSError is about, absolute: for a copy, the destination."""
    named = error.filename2 if error.filename2 is not None else error.filename
    return Path(os.path.abspath(os.fsdecode(named))) if isinstance(named, (str, bytes, os.PathLike)) else None


def environment_error(error: OSError, folders: dict[str, tuple[Path, str]]) -> PackError:
    """One line for an environment OSError. `folders`: how the user names each folder pack writes
    to (`--out dist`, `PACK_CACHE_DIR=...`) -> (the folder, how to point pack elsewhere); the error is told by the
    innermost one holding the file it names (for a copy, the destination). A full disk says how much
    was free and how much this build had written there (`written_bytes`, set by pipeline/cache.py)."""
    path = error_path(error)
    role, folder, fix = None, path.parent if path else None, "write elsewhere"
    if path is not None:
        holders = [(name, Path(os.path.abspath(where)), how) for name, (where, how) in folders.items()]
        holders = [h for h in holders if path == h[1] or h[1] in path.parents]
        if holders:
            role, folder, fix = max(holders, key=lambda h: len(h[1].parts))
    what = _ENVIRONMENT_ERRNOS[error.errno]
    where = role or str(path or "a file")  # the folder as the user named it, not a staging file in it
    if error.errno in _FULL:
        detail = _room(folder)
        written = getattr(error, "written_bytes", None)
        if written:
            detail += f"; this build had written {_size(written)} there when it filled and needs more"
        return PackError(f"{where}: {what} ({detail}); free space there or {fix}")
    return PackError(f"{where}: {what}; make it writable or {fix}")


def _room(folder: Path | None) -> str:
    probe = folder
    while probe is not None and not probe.exists() and probe.parent != probe:
        probe = probe.parent
    try:
        usage = shutil.disk_usage(probe) if probe is not None else None
    except OSError:
        usage = None
    return f"{_size(usage.free)} free of {_size(usage.total)} once its partial files were removed" if usage else "free space unknown"


def _size(count: float) -> str:
    if count < 1024:
        return f"{count:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        count /= 1024
        if count < 1024 or unit == "GiB":
            return f"{count:.1f} {unit}"


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


@contextmanager
def stops_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block is done, then are raised as they would have been.
    A signal mask cannot hold them in a process with threads: the kernel hands the signal to a
    thread that does not block it, and Python raises it in the main thread all the same. Python
    runs its handlers in the main thread only, so handlers that note the signal do hold it; in
    another thread there is nothing to hold (stops are never raised there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, frame: came.append(signum)) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if came:
            signal.raise_signal(came[0])  # to the handler it would have met: raised here, after the block


# The warnings about a build's inputs, noted while a build runs (recorded_warnings): a stored
# package that a later build reuses says them again, as building it would.
_recorded: list[list[str]] = []


def warn(message: str, local: bool = False) -> None:
    """One line on stderr for something pack did on the user's behalf (stdout stays clean for --json).
    `local`: about this machine (its caches), not the build's inputs: not said again on reuse."""
    line = f"warning: {mask_urls(message)}"
    print(line, file=sys.stderr, flush=True)
    if not local:
        for lines in _recorded:
            lines.append(line)


@contextmanager
def recorded_warnings() -> Iterator[list[str]]:
    """The warning lines (not `local` ones) said inside the block."""
    lines: list[str] = []
    _recorded.append(lines)
    try:
        yield lines
    finally:
        _recorded.remove(lines)


def say_again(lines: list[str]) -> None:
    """Warning lines a reused build recorded, said as building would have said them."""
    for line in lines:
        print(line, file=sys.stderr, flush=True)
