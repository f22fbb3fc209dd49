"""Verifying on remote browsers (`--browser ws://…`): Playwright's own browser server
(`python -m playwright run-server`, this venv's) in a network namespace of its own, launching
Debian's Chromium with the launch options pack sends. One tiny package serves every test."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import brotli
import numpy as np
import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.manifest import read_manifest, write_manifest
from pipeline.verify.engines.browser.grid import exit_policy, verify_on_endpoints
from pipeline.verify.engines.browser.remote import CONNECT, Endpoint
from pipeline.package_server import running_server
from tests import remote_helpers
from browser_helpers import Variant, negative_step_slice_model, reference_of, thresholds_for, write_package

runner = CliRunner()
TOKEN = "s3cr3tT0ken4711xyz"


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    """fp32 Slice on the webgpu bundle (2 runs), its 27 MB wasm brotli-encoded: through the
    connection it is the transfer that costs, not the run."""
    tmp = tmp_path_factory.mktemp("remote")
    feeds = {"x": np.linspace(-1, 1, 31, dtype=np.float32).reshape(1, 1, 1, 31)}
    root = write_package(tmp / "slice", {"fp32": Variant(negative_step_slice_model())}, feeds)
    manifest = read_manifest(root)
    for path, entry in manifest["files"].items():
        if path.endswith(".wasm") and not entry["encodings"]:
            encoded = brotli.compress((root / path).read_bytes(), quality=1)
            (root / f"{path}.br").write_bytes(encoded)
            entry["encodings"] = {"br": {"path": f"{path}.br", "size": len(encoded)}}
    write_manifest(root, manifest)
    return root


@pytest.fixture(scope="module")
def references(package, tmp_path_factory):
    feeds = {"x": np.linspace(-1, 1, 31, dtype=np.float32).reshape(1, 1, 1, 31)}
    return reference_of(negative_step_slice_model(), feeds, tmp_path_factory.mktemp("reference"))


@pytest.fixture(scope="module")
def remote_servers():
    reason = remote_helpers.available()
    if reason:
        pytest.skip(reason)
    servers = remote_helpers.start_remote_servers(3)
    try:
        yield servers
    finally:
        for server in servers:
            remote_helpers.stop_remote_server(server)


@pytest.mark.browser
def test_two_endpoints_verify_through_the_connection_and_a_killed_one_errors(package, remote_servers, tmp_path):
    first, second, doomed = remote_servers
    # (a) the namespaces cannot reach this machine's loopback, where pack serves the package
    with running_server(package) as server:
        port = int(server.url.rstrip("/").rsplit(":", 1)[1])
        probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)"
        inside = first.in_namespace("python3", "-c", probe)
        assert inside.returncode != 0 and "ConnectionRefusedError" in inside.stderr
        socket.create_connection(("127.0.0.1", port), timeout=3).close()  # while here it is served

    # (c) one endpoint dies once its browser has started: mid-run
    killed = threading.Event()

    def kill_when_running():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not doomed.browser_pids():
            time.sleep(0.2)
        time.sleep(3)
        doomed.kill()
        killed.set()

    killer = threading.Thread(target=kill_when_running, daemon=True)
    killer.start()
    secret_url = f"{first.url}?token={TOKEN}"
    result = runner.invoke(app, ["verify", str(package), "--json"],
                           env={"PACK_BROWSERS": f"{secret_url},{second.url},{doomed.url}", "PACK_REMOTE_CHROMIUM": "/usr/bin/chromium"})
    killer.join(timeout=5)
    assert killed.is_set()
    assert TOKEN not in result.output
    assert result.stdout.startswith("{"), (result.exit_code, result.output[-3000:], repr(result.exception))
    document = json.loads(result.stdout)
    browser = document["browser"]
    endpoints = {entry["endpoint"]: entry for entry in browser["endpoints"]}
    first_label = f"{first.url}?token=***"
    assert list(endpoints) == [first_label, second.url, doomed.url]
    # (b) both live endpoints verified everything; their checks sit under one device
    for label in (first_label, second.url):
        assert endpoints[label]["status"] == "passed"
        statuses = [(c["ep"], c["status"]) for c in document["checks"] if c.get("endpoint") == label]
        assert statuses == [("webgpu", "passed"), ("wasm", "passed")]
    device = next(d for d in browser["devices"] if first_label in d["endpoints"])
    assert second.url in device["endpoints"]
    assert device["device"]["browser"] == "Chromium" and device["device"]["os"] == "Linux"
    assert device["device"]["adapter"] == {"vendor": "google", "architecture": "swiftshader", "description": "", "fallback": True}
    assert device["device"]["shaderF16"] is False
    assert set(endpoints[first_label]["browser"]["eps"]) == {"webgpu/fp32", "wasm/fp32"}
    # (c) the killed endpoint: error checks naming it and why, after one retry
    lost = endpoints[doomed.url]
    assert lost["status"] == "error" and len(lost["errors"]) == 2
    assert lost["errors"][0].startswith("connection lost (") and lost["errors"][1].startswith("cannot connect (")
    errors = [c for c in document["checks"] if c.get("endpoint") == doomed.url and c["status"] == "error"]
    assert errors and all(c["detail"].startswith(f"{doomed.url}: cannot connect") and "(after 2 attempts); first attempt: " in c["detail"]
                          for c in errors)
    # default policy: the others finished, so exit 0 and the verdict says so
    assert result.exit_code == 0, result.output
    assert document["passed"] is True


def test_endpoint_policy_and_dead_or_silent_endpoints_never_hang(package, references):
    """A dead endpoint (nothing listens) and a silent one (accepts, never answers) end in `error`
    within the budget; the exit policy: by default only when no endpoint finished."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead_port = dead.getsockname()[1]
    dead.close()
    endpoints = [Endpoint(CONNECT, f"ws://127.0.0.1:{dead_port}/"), Endpoint(CONNECT, f"ws://127.0.0.1:{silent.getsockname()[1]}/?token={TOKEN}")]
    start = time.monotonic()
    try:
        result = verify_on_endpoints(package, references, thresholds_for(package), endpoints, budget_s=6)
    finally:
        silent.close()
    assert time.monotonic() - start < 30
    assert [o.status for o in result.outcomes] == ["error", "error"]
    dead_outcome = result.outcomes[0]
    assert len(dead_outcome.errors) == 2 and all(e.startswith("cannot connect (") and "ECONNREFUSED" in e for e in dead_outcome.errors)
    assert TOKEN not in json.dumps(result.report) + json.dumps(result.checks)
    assert {c["status"] for c in result.checks} == {"error"} and len(result.checks) == 4
    from pipeline.verify.engines.browser.grid import GridSettings

    assert exit_policy(result, GridSettings(tuple(endpoints)))[0] is True  # nothing finished
    result.outcomes[0].finished = True  # as if the first had finished
    assert exit_policy(result, GridSettings(tuple(endpoints)))[0] is False
    assert exit_policy(result, GridSettings(tuple(endpoints), require_all=True))[0] is True


