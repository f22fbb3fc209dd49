"""Progress on a terminal, plain lines in a log, silence under --json.

One `Progress` object is passed down a command; long steps call `task()` for a bar or `note()` for a
status line, and `step()` wraps a long call (a build stage). Three forms:
- bars (`Progress()` when stderr is a terminal): drawn by `rich` (rate and time left per bar,
  several bars at once, e.g. parallel uploads) on stderr, so stdout stays clean for --json;
- plain lines (`Progress.lines(stream)`: `pack build` when its stdout is a pipe or a file, as in
  CI): one line per note, per step and task begun and ended, each prefixed with the seconds since
  the command began, and while a step or task runs a "still" line whenever `interval_s` (30 s)
  passed without one, so a log never falls silent for longer; no bars, no control characters;
- quiet (`Progress.quiet()`: --json, and other commands off a terminal).
Every URL in a line is masked (pipeline/urls.py).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

# A log line at least this often while a step runs (plain lines); the environment variable
# shortens it for tests of a whole `pack build` (no real 30-s waits).
LINE_INTERVAL_S = 30.0
INTERVAL_ENV = "PACK_PROGRESS_INTERVAL_S"

Result = TypeVar("Result")

from pipeline.errors import PackError
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
    """Writes bars to `stream` (stderr) when `enabled` (default: when it is a terminal);
    `Progress.quiet()` is the --json form, `Progress.lines()` the plain form."""

    def __init__(self, enabled: bool | None = None, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = _isatty(self.stream) if enabled is None else enabled
        # rich (about 0.1 s to import) only when something is drawn: --json and pipes never import it
        self._console, self._bars = _rich_bars(self.stream) if self.enabled else (None, None)
        self._lock = threading.Lock()
        self._open_tasks = 0
        self._plain: _Lines | None = None

    @classmethod
    def quiet(cls) -> "Progress":
        return cls(enabled=False)

    @classmethod
    def lines(cls, stream, interval_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> "Progress":
        """Plain lines on `stream`, one at least every `interval_s` while a step or task runs
        (default: $PACK_PROGRESS_INTERVAL_S, else 30 s)."""
        progress = cls(enabled=False)
        progress._plain = _Lines(stream, interval_s if interval_s is not None else _interval_from_env(), clock)
        return progress

    @property
    def writes_lines(self) -> bool:
        """The plain form: timestamped lines (`Progress.lines`)."""
        return self._plain is not None

    def note(self, message: str) -> None:
        if self._plain:
            self._plain.line(message)
        elif self.enabled:
            self._console.print(mask_urls(message), markup=False, highlight=False)

    def step(self, label: str, run: Callable[..., Result]) -> Callable[..., Result]:
        """`run`, announced: with plain lines, a line as it begins and ends and "still" lines while
        it runs; otherwise `run` itself."""
        if not self._plain:
            return run
        plain = self._plain

        def announced(*args, **kwargs) -> Result:
            with plain.running(label):
                return run(*args, **kwargs)

        return announced

    @contextmanager
    def still(self, label: str) -> Iterator[None]:
        """With plain lines, a "still running" line whenever the log was silent for the interval
        while the block runs (its caller says how it began and ended); otherwise nothing."""
        if not self._plain:
            yield
            return
        with self._plain.running(label, announce=False):
            yield

    @contextmanager
    def task(self, label: str, total: float | None = None, unit: str = "items") -> Iterator[Task]:
        if self._plain:
            task = Task(self, label, total, unit, None)
            with self._plain.running(label, lambda: f"{task.done:.0f}/{task.total:.0f} {unit}" if task.total else f"{task.done:.0f} {unit}"):
                yield task
            return
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


class _Lines:
    """The plain form: timestamped lines, and a watcher thread per running step that writes a
    "still" line whenever `interval_s` passed since the last line of any kind."""

    def __init__(self, stream, interval_s: float, clock: Callable[[], float]):
        self.stream = stream
        self.interval_s = interval_s
        self.clock = clock
        self.started = clock()
        self.last = self.started
        self.lock = threading.Lock()

    def line(self, message: str) -> None:
        with self.lock:
            now = self.clock()
            self.last = now
            self.stream.write(f"[{now - self.started:5.0f}s] {mask_urls(message)}\n")
            self.stream.flush()  # a pipe is block-buffered: a CI log shows the line now

    @contextmanager
    def running(self, label: str, state: Callable[[], str] | None = None, announce: bool = True) -> Iterator[None]:
        """`announce`: a line as the block begins and ends (else only the "still" lines)."""
        began = self.clock()
        if announce:
            self.line(f"{label}: started")
        done = threading.Event()

        def watch() -> None:
            while not done.wait(max(0.0, self.interval_s - (self.clock() - self.last))):
                if self.clock() - self.last >= self.interval_s:
                    extra = f", {state()}" if state else ""
                    self.line(f"{label}: still running ({self.clock() - began:.0f} s{extra})")

        watcher = threading.Thread(target=watch, name=f"progress: {label}", daemon=True)
        watcher.start()
        try:
            yield
        except BaseException:
            done.set()
            watcher.join()
            if announce:
                self.line(f"{label}: stopped after {self.clock() - began:.1f} s")
            raise
        done.set()
        watcher.join()
        if announce:
            self.line(f"{label}: done in {self.clock() - began:.1f} s")


def _interval_from_env() -> float:
    text = os.environ.get(INTERVAL_ENV, "").strip()
    try:
        value = float(text) if text else LINE_INTERVAL_S
    except ValueError:
        value = -1.0
    if not value > 0:
        raise PackError(f"{INTERVAL_ENV}={text!r}: give the most seconds between two progress lines (a positive number; default {LINE_INTERVAL_S:.0f})")
    return value


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
