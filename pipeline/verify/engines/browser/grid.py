"""Verify one package on several browsers at once: remote endpoints (`--browser ws://…`, `--cdp …`)
and/or the local one, one worker thread each (its own Playwright instance: the sync API is per
thread), each within its own time budget.

An endpoint that cannot be reached, or whose connection drops, is retried once (a reconnect
resumes after the runs already checked); if it fails again, or its budget runs out, its remaining
runs become `error` checks naming the endpoint and the reason. The other endpoints finish; a
worker that does not come back within its budget plus a grace period is abandoned (daemon thread),
so nothing waits forever.

Every check is tagged with the endpoint (`endpoint`: its label, no credentials) and the device it
ran on (`device`: devices.device_key, `adapter`: the adapter class), so reports group per device
and the manifest records per adapter class what passed (pipeline.manifest.adapter_runs).
"""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.cache import carrying_shared_store
from pipeline.errors import PackError
from pipeline.manifest import Manifest
from pipeline.progress import Progress
from pipeline.runtime import Runtime
from pipeline.verify.engines.browser.chromium import launch_browser
from pipeline.verify.engines.browser.devices import adapter_class, device_key, device_label
from pipeline.verify.engines.browser.harness import BrowserResult, BudgetSpent, verify_in_browser
from pipeline.verify.engines.browser.run_plan import load_manifest, plan_runs
from pipeline.verify.engines.browser.remote import CONNECT_TIMEOUT_MS, DEFAULT_BUDGET_S, Endpoint, first_line, open_browser
from pipeline.verify.engines.browser.pages import BrowserLost, connection_lost
from pipeline.verify.judgement.checks import Check, any_failed, check, tagged

ATTEMPTS = 2  # the first connection and one retry
GRACE_S = 60  # connecting and closing, beyond the budget, before a worker is abandoned


@dataclass
class EndpointOutcome:
    endpoint: Endpoint
    result: BrowserResult = field(default_factory=BrowserResult)
    errors: list[str] = field(default_factory=list)  # one per failed attempt, scrubbed
    finished: bool = False  # every planned run has a verdict
    seconds: float = 0.0

    @property
    def status(self) -> str:
        if not self.finished:
            return "error"
        return "failed" if self.result.failed else "passed"


@dataclass
class GridResult:
    checks: list[Check]
    report: dict  # report.json "browser": {"endpoints": [...], "devices": [...], "policy": ...}
    outcomes: list[EndpointOutcome]

    @property
    def failed(self) -> bool:
        return any_failed(self.checks)

    @property
    def outputs(self) -> dict:
        """run label @ endpoint -> output -> what that browser produced (bounded), for report.html."""
        return {f"{run} @{outcome.endpoint.label}": kept for outcome in self.outcomes for run, kept in outcome.result.outputs.items()}

    @property
    def errored(self) -> list[EndpointOutcome]:
        return [outcome for outcome in self.outcomes if outcome.status == "error"]