def _with_adapter_failure(package: Path, folder: Path, adapter: dict) -> Path:
    """A copy of the package whose manifest says webgpu/fp32 failed on `adapter`'s class (and
    passed elsewhere), as a build verified on several browsers records it."""
    import shutil

    copy = Path(shutil.copytree(package, folder))
    manifest = read_manifest(copy)
    passed = [{"stage": "browser", "bundle": "webgpu", "ep": ep, "variant": "fp32", "status": "passed"} for ep in ("wasm", "webgpu")]
    failed = {"stage": "browser", "bundle": "webgpu", "ep": "webgpu", "variant": "fp32", "status": "failed", "detail": "y: rel_l2 0.4 > 0.001"}
    manifest["verification"] = {"browser": True, "passed": False, "runs": passed, "adapters": [
        {"adapter": adapter, "browsers": ["Chrome 150.0 on Windows"], "runs": [passed[0], failed]},
        {"adapter": {"vendor": "apple", "architecture": "metal-3", "description": "", "fallback": False}, "browsers": ["Safari 26"], "runs": passed},
    ]}
    write_manifest(copy, manifest)
    return copy


@pytest.mark.browser
def test_a_failure_on_one_adapter_class_steers_the_loader_on_that_class_only(package, tmp_path):
    """(d) In this Chromium (SwiftShader: vendor google, architecture swiftshader) the loader skips
    webgpu/fp32 when the manifest says it failed on google/swiftshader adapters; the same manifest
    with the failure on another vendor's adapters plans webgpu/fp32 first on this adapter."""
    from pipeline.verify.engines.browser.chromium import launch_browser
    from loader_helpers import LOAD_AND_RUN, TEST_PREFIX, blank_pages_dir

    pages = blank_pages_dir(tmp_path / "pages")
    here = _with_adapter_failure(package, tmp_path / "here", {"vendor": "Google", "architecture": "swiftshader", "description": "", "fallback": True})
    with launch_browser() as browser, running_server(here, {TEST_PREFIX: pages}) as server:
        page = browser.new_context().new_page()
        page.goto(server.url + TEST_PREFIX[1:] + "blank.html")
        loaded = page.evaluate(LOAD_AND_RUN, {"base": server.url, "options": {"cache": False}, "run": False})
        # the loader's own plan on this device's adapter, the failure moved to nvidia/hopper
        elsewhere = page.evaluate("""async (base) => {
            const { planAttempts } = await import(base + 'loader/policy.js');
            const { adapterInfo, probeWebGpu } = await import(base + 'loader/runtime.js');
            const manifest = await (await fetch(base + 'manifest.json')).json();
            const adapter = await adapterInfo((await probeWebGpu()).adapter);
            const moved = structuredClone(manifest);
            moved.verification.adapters[0].adapter = { vendor: 'nvidia', architecture: 'hopper', description: '', fallback: false };
            const plan = (m) => planAttempts(m, { chain: ['webgpu', 'wasm'], features: new Set(), adapter }).attempts;
            return { adapter, here: plan(manifest), elsewhere: plan(moved) };
        }""", server.url)
        page.context.close()
    assert loaded["ok"], loaded
    assert (loaded["info"]["ep"], loaded["info"]["variant"]) == ("wasm", "fp32")
    skipped = loaded["info"]["skipped"]
    assert [(s["ep"], s["variant"]) for s in skipped] == [("webgpu", "fp32")]
    assert skipped[0]["reason"] == "failed its browser check at build time on Google swiftshader adapters: y: rel_l2 0.4 > 0.001"
    assert elsewhere["adapter"]["vendor"] == "google" and elsewhere["adapter"]["architecture"] == "swiftshader"
    assert elsewhere["here"] == [{"ep": "wasm", "variant": "fp32"}]
    assert elsewhere["elsewhere"] == [{"ep": "webgpu", "variant": "fp32"}, {"ep": "wasm", "variant": "fp32"}]


