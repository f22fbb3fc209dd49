"""Progress on a terminal, silence under --json or when stderr is not a terminal.

One `Progress` object is passed down a command; long steps call `task()` for a bar or `note()` for a
status line. All output goes to stderr so stdout stays clean for --json.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Iterator


def _human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


class Task:
    """A bar for one long step; `advance(n)` adds done units, `total` may be None."""

    def __init__(self, progress: "Progress", label: str, total: float | None, unit: str):
        self._progress = progress
        self.label = label
        self.total = total
        self.unit = unit
        self.done = 0.0
        self._last_draw = 0.0

    def advance(self, n: float = 1) -> None:
        self.done += n
        now = time.monotonic()
        if now - self._last_draw > 0.1:
            self._last_draw = now
            self._progress._draw(self)

    def _text(self) -> str:
        fmt = _human_bytes if self.unit == "bytes" else (lambda v: f"{v:.0f}")
        if self.total:
            pct = 100 * self.done / self.total
            width = 24
            filled = int(width * min(self.done / self.total, 1))
            return f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {pct:5.1f}% {fmt(self.done)}/{fmt(self.total)}"
        return f"{self.label} {fmt(self.done)}"


class Progress:
    """Writes to stderr when `enabled`; `Progress.quiet()` is the --json / non-tty form."""

    def __init__(self, enabled: bool | None = None, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled

    @classmethod
    def quiet(cls) -> "Progress":
        return cls(enabled=False)

    def note(self, message: str) -> None:
        if self.enabled:
            print(message, file=self.stream, flush=True)

    @contextmanager
    def task(self, label: str, total: float | None = None, unit: str = "items") -> Iterator[Task]:
        task = Task(self, label, total, unit)
        self._draw(task)
        try:
            yield task
        finally:
            if self.enabled:
                self.stream.write("\r\x1b[2K" + task._text() + "\n")
                self.stream.flush()

    def _draw(self, task: Task) -> None:
        if self.enabled:
            self.stream.write("\r\x1b[2K" + task._text())
            self.stream.flush()
