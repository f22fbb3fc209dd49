"""Peak memory of a browser's content processes during a default load, from the processes' own
accounting: `VmRSS` in `/proc/<pid>/status`, sampled every SAMPLE_S while a phase runs (the first
load and run, then the reload from Cache Storage). The content processes are the descendants of
the driven browser that hold pages: Chromium's renderers, Firefox's content (tab) processes,
WebKit's web processes. The figure of a phase is the largest of them at its highest sample (the
page, its wasm heap and its workers live in one of them); which process it was is kept beside it,
so a reload served by the same process as the first load can be told apart. (Taking only the
processes that appear during a phase would not do: Chromium navigates a new page into a spare
renderer started before it.)

Linux only (`/proc`); elsewhere, or where no content process is found, a phase has no figure
and says why. Sampling misses a peak shorter than SAMPLE_S.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

SAMPLE_S = 0.05
RESCAN_S = 0.5  # the process tree is read again this often (a page may get a new process)
PROC = Path("/proc")


def _args(pid: int) -> list[str]:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().decode(errors="replace").rstrip("\0").split("\0")
    except OSError:
        return []


def is_content(engine: str, args: list[str]) -> bool:
    """Whether a process with these arguments holds pages in `engine`."""
    if not args:
        return False
    if engine == "chromium":  # Chromium's children rewrite their arguments as one line: look in the text
        return "--type=renderer" in " ".join(args)
    if engine == "firefox":
        return "-contentproc" in args and "-isForBrowser" in args
    if engine == "webkit":
        return os.path.basename(args[0]) == "WebKitWebProcess"
    return False


def descendants(root: int) -> list[int]:
    """Every process below `root` (children, their children, ...), from /proc/<pid>/stat."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir() if PROC.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after its last ')'
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def rss_kib(pid: int) -> int | None:
    """VmRSS of `pid` in KiB; None when it has gone."""
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def content_processes(root: int, engine: str) -> list[int]:
    return [pid for pid in descendants(root) if is_content(engine, _args(pid))]


class PeakSampler:
    """Samples the content processes below `root` on a thread while a phase is open:
    `with PeakSampler(root, engine) as s: s.start_phase("first"); ...; s.end_phase()`, then
    `s.peaks()` → {phase: {peakMb, pid, samples, processes}}."""

    def __init__(self, root: int | None, engine: str, interval: float = SAMPLE_S):
        self.root, self.engine, self.interval = root, engine, interval
        self.phase: str | None = None
        self.found: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"memory-{engine}", daemon=True)

    def __enter__(self) -> PeakSampler:
        if self.root is not None and PROC.is_dir():
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def start_phase(self, name: str) -> None:
        with self._lock:
            self.phase = name
            self.found[name] = {"peak_kib": 0, "pid": None, "samples": 0, "processes": set()}

    def end_phase(self) -> None:
        with self._lock:
            self.phase = None

    def _run(self) -> None:
        pids: list[int] = []
        scanned = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now - scanned >= RESCAN_S or not pids:
                pids, scanned = content_processes(self.root, self.engine), now
            sizes = [(size, pid) for pid in pids if (size := rss_kib(pid)) is not None]
            with self._lock:
                record = self.found.get(self.phase) if self.phase else None
                if record is not None and sizes:
                    size, pid = max(sizes)
                    record["samples"] += 1
                    record["processes"].update(p for _, p in sizes)
                    if size > record["peak_kib"]:
                        record["peak_kib"], record["pid"] = size, pid
            self._stop.wait(self.interval)

    def peaks(self) -> dict[str, dict]:
        """Each phase's figure: {peakMb, pid, samples, processes}, or {why} when nothing was sampled."""
        out = {}
        with self._lock:
            for name, record in self.found.items():
                if not record["samples"]:
                    why = "no /proc here" if not PROC.is_dir() else "the browser's process was not found" if self.root is None else f"no {self.engine} content process was found"
                    out[name] = {"why": why}
                    continue
                out[name] = {"peakMb": round(record["peak_kib"] / 1024, 1), "pid": record["pid"], "samples": record["samples"],
                             "processes": len(record["processes"])}
        return out


def new_chromium(before: set[int]) -> int | None:
    """The Chromium main process this process started since `before` (chromium_mains() then)."""
    fresh = [pid for pid in chromium_mains() if pid not in before]
    return fresh[0] if len(fresh) == 1 else None


def chromium_mains() -> set[int]:
    """The Chromium main processes below this one (Playwright's driver starts them)."""
    mains = set()
    for pid in descendants(os.getpid()):
        args = _args(pid)
        if args and "chrom" in os.path.basename(args[0]) and "--type=" not in " ".join(args):
            mains.add(pid)
    return mains
