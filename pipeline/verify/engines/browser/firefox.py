"""Firefox as a second engine: Debian's `firefox-esr`,
headless, driven over WebDriver BiDi by npm `puppeteer-core` (pinned; no geckodriver, no browser
download: puppeteer-core fetches none). Playwright cannot drive it here (its BiDi path fails on
`emulation.setMediaFeaturesOverride`).

Firefox runs the build's default loads (default_load.py): the same page (page/default_load.js)
served the same way, one tab per visit (each platform chain, its first load and its reload from
Cache Storage), asked through `pipeline/firefox_driver.mjs` under Node; and the per-(EP, variant)
checks (harness.py through driven.py): runner pages in one browser, `session()`, asked through
`pipeline/firefox_session.mjs`.
puppeteer-core is installed with npm into the pack cache on first use, like onnxruntime-web. A
machine without Firefox gets a `not-verifiable` check naming the install line, never a silent skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

from pipeline.errors import PackError
from pipeline.verify.engines.browser.chromium import ConsoleLine

# puppeteer-core 25 needs node >= 22.12 (Debian 12 has node 20); 24.x drives Firefox over BiDi.
PUPPETEER_CORE = "24.43.1"
FIREFOX_ENV = "PACK_FIREFOX"  # a Firefox executable other than firefox-esr/firefox on PATH
INSTALL = "apt-get install firefox-esr"


def firefox_executable() -> str | None:
    """The Firefox to drive: $PACK_FIREFOX, else firefox-esr or firefox on PATH; None when none."""
    configured = os.environ.get(FIREFOX_ENV)
    if configured:
        return configured if Path(configured).is_file() else None
    return shutil.which("firefox-esr") or shutil.which("firefox")


def identity() -> str | None:
    """What decides this Firefox's results, for the build's keys: its version line (None: none here)."""
    executable = firefox_executable()
    if executable is None:
        return None
    try:
        return subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=30).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def unavailable() -> str | None:
    """Why Firefox cannot run here, with the line that fixes it; None when it can."""
    if firefox_executable() is None:
        where = f"${FIREFOX_ENV} ({os.environ[FIREFOX_ENV]}) is not a file" if os.environ.get(FIREFOX_ENV) else "no firefox-esr or firefox on PATH"
        return f"Firefox is not installed ({where}); install it: {INSTALL}"
    if shutil.which("node") is None or shutil.which("npm") is None:
        return "Firefox is driven from Node: node and npm are not on PATH; install them: apt-get install nodejs npm"
    return None


def puppeteer_dir() -> Path:
    """puppeteer-core at the pinned version in the pack cache, installed with npm on first use."""
    from pipeline.cache import cache_dir

    folder = cache_dir("tools", f"puppeteer-core-{PUPPETEER_CORE}")
    if (folder / "node_modules" / "puppeteer-core" / "package.json").is_file():
        return folder
    try:
        subprocess.run([shutil.which("npm") or "npm", "install", "--prefix", str(folder), f"puppeteer-core@{PUPPETEER_CORE}", "--no-audit", "--no-fund", "--silent"],
                       check=True, capture_output=True, text=True, timeout=600)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as error:
        tail = (getattr(error, "stderr", "") or str(error)).strip().splitlines()[-1:] or [""]
        raise PackError(f"puppeteer-core@{PUPPETEER_CORE}: `npm install` into {folder} failed ({tail[0]}); check npm and registry access") from None
    return folder


def run_visits(url: str, base: str, visits: list[dict], timeout_ms: int, webgpu: bool = True) -> dict[str, dict]:
    """The answers of page/default_load.js at `url` in one headless Firefox, one tab per visit
    ({name, platform, cold}, in order), by name: DEFAULT_LOAD's shape with the page's facts, plus
    `browser`, BiDi's console `warnings` and `memory` (the content processes' peak during the visit:
    memory.py). A visit Firefox did not answer gets {ok: false, message}."""
    from pipeline.verify.engines.browser.memory import PeakSampler

    driver = Path(str(resources.files("pipeline").joinpath("firefox_driver.mjs")))
    try:
        tools = puppeteer_dir()
    except PackError as error:
        return {visit["name"]: {"ok": False, "message": str(error), "fallbacks": [], "notRunnable": True} for visit in visits}
    command = ["node", str(driver), str(tools), firefox_executable() or "firefox-esr", url, base, str(timeout_ms), "1" if webgpu else "0", json.dumps(visits)]
    limit_s = timeout_ms * len(visits) / 1000 + 90
    answers: dict[str, dict] = {}
    failure = None
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    guard = threading.Timer(limit_s, _end, (process,))  # past the limit the driver goes, and its browser with it
    guard.start()
    try:
        with PeakSampler(process.pid, "firefox") as sampler:
            for line in process.stdout:  # one JSON line per event, as the driver says them
                if not line.startswith("{"):
                    continue
                said = json.loads(line)
                if "phase" in said:
                    sampler.start_phase(said["phase"])
                elif "visit" in said:
                    sampler.end_phase()
                    answers[said["visit"]] = said["answer"]
                else:
                    failure = said
            stderr = process.stderr.read()
            process.wait()
            peaks = sampler.peaks()
    finally:
        guard.cancel()
        if process.poll() is None:
            _end(process)
            process.wait()
    if failure is None and len(answers) < len(visits):
        tail = (stderr.strip().splitlines() or ["no output"])[-1]
        failure = {"ok": False, "message": f"Firefox driver exited {process.returncode}: {tail[:300]}" if process.returncode != -9 else f"Firefox did not answer within {limit_s:.0f} s", "fallbacks": []}
    return {visit["name"]: {**answers[visit["name"]], "memory": peaks.get(visit["name"])} if visit["name"] in answers else dict(failure) for visit in visits}


def _end(process: subprocess.Popen) -> None:
    """SIGKILL to the driver's process group (node and the Firefox it started)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