def test_endpoint_options_parse_and_never_print_tokens(package):
    from pipeline.verify.engines.browser.remote import CDP, LOCAL, parse_endpoints

    endpoints = parse_endpoints([f"wss://grid.example:443/playwright?token={TOKEN}, local", "ws://10.0.0.2:3000/"], ["http://10.0.0.3:9222"])
    assert [e.kind for e in endpoints] == [CONNECT, LOCAL, CONNECT, CDP]
    assert [e.label for e in endpoints] == ["wss://grid.example:443/playwright?token=***", "local", "ws://10.0.0.2:3000/", "http://10.0.0.3:9222 (cdp)"]
    assert parse_endpoints(["ws://a:1/,ws://a:1/"], None) == [Endpoint(CONNECT, "ws://a:1/")]
    cloud = Endpoint(CONNECT, f"wss://user:pw@cloud.example/v1/{TOKEN}/chromium")
    assert cloud.label == "wss://***@cloud.example/v1/***/chromium"
    scrubbed = cloud.scrub(f"WebSocket error: wss://user:pw@cloud.example/v1/{TOKEN}/chromium 401 (token {TOKEN}, pw)")
    assert TOKEN not in scrubbed and "pw@" not in scrubbed and "wss://***@cloud.example/v1/***/chromium" in scrubbed
    # bad input: one line, exit 2, the token not echoed
    for args, expected in (
        (["--browser", f"http://grid:3000/?token={TOKEN}"], "error: --browser http://grid:3000/?token=***: not a ws:// or wss:// URL (or `local`)"),
        (["--cdp", "grid:9222"], "error: --cdp grid:9222: not a ws:// or wss:// or http:// or https:// URL"),
        (["--browser", "ws://grid:3000/", "--runtime", "1.30.0"], "error: --runtime with --browser/--cdp"),
    ):
        result = runner.invoke(app, ["verify", str(package), *args])
        assert result.exit_code == 2 and TOKEN not in result.output, result.output
        assert result.output.startswith(expected), result.output
    built = runner.invoke(app, ["build", "model.onnx", "--no-browser"], env={"PACK_BROWSERS": "ws://grid:3000/"})
    assert built.exit_code == 2 and "error: --no-browser with --browser/--cdp (or PACK_BROWSERS): choose one" in built.output


