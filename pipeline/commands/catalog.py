"""`pack build A B C --jobs N`: a catalog build. Every target is checked first (one that is not a
recipe or a model stops everything before a build starts: exit 2); then each target is built by
the single-target path (`build_one`) in its own process, N at a time. Separate processes keep the
builds independent (one crash, one memory peak, one set of signal handlers each); they share the
cache, whose entries and locks are safe across processes.

Each child runs in its own process group, so the terminal's Ctrl-C reaches this process only, and
it hands every running child exactly one SIGINT (SIGTERM for SIGTERM): a second signal could cut a
child's clean-up short. Each child removes its staging folder as a single build does, no further
target starts, and this process exits 130/143 once every child has ended.

Output: one line per target as it starts and as it ends (name, verdict, seconds) on stdout; the
children build with --json, so their progress bars are off, and what they print on stderr
(warnings, errors) comes through prefixed with the target's name. When stdout is a pipe or a file
(a CI log) the lines are timestamped plain progress lines (pipeline/progress.py), with a "still
running" line per running target whenever the log was silent for 30 s. `--json`: one JSON array,
an entry per target in the order given, and nothing else on stdout.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from pipeline.commands.build_target import BuildFlags, build_one, check_settings
from pipeline.commands.common import cli_errors, open_shared_store, piped, print_json
from pipeline.errors import EXIT_SIGINT, EXIT_SIGTERM, PackError, Terminated
from pipeline.progress import Progress
from pipeline.urls import mask_url

INTERRUPTED = (EXIT_SIGINT, EXIT_SIGTERM)
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@dataclass
class Job:
    """One target of a catalog build and, once it ended, its outcome."""

    target: str
    name: str  # the package's name: OUT/<name>/
    exit_code: int | None = None
    seconds: float = 0.0
    report: dict | None = None
    error: str | None = None  # the child's `error:` line (exit 2), or why its output was unusable

    def as_data(self) -> dict[str, Any]:
        return {"target": self.target, "name": self.name, "passed": self.exit_code == 0, "exit_code": self.exit_code,
                "seconds": self.seconds, "error": self.error, "report": self.report}


def build_catalog(targets: list[str], settings: BuildFlags, *, jobs: int, json_output: bool, per_target: dict[str, Any]) -> int:
    """Build every target, `jobs` at a time; the exit code: 2 when any target is bad input, else 1
    when any build failed, else 0 (130/143 when stopped: raised through cli_errors)."""
    with cli_errors(settings.out):
        given = [option for option, value in per_target.items() if value]
        if given:
            raise PackError(f"{given[0]} describes one target, and {len(targets)} are given; build that target on its own: pack build TARGET {given[0]} ...")
        queue = resolve_targets(targets)
        check_settings(settings)
        open_shared_store(settings.cache_url)  # named but unusable: exit 2 before any build; each build opens its own
        log = Progress.lines(sys.stdout) if not json_output and piped(sys.stdout) else Progress.quiet()
        catalog = Catalog(queue, settings, jobs=jobs, say=not json_output, log=log)
        catalog.say(f"building {len(queue)} packages, {min(jobs, len(queue))} at a time, into {settings.out}/")
        catalog.run()
    if json_output:
        print_json([job.as_data() for job in queue])
    else:
        failed = [job.name for job in queue if job.exit_code != 0]
        typer.echo(f"{len(queue) - len(failed)} of {len(queue)} packages passed" + (f"; not passed: {', '.join(failed)}" if failed else "")
                   + f"; each package's checks: pack report {settings.out}/<name>")
    return catalog_exit_code([job.exit_code for job in queue])


def catalog_exit_code(codes: list[int | None]) -> int:
    if 2 in codes:
        return 2
    return 1 if any(code != 0 for code in codes) else 0


def resolve_targets(targets: list[str]) -> list[Job]:
    """Each target as the build will read it, before any build starts: a recipe (its keys checked,
    a source named) or a local model file; two targets that make the same package are refused."""
    from pipeline.build import BuildOptions, load_build_recipe
    from pipeline.source import is_url

    jobs: dict[str, Job] = {}
    for target in targets:
        if is_url(target):
            raise PackError(f"{mask_url(target)}: a model URL needs --sha256, which describes one target; build it on its own: pack build URL --sha256 HEX")
        recipe = load_build_recipe(BuildOptions(target=target))
        if recipe.path is None and not Path(target).is_file():
            raise PackError(f"{target}: no such model file; give an .onnx model, a recipe .toml or a built-in recipe name (`pack recipes` lists them)")
        if recipe.name in jobs:
            raise PackError(f"{target}: makes the package '{recipe.name}', as {jobs[recipe.name].target} does; give each package once")
        jobs[recipe.name] = Job(target, recipe.name)
    return list(jobs.values())


class Catalog:
    """Runs the jobs' child processes, at most `jobs` at once, and stops them all on a signal."""

    def __init__(self, queue: list[Job], settings: BuildFlags, *, jobs: int, say: bool, log: Progress | None = None):
        self.queue = queue
        self.settings = settings
        self.jobs = jobs
        self._say = say
        self._log = log or Progress.quiet()  # plain lines in a log: the lines timestamped, "still" lines between
        self._lock = threading.Lock()  # guards _running and _stopping, and keeps printed lines whole
        self._running: set[subprocess.Popen] = set()
        self._stopping: int | None = None  # the signal every child was handed

    def say(self, line: str) -> None:
        if self._log.writes_lines:
            self._log.note(line)
        elif self._say:
            typer.echo(line)

    def run(self) -> None:
        with ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="pack-build") as pool:
            futures = [pool.submit(self._build, job) for job in self.queue]
            try:
                # short waits: the main thread must stay where Ctrl-C and SIGTERM can reach it
                while wait(futures, timeout=0.2).not_done:
                    pass
            except KeyboardInterrupt as error:
                self._stop(signal.SIGTERM if isinstance(error, Terminated) else signal.SIGINT)
                for future in futures:
                    future.cancel()
                pool.shutdown(wait=True)  # every child has cleaned up and ended
                raise
            for future in futures:
                future.result()  # a fault in this process's own code surfaces here

    def _stop(self, signum: int) -> None:
        with self._lock:
            self._stopping = signum
            for process in self._running:
                process.send_signal(signum)

    def _build(self, job: Job) -> None:
        with self._lock:
            if self._stopping is not None:
                return
            stdout = tempfile.TemporaryFile()
            # The child starts with SIGINT and SIGTERM blocked (a mask is inherited) and lets them in
            # where its clean-up can take them, so a stop that comes as it starts is no traceback.
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            try:
                process = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=stdout, stderr=subprocess.PIPE, process_group=0)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            self._running.add(process)
        self._line(f"{job.name}: started ({job.target})")
        started = time.perf_counter()
        reader = threading.Thread(target=self._forward, args=(job, process.stderr), daemon=True)
        reader.start()
        try:
            with stdout:
                # the job on stdin, not argv: --browser endpoints may carry tokens `ps` would show
                try:
                    process.stdin.write(json.dumps({"target": job.target, "settings": self.settings.to_data()}).encode())
                    process.stdin.close()
                except BrokenPipeError:  # it ended before reading: its exit code and stderr say why
                    pass
                with self._log.still(job.name):
                    code = process.wait()
                reader.join(timeout=5)  # a process the build left running may still hold its stderr open
                job.exit_code = 128 - code if code < 0 else code  # killed by a signal: as the shell counts it
                job.seconds = round(time.perf_counter() - started, 1)
                stdout.seek(0)
                self._read_report(job, stdout.read())
        finally:
            with self._lock:
                self._running.discard(process)
        self._line(self._end_line(job))

    def _forward(self, job: Job, stream) -> None:
        with stream:
            for raw in stream:
                self._child_line(job, raw.decode("utf-8", "replace").rstrip("\n"))

    def _child_line(self, job: Job, line: str) -> None:
        if line.startswith("error: "):
            job.error = line.removeprefix("error: ")
            if self._say:
                return  # its end line says it
        if line.startswith("interrupted (") and self._stopping is not None:
            return  # this process says it once for all
        with self._lock:
            typer.echo(f"{job.name}: {line}", err=True)

    def _read_report(self, job: Job, text: bytes) -> None:
        if job.exit_code not in (0, 1):
            return
        try:
            job.report = json.loads(text)
        except ValueError:
            job.error = f"its build printed no report (exit {job.exit_code}); build it on its own to see why: pack build {job.target}"
            job.exit_code = 1

    def _end_line(self, job: Job) -> str:
        if job.exit_code in INTERRUPTED:
            return f"{job.name}: stopped ({signal.Signals(job.exit_code - 128).name}) after {job.seconds:.1f} s; nothing written"
        if job.report is None:
            return f"{job.name}: error (exit {job.exit_code}) after {job.seconds:.1f} s: {job.error or 'see the lines above'}"
        from pipeline.commands.summary import check_counts

        verdict = "PASSED" if job.report["passed"] else "FAILED"
        problems = "".join(f"; {problem}" for problem in job.report.get("verdict") or [])
        return f"{job.name}: {verdict} in {job.seconds:.1f} s ({check_counts(job.report)}) -> {self.settings.out / job.name}{problems}"

    def _line(self, line: str) -> None:
        with self._lock:
            self.say(line)


def main() -> None:
    """A child of a catalog build: one target from stdin, built with --json; exits with its code."""
    job = json.loads(sys.stdin.read())
    try:
        with cli_errors():
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # a stop that came while it started is raised here
            build_one(job["target"], BuildFlags.from_data(job["settings"]), json_output=True)
    except typer.Exit as done:
        sys.exit(done.exit_code)


if __name__ == "__main__":
    main()
