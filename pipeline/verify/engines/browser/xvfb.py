"""A virtual X display for browsers that have no headless mode (WebKitGTK's MiniBrowser: without a
display its WebDriver session never starts). Xvfb picks a free display number itself
(`-displayfd`), so builds side by side never race for one; it ends with the block."""

from __future__ import annotations

import os
import select
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from pipeline.errors import PackError

START_S = 15.0  # Xvfb writes its display number within a second here


def xvfb_executable() -> str | None:
    return shutil.which("Xvfb")


@contextmanager
def virtual_display() -> Iterator[tuple[str, subprocess.Popen]]:
    """(DISPLAY value, the Xvfb process) while the block runs; PackError when Xvfb does not start."""
    executable = xvfb_executable()
    if executable is None:
        raise PackError("Xvfb is not on PATH; install it: apt-get install xvfb")
    read_end, write_end = os.pipe()
    try:
        process = subprocess.Popen([executable, "-displayfd", str(write_end), "-screen", "0", "1280x800x24", "-nolisten", "tcp"],
                                   pass_fds=(write_end,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    finally:
        os.close(write_end)
    try:
        number = b""
        while not number.endswith(b"\n"):
            ready, _, _ = select.select([read_end], [], [], START_S)
            chunk = os.read(read_end, 16) if ready else b""
            if not chunk:
                raise PackError(f"Xvfb did not start within {START_S:.0f} s (exit status {process.poll()})")
            number += chunk
        yield f":{number.decode().strip()}", process
    finally:
        os.close(read_end)
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