def _check(device: str, adapter: dict | None, ep: str, variant: str, status: str, detail: str = "") -> dict:
    check = {"stage": "browser", "bundle": "webgpu", "ep": ep, "variant": variant, "status": status, "output": "y",
             "device": device, "adapter": adapter, "endpoint": f"ws://{device}/"}
    return {**check, "detail": detail} if detail else check


def test_manifest_records_per_adapter_class_and_merges_devices(package):
    from pipeline.manifest import adapter_runs, refused, runs_from_checks, validate

    nvidia = {"vendor": "nvidia", "architecture": "hopper", "description": "NVIDIA H200", "fallback": False}
    apple = {"vendor": "apple", "architecture": "metal-3", "description": "", "fallback": False}
    checks = [
        _check("win-nvidia", nvidia, "webgpu", "fp16", "failed", "rel_l2 0.3 > 0.03"),
        _check("win-nvidia", nvidia, "webgpu", "fp32", "passed"),
        _check("mac", apple, "webgpu", "fp16", "passed"),
        _check("mac", apple, "webgpu", "fp32", "failed", "NaN"),
        _check("lost", apple, "webgpu", "fp16", "error", "ws://lost/: connection lost"),
        _check("swiftshader", {"vendor": "google", "architecture": "swiftshader", "description": "", "fallback": True}, "webgpu", "fp16", "not-verifiable", "no shader-f16"),
    ]
    # one device's failure is that class's; the package-wide run passes where any device passed it
    runs = runs_from_checks(checks, "browser")
    assert [(r["variant"], r["status"]) for r in runs] == [("fp16", "passed"), ("fp32", "passed")]
    only_failed = runs_from_checks([c for c in checks if c["device"] == "mac" and c["variant"] == "fp32"] + [checks[-1]], "browser")
    assert [(r["variant"], r["status"]) for r in only_failed] == [("fp16", "not-verifiable"), ("fp32", "failed")]
    adapters = adapter_runs(checks)
    by_vendor = {entry["adapter"]["vendor"]: entry for entry in adapters}
    assert set(by_vendor) == {"nvidia", "apple", "google"}
    assert [(r["variant"], r["status"]) for r in by_vendor["nvidia"]["runs"]] == [("fp16", "failed"), ("fp32", "passed")]
    assert by_vendor["nvidia"]["runs"][0]["detail"] == "y: rel_l2 0.3 > 0.03"
    assert [(r["variant"], r["status"]) for r in by_vendor["apple"]["runs"]] == [("fp16", "passed"), ("fp32", "failed")]  # the error is no verdict
    manifest = read_manifest(package)
    manifest["verification"] = {"browser": True, "passed": False, "runs": runs, "adapters": adapters}
    validate(manifest, "manifest.json")
    assert refused(manifest, "webgpu", "webgpu", "fp16") is None
    assert refused(manifest, "webgpu", "webgpu", "fp16", {"vendor": "NVIDIA", "architecture": "hopper", "description": ""})["status"] == "failed"
    assert refused(manifest, "webgpu", "webgpu", "fp16", {"vendor": "nvidia", "architecture": "ampere", "description": ""}) is None
    assert refused(manifest, "webgpu", "webgpu", "fp32", apple)["detail"] == "y: NaN"
    with pytest.raises(Exception, match='key "verification.adapters\\[0\\].adapter.fallback"'):
        broken = json.loads(json.dumps(manifest))
        del broken["verification"]["adapters"][0]["adapter"]["fallback"]
        validate(broken, "manifest.json")