START_S = 60  # puppeteer-core's launch: 5-7 s here


class FirefoxSession:
    """One headless Firefox for the runner pages of a verification (driven.py's session): commands
    to firefox_session.mjs, one JSON line each way. A command past its limit kills the browser
    (its page never yielded); the next page starts a fresh one."""

    name = "firefox"

    def __init__(self, webgpu: bool = True):
        self.webgpu = webgpu
        self.process: subprocess.Popen | None = None
        self.version = "?"
        self._next = 0
        self._buffer = b""
        self.browser_pid: int | None = None  # Firefox's own process group (puppeteer detaches it from node's)

    def _start(self) -> None:
        script = Path(str(resources.files("pipeline").joinpath("firefox_session.mjs")))
        tools = puppeteer_dir()
        self.process = subprocess.Popen(["node", str(script), str(tools), firefox_executable() or "firefox-esr", "1" if self.webgpu else "0"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        self._buffer = b""
        ready = self._read(START_S)
        if not ready.get("ready"):
            raise PackError("Firefox did not start (firefox_session.mjs gave no ready line)")
        self.browser_pid = ready.get("browserPid")
        self.version = self._call({"op": "version"}, CALL_LIMIT_S).get("value", "?")

    def _read(self, limit_s: float) -> dict:
        """The next JSON line the script prints within `limit_s` (its stdout read raw, so a line
        already read stays in this session's buffer rather than a reader's select cannot see)."""
        from pipeline.verify.engines.browser.chromium import PageHung

        assert self.process is not None and self.process.stdout is not None
        deadline = time.monotonic() + limit_s
        while True:
            line, newline, rest = self._buffer.partition(b"\n")
            if newline:
                self._buffer = rest
                if line.startswith(b"{"):
                    return json.loads(line)
                continue
            ready, _, _ = select.select([self.process.stdout], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(self.process.stdout.fileno(), 1 << 16) if ready else None
            if chunk is None:
                self.stop(kill=True)
                raise PageHung(f"Firefox gave no answer within {limit_s:.0f} s")
            if not chunk:
                status = self.process.poll() if self.process else "?"
                self.stop(kill=True)
                raise PageHung(f"Firefox ended (exit status {status})")
            self._buffer += chunk

    def _call(self, command: dict, limit_s: float) -> dict:
        if self.process is None:
            self._start()
        assert self.process is not None and self.process.stdin is not None
        self._next += 1
        self.process.stdin.write((json.dumps({**command, "id": self._next}) + "\n").encode())
        self.process.stdin.flush()
        answer = self._read(limit_s)
        if answer.get("error"):
            raise RuntimeError(answer["error"])
        return answer

    def open(self, url: str, init: str) -> str:
        return self._call({"op": "open", "url": url, "init": init}, START_S)["page"]

    def evaluate(self, handle: str, source: str, arg, limit_s: float):
        return self._call({"op": "evaluate", "page": handle, "source": source, "arg": arg}, limit_s).get("value")

    def console(self, handle: str) -> list[ConsoleLine]:
        if self.process is None:
            return []
        lines = self._call({"op": "console", "page": handle}, CALL_LIMIT_S).get("lines") or []
        return [ConsoleLine("warning" if line["type"] == "warn" else line["type"], line["text"]) for line in lines]

    def close(self, handle: str) -> None:
        if self.process is not None:
            self._call({"op": "close", "page": handle}, CALL_LIMIT_S)

    def stop(self, kill: bool = False) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        try:
            if kill:
                raise OSError("a hung page: no clean close")
            if process.stdin is not None:
                process.stdin.close()  # the script closes the browser at the end of its input
            process.wait(timeout=15)
        except (subprocess.TimeoutExpired, OSError):
            # the two process groups this session started: Firefox's, then node's
            for group in (self.browser_pid, process.pid):
                if group:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(group, signal.SIGKILL)
            process.wait()
        self.browser_pid = None


CALL_LIMIT_S = 60


@contextmanager
def session(webgpu: bool = True):
    """A FirefoxSession, stopped at the end of the block; PackError when Firefox cannot start."""
    firefox = FirefoxSession(webgpu)
    try:
        firefox._start()
        yield firefox
    finally:
        firefox.stop()
