"""Progress on a terminal, silence under --json or when stderr is not a terminal.

One `Progress` object is passed down a command; long steps call `task()` for a bar or `note()` for a
status line. Bars are drawn by `rich` (rate and time left per bar, several bars at once, e.g.
parallel uploads); all output goes to stderr so stdout stays clean for --json. Every URL in a
line is masked (pipeline/urls.py).
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from typing import Iterator

from pipeline.urls import mask_urls


def _rich_bars(stream):  # -> (rich Console, rich Progress); rich is imported only to draw
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        ProgressColumn,
        TaskProgressColumn,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )
    from rich.progress import Progress as RichProgress
    from rich.text import Text

    class _AmountColumn(ProgressColumn):
        """Done/total in bytes (kB, MB…) for byte tasks, as a count for the others."""

        def __init__(self) -> None:
            super().__init__()
            self._bytes, self._count = DownloadColumn(), MofNCompleteColumn()

        def render(self, task) -> Text:
            if task.fields.get("unit") == "bytes":
                return self._bytes.render(task)
            if task.total is None:
                return Text(f"{task.completed:.0f} {task.fields.get('unit', '')}".rstrip(), style="progress.download")
            return self._count.render(task)

    class _RateColumn(ProgressColumn):
        def __init__(self) -> None:
            super().__init__()
            self._bytes = TransferSpeedColumn()

        def render(self, task) -> Text:
            if task.fields.get("unit") == "bytes":
                return self._bytes.render(task)
            speed = task.finished_speed or task.speed
            return Text("" if speed is None else f"{speed:.1f} {task.fields.get('unit', 'items')}/s", style="progress.data.speed")

    console = Console(file=stream, highlight=False, soft_wrap=True)
    bars = RichProgress(
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        TaskProgressColumn(),
        _AmountColumn(),
        _RateColumn(),
        TimeRemainingColumn(),
        console=console,
    )
    return console, bars


class Task:
    """One bar; `advance(n)` adds done units (thread-safe), `total` may be None."""

    def __init__(self, progress: "Progress", label: str, total: float | None, unit: str, task_id: int | None):
        self._progress = progress
        self.label = label
        self.total = total
        self.unit = unit
        self.done = 0.0
        self._id = task_id

    def advance(self, n: float = 1) -> None:
        self.done += n
        if self._id is not None:
            self._progress._bars.advance(self._id, n)


class Progress:
    """Writes to `stream` (stderr) when `enabled` (default: when it is a terminal);
    `Progress.quiet()` is the --json form."""

    def __init__(self, enabled: bool | None = None, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = _isatty(self.stream) if enabled is None else enabled
        # rich (about 0.1 s to import) only when something is drawn: --json and pipes never import it
        self._console, self._bars = _rich_bars(self.stream) if self.enabled else (None, None)
        self._lock = threading.Lock()
        self._open_tasks = 0

    @classmethod
    def quiet(cls) -> "Progress":
        return cls(enabled=False)

    def note(self, message: str) -> None:
        if self.enabled:
            self._console.print(mask_urls(message), markup=False, highlight=False)

    @contextmanager
    def task(self, label: str, total: float | None = None, unit: str = "items") -> Iterator[Task]:
        if not self.enabled:
            yield Task(self, label, total, unit, None)
            return
        with self._lock:
            if self._open_tasks == 0:
                self._bars.start()
            self._open_tasks += 1
            task_id = self._bars.add_task(label, total=total, unit=unit)
        task = Task(self, label, total, unit, task_id)
        try:
            yield task
        finally:
            with self._lock:
                self._bars.update(task_id, total=task.done if total is None else total)
                self._bars.stop_task(task_id)
                self._open_tasks -= 1
                if self._open_tasks == 0:
                    # The finished bars stay on screen; the next group starts a fresh display.
                    self._bars.refresh()
                    self._bars.stop()
                    for old in list(self._bars.task_ids):
                        self._bars.remove_task(old)


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