@pytest.mark.browser
def test_cdp_endpoint_gets_the_local_package_through_the_connection(package, tmp_path):
    """--cdp: a Chromium reached only over CDP, in a namespace that cannot reach this machine's
    loopback, loads the package's files from pack's local server: answered here, per request."""
    from pipeline.verify.engines.browser.remote import CDP, open_browser

    reason = remote_helpers.available()
    if reason:
        pytest.skip(reason)
    remote = remote_helpers.start_cdp_browser(tmp_path / "profile")
    try:
        with running_server(package) as server, open_browser(Endpoint(CDP, f"http://{remote.address}:{remote.port}")) as browser:
            port = int(server.url.rstrip("/").rsplit(":", 1)[1])
            inside = remote.in_namespace("python3", "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)")
            assert inside.returncode != 0 and "ConnectionRefusedError" in inside.stderr
            page = browser.new_context().new_page()
            page.goto(server.url + "manifest.json")
            assert json.loads(page.evaluate("() => document.body.innerText"))["name"] == "test"
            # a compressed file too: the page gets the decoded bytes
            sample = read_manifest(package)["sample"]["file"]
            size = page.evaluate("async (u) => (await (await fetch(u)).arrayBuffer()).byteLength", server.url + sample)
            assert size == read_manifest(package)["files"][sample]["size"]
            assert any(request.path == "/" + sample for request in server.requests)
    finally:
        remote_helpers.stop_remote_server(remote)


def test_build_verification_and_measurements_take_every_browser():
    """What the build writes from a grid's checks and report: `verification.adapters` beside the
    merged runs, an endpoint's error as no run, and each endpoint's production times."""
    from pipeline.stages.judge import verification as _verification
    from pipeline.manifest import measurements_from

    swiftshader = {"vendor": "google", "architecture": "swiftshader", "description": "", "fallback": True}
    checks = [_check("a", swiftshader, "webgpu", "fp32", "passed"), _check("b", swiftshader, "webgpu", "fp32", "failed", "NaN"),
              _check("c", None, "webgpu", "fp32", "error", "ws://c/: cannot connect")]
    verification = _verification(checks)
    assert verification["passed"] is False and verification["browser"] is True
    assert [(r["ep"], r["status"]) for r in verification["runs"]] == [("webgpu", "passed")]
    assert [[(r["ep"], r["status"]) for r in entry["runs"]] for entry in verification["adapters"]] == [[("webgpu", "failed")]]
    assert "adapters" not in _verification([{k: v for k, v in checks[0].items() if k not in ("device", "adapter")}])
    run = {"bundle": "webgpu", "ep": "webgpu", "variant": "fp32", "status": "passed",
           "timings_ms": {"session_create_ms": 9.0, "first_run_ms": 5.0, "steady_run_ms": 2.0}}
    report = {"chromium": "150.0", "adapter": {"available": True, **swiftshader}, "runs": [run]}
    grid = {"endpoints": [{"browser": report}, {"browser": {**report, "runs": [{**run, "timings_ms": {**run["timings_ms"], "steady_run_ms": 1.0}}]}},
                          {"browser": None}]}
    assert [m["steadyMs"] for m in measurements_from(grid)] == [1.0, 2.0]


@pytest.mark.browser
def test_a_budget_spent_mid_run_is_an_error_not_a_verdict(package, references):
    """The per-endpoint budget also ends a browser that works: its unfinished runs are `error`
    ("time budget spent"), never `failed` by a cut-short watchdog."""
    from pipeline.verify.engines.browser.remote import LOCAL

    start = time.monotonic()
    result = verify_on_endpoints(package, references, thresholds_for(package), [Endpoint(LOCAL)], budget_s=1)
    assert time.monotonic() - start < 60
    outcome = result.outcomes[0]
    assert outcome.status == "error" and len(outcome.errors) == 1 and outcome.errors[0].startswith("time budget spent ")
    assert "failed" not in {c["status"] for c in result.checks} and {c["status"] for c in result.checks} >= {"error"}
    assert all(c["detail"].startswith("local: time budget spent ") for c in result.checks if c["status"] == "error")
