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
from pipeline.verify.browser.grid import exit_policy, verify_on_endpoints
from pipeline.verify.browser.remote import CONNECT, Endpoint
from pipeline.verify.browser.server import running_server
from tests import remote_helpers
from tests.browser_helpers import Variant, negative_step_slice_model, reference_of, thresholds_for, write_package

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
    servers = []
    try:
        for _ in range(3):
            servers.append(remote_helpers.start_remote_server())
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
    document = json.loads(result.stdout)
    browser = document["browser"]
    endpoints = {entry["endpoint"]: entry for entry in browser["endpoints"]}
    first_label = f"{first.url}?***"
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
    assert "cannot connect" in lost["errors"][1]
    errors = [c for c in document["checks"] if c.get("endpoint") == doomed.url and c["status"] == "error"]
    assert errors and all(c["detail"].startswith(f"{doomed.url}: ") and "retried: " in c["detail"] for c in errors)
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
        result = verify_on_endpoints(package, references, thresholds_for(package), endpoints, budget_s=8)
    finally:
        silent.close()
    assert time.monotonic() - start < 30
    assert [o.status for o in result.outcomes] == ["error", "error"]
    dead_outcome = result.outcomes[0]
    assert len(dead_outcome.errors) == 2 and all("cannot connect" in e and "ECONNREFUSED" in e for e in dead_outcome.errors)
    assert TOKEN not in json.dumps(result.report) + json.dumps(result.checks)
    assert {c["status"] for c in result.checks} == {"error"} and len(result.checks) == 4
    from pipeline.verify.browser.grid import GridSettings

    assert exit_policy(result, GridSettings(tuple(endpoints)))[0] is True  # nothing finished
    result.outcomes[0].finished = True  # as if the first had finished
    assert exit_policy(result, GridSettings(tuple(endpoints)))[0] is False
    assert exit_policy(result, GridSettings(tuple(endpoints), require_all=True))[0] is True