def verify_on_endpoints(
    package_dir: Path,
    references: dict[str, np.ndarray],
    thresholds: dict[str, dict[str, dict[str, dict]]],
    endpoints: list[Endpoint],
    *,
    gpu: bool = False,
    progress: Progress | None = None,
    bundle: str | None = None,
    watchdog_ms: int | None = None,
    runtime: Runtime | None = None,
    budget_s: float = DEFAULT_BUDGET_S,
    remote_executable: str | None = None,
    require_all: bool = False,
    manifest: Manifest | None = None,
) -> GridResult:
    """Each endpoint verifies the package (verify_in_browser) in its own thread, concurrently;
    `manifest`: served from memory in place of the package's file (verify_in_browser)."""
    progress = progress or Progress.quiet()
    planned = plan_runs(manifest if manifest is not None else load_manifest(package_dir))
    outcomes = [EndpointOutcome(endpoint) for endpoint in endpoints]

    def work(outcome: EndpointOutcome) -> None:
        start = time.monotonic()
        deadline = start + budget_s
        endpoint = outcome.endpoint
        for attempt in range(ATTEMPTS):
            try:
                with ExitStack() as stack:
                    try:
                        left_ms = int(1000 * (deadline - time.monotonic()))
                        browser = stack.enter_context(open_browser(endpoint, gpu=gpu, remote_executable=remote_executable,
                                                                   timeout_ms=max(1000, min(CONNECT_TIMEOUT_MS, left_ms))))
                    except PackError as error:
                        raise _Unreachable(str(error)) from None
                    try:
                        verify_in_browser(package_dir, references, thresholds, gpu=gpu, bundle=bundle, watchdog_ms=watchdog_ms,
                                          browser=browser, runtime=runtime, deadline=deadline, result=outcome.result, manifest=manifest)
                    except (PackError, BudgetSpent, BrowserLost):
                        raise
                    except Exception as error:
                        if connection_lost(browser, error):
                            raise BrowserLost(f"connection lost ({type(error).__name__}: {first_line(error)})") from None
                        raise
                outcome.finished = True
                break
            except BudgetSpent as error:
                outcome.errors.append(f"{error} (budget {budget_s:.0f} s)")
                break  # a retry has no time left either
            except PackError:
                raise  # bad input (a package or option problem), not the endpoint's fault
            except Exception as error:  # noqa: BLE001 - unreachable, lost connection, crashed browser
                if isinstance(error, _Unreachable):  # open_browser's message, less the label it starts with
                    why = str(error).removeprefix(f"{endpoint.label}: ")
                elif isinstance(error, BrowserLost):
                    why = str(error)
                else:
                    why = f"{type(error).__name__}: {first_line(error)}"
                outcome.errors.append(endpoint.scrub(why))
                if time.monotonic() >= deadline:
                    break
        outcome.seconds = round(time.monotonic() - start, 1)

    failures: list[BaseException] = []

    def guarded(outcome: EndpointOutcome) -> None:
        try:
            work(outcome)
        except BaseException as error:  # noqa: BLE001 - re-raised in the calling thread
            failures.append(error)

    threads = [threading.Thread(target=carrying_shared_store(guarded), args=(outcome,), daemon=True, name=f"pack-endpoint-{i}")
               for i, outcome in enumerate(outcomes)]
    hard_deadline = time.monotonic() + budget_s + GRACE_S
    total = len(planned) * len(outcomes)
    with progress.task(f"Browser checks on {len(outcomes)} browser{'s' if len(outcomes) != 1 else ''}", total=total) as task:
        for thread in threads:
            thread.start()
        shown = 0
        while any(thread.is_alive() for thread in threads) and time.monotonic() < hard_deadline:
            time.sleep(0.25)
            count = sum(len((o.result.report or {}).get("runs", [])) for o in outcomes)
            if count > shown:
                task.advance(count - shown)
                shown = count
    if failures:
        raise failures[0]
    for thread, outcome in zip(threads, outcomes):
        if thread.is_alive():
            outcome.errors.append(f"did not finish within its budget of {budget_s:.0f} s (+{GRACE_S} s grace); abandoned")
            outcome.finished = False
    return _merge(outcomes, planned, require_all)


class _Unreachable(Exception):
    """open_browser's PackError: the endpoint, not the input, is at fault (retried)."""


def _merge(outcomes: list[EndpointOutcome], planned, require_all: bool) -> GridResult:
    checks: list[Check] = []
    endpoints_report = []
    devices: dict[str, dict] = {}
    for outcome in outcomes:
        label = outcome.endpoint.label
        report = outcome.result.report or {}
        device = report.get("device")
        key = device_key(device) if device else None
        tags = {"endpoint": label, "device": key, "adapter": adapter_class(device) if device else None}
        checks.extend(tagged(outcome.result.checks, **tags))
        if not outcome.finished:
            done = {(r["bundle"], r["ep"], r["variant"]) for r in report.get("runs", [])}
            reason = _reason(outcome.errors)
            for run in planned:
                if (run.bundle, run.ep, run.variant) not in done:
                    checks.append(check("browser", run.ep, run.variant, "error", bundle=run.bundle, detail=f"{label}: {reason}", **tags))
        entry = {"endpoint": label, "kind": outcome.endpoint.kind, "status": outcome.status, "attempts": len(outcome.errors) + (1 if outcome.finished else 0),
                 "seconds": outcome.seconds, "device": key, "browser": report or None}
        if outcome.errors:
            entry["errors"] = outcome.errors
        endpoints_report.append(entry)
        if device is not None:
            group = devices.setdefault(key, {"key": key, "label": device_label(device), "device": device, "endpoints": []})
            group["endpoints"].append(label)
    for group in devices.values():
        statuses = [e["status"] for e in endpoints_report if e["device"] == group["key"]]
        group["status"] = "failed" if "failed" in statuses else ("error" if "error" in statuses else "passed")
    report = {
        "endpoints": endpoints_report,
        "devices": list(devices.values()),
        "policy": "require-all" if require_all else "default",
    }
    return GridResult(checks, report, outcomes)


def _reason(errors: list[str]) -> str:
    """The last attempt's error, and the first's when it differs."""
    plain = errors or ["no result"]
    text = plain[-1] + (f" (after {len(plain)} attempts)" if len(plain) > 1 else "")
    return text if plain[0] == plain[-1] else f"{text}; first attempt: {plain[0]}"


def exit_policy(result, grid: GridSettings | None) -> tuple[bool, str | None]:
    """(failed, why) for the endpoints that ended in `error`: with `require_all` any of them fails
    the command; by default only when no endpoint finished (nothing was verified in a browser).
    Nothing to say for a local-only result."""
    if not isinstance(result, GridResult):
        return False, None
    require_all = bool(grid and grid.require_all)
    errored = result.errored
    if not errored:
        return False, None
    names = ", ".join(o.endpoint.label for o in errored)
    if require_all:
        return True, f"{len(errored)} of {len(result.outcomes)} browsers ended in error ({names}); --require-all"
    if len(errored) == len(result.outcomes):
        return True, f"no browser finished ({names}): nothing was verified in a browser"
    return False, f"{len(errored)} of {len(result.outcomes)} browsers ended in error ({names}); passing without them (--require-all fails instead)"


@dataclass(frozen=True)
class GridSettings:
    """The browsers a build or verify runs on (`--browser`, `--cdp`, PACK_BROWSERS) and how."""

    endpoints: tuple[Endpoint, ...]
    budget_s: float = DEFAULT_BUDGET_S
    remote_executable: str | None = None
    require_all: bool = False


@contextmanager
def browsers_for(grid: GridSettings | None, gpu: bool):
    """The local browser shared by the runs of a build (no endpoints given), else None: each
    endpoint's worker opens its own."""
    if grid is None or not grid.endpoints:
        with launch_browser(gpu=gpu) as browser:
            yield browser
    else:
        yield None


def verify_on_grid(grid: GridSettings | None, package_dir: Path, references, thresholds, *, gpu: bool, progress: Progress,
                   browser=None, bundle: str | None = None, watchdog_ms: int | None = None, runtime: Runtime | None = None,
                   manifest: Manifest | None = None):
    """verify_in_browser on the local `browser` when no endpoint is given (a BrowserResult), else
    verify_on_endpoints (a GridResult); both have .checks, .report and .failed. `manifest`: the
    package's manifest in memory, served in place of its file (None: the file on disk)."""
    if grid is None or not grid.endpoints:
        return verify_in_browser(package_dir, references, thresholds, gpu=gpu, progress=progress, browser=browser,
                                 bundle=bundle, watchdog_ms=watchdog_ms, runtime=runtime, manifest=manifest)
    return verify_on_endpoints(package_dir, references, thresholds, list(grid.endpoints), gpu=gpu, progress=progress, bundle=bundle,
                               watchdog_ms=watchdog_ms, runtime=runtime, budget_s=grid.budget_s,
                               remote_executable=grid.remote_executable, require_all=grid.require_all, manifest=manifest)
