"""No secret in any output, on every path: a distinct secret planted in each input channel (source URL
user info and query, recipe `[source] uri`, --endpoint-url, --public-url, --browser/--cdp URLs, AWS
keys, proxy variables), each command's success and failure paths run (build, verify, publish with
--dry-run and --json, serve, export, report), and stdout, stderr and every file written (package,
reports, lock, the cache's new files) searched for every secret. Progress lines are drawn (as on a
terminal) so they are searched too. The masking rule itself: pipeline/urls.py."""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from build_helpers import conv_model, save
from pipeline.cli import app
from process_helpers import interruptible
from publish_helpers import isolate_aws_env, new_bucket

REPO = Path(__file__).resolve().parent.parent
# one secret per channel, each distinct, so a finding names the channel it leaked from
SECRETS = {
    "source user info": "srcpass-Q1w9",
    "source query": "srctoken-Z7k3",
    "source signature": "srcsig-M4p8",
    "recipe uri": "recipesig-H2v6",
    "recipe uri credential": "recipecred-J5n1",
    "--endpoint-url": "endpointpass-T3c7",
    "--public-url": "publicpass-R8x2",
    "--browser": "browserpass-L6d4",
    "--browser token": "browsertoken-P9s5",
    "--cdp": "cdppass-F1g3",
    "AWS_SECRET_ACCESS_KEY": "awssecret-V7b2",
    "AWS_SESSION_TOKEN": "awssession-N4h8",
    "proxy variable": "proxypass-K5m9",
}
SOURCE_USER = "srcuser"
CACHE = Path(os.environ["PACK_CACHE_DIR"])  # tests/conftest.py's shared cache


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class _Model(http.server.BaseHTTPRequestHandler):
    """Serves a model by its file name (any folder, any query); a request with Basic auth must carry
    the test's credentials (else 401), as a private model host does."""

    bodies: dict[str, bytes] = {}
    authorizations: list[str | None] = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        sent = self.headers.get("Authorization")
        type(self).authorizations.append(sent)
        expected = "Basic " + base64.b64encode(f"{SOURCE_USER}:{SECRETS['source user info']}".encode()).decode()
        if sent is not None and sent != expected:
            self.send_response(401)
            self.end_headers()
            return
        body = self.bodies[self.path.partition("?")[0].rsplit("/", 1)[-1]]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A model server, the models' sha256, and the time the module started (the cache's files
    written since are searched). Each run serves models never seen before (a fresh doc string),
    so every download really happens: the shared cache keeps files by sha256."""
    folder = tmp_path_factory.mktemp("secrets")
    for name in ("tiny.onnx", "private.onnx"):
        model = conv_model(channels=2, size=8)
        model.doc_string = f"{name} {uuid.uuid4()}"
        _Model.bodies[name] = save(model, folder / name).read_bytes()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Model)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield {"folder": folder, "server": f"127.0.0.1:{httpd.server_address[1]}", "started": time.time() - 1,
           **{name: hashlib.sha256(body).hexdigest() for name, body in _Model.bodies.items()}}
    httpd.shutdown()


@pytest.fixture
def env(monkeypatch, tmp_path, world):
    """AWS keys and proxy variables holding secrets (loopback exempt from the proxy), no webgpu-kernels
    stage (the browser-free builds stay fast), and progress drawn as on a terminal."""
    isolate_aws_env(monkeypatch, tmp_path)  # clears PACK_* too
    monkeypatch.setenv("PACK_CACHE_DIR", str(CACHE))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAPACKTESTKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRETS["AWS_SECRET_ACCESS_KEY"])
    monkeypatch.setenv("AWS_SESSION_TOKEN", SECRETS["AWS_SESSION_TOKEN"])
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    proxy = f"http://proxyuser:{SECRETS['proxy variable']}@127.0.0.1:{closed_port()}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, proxy)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("PACK_WEBGPU_KERNELS", "off")
    monkeypatch.setattr("pipeline.progress._isatty", lambda stream: True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def leaks(texts: dict[str, str], folders: list[Path], since: float | None = None) -> list[str]:
    """'channel in where' for every secret found in the texts or in a file under the folders (only
    files changed since `since` where given)."""
    found = []
    for where, text in texts.items():
        found += [f"{channel} in {where}" for channel, secret in SECRETS.items() if secret in text]
    for folder in folders:
        walked = [Path(root) / name for root, _, names in os.walk(folder) for name in names]  # os.walk skips folders removed meanwhile
        for path in walked if folder.is_dir() else [folder] if folder.exists() else []:
            try:  # the shared cache: other test workers write and remove scratch files while this walks it
                if not path.is_file() or path.is_symlink() or (since is not None and path.stat().st_mtime < since):
                    continue
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            found += [f"{channel} in {path.name}" for channel, secret in SECRETS.items() if secret.encode() in data]
    return found


def pack(*args: str):
    return CliRunner().invoke(app, list(args))


def check(result, exit_code: int, *folders: Path, world=None) -> None:
    """The command ended as expected, without a traceback, and no secret appears in its output or
    files (everything wrong is listed at once)."""
    output = f"{result.stdout}\n{result.stderr}"
    cache = [CACHE] if world else []
    problems = leaks({"stdout": result.stdout, "stderr": result.stderr}, list(folders)) + leaks({}, cache, world and world["started"])
    if result.exit_code != exit_code:
        problems.append(f"exit {result.exit_code}, expected {exit_code}: {output[-1500:]}")
    if "Traceback" in output or not (result.exception is None or isinstance(result.exception, SystemExit)):
        problems.append(f"traceback: {result.exception!r}")
    if exit_code == 2:  # one line, after any progress lines
        errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
        if len(errors) != 1 or not result.stderr.rstrip().endswith(errors[0]):
            problems.append(f"not one error line: {result.stderr[-1500:]}")
    assert not problems, problems


def signed(world, path: str = "tiny.onnx", signature: str = SECRETS["source signature"]) -> str:
    return f"http://{world['server']}/{path}?X-Amz-Signature={signature}&token={SECRETS['source query']}"


def write_recipe(folder: Path, uri: str) -> Path:
    recipe = folder / "tiny.toml"
    recipe.write_text(f'name = "tiny"\n[source]\nuri = "{uri}"\n')
    return recipe


@pytest.fixture(scope="module")
def package(tmp_path_factory, world):
    """One package built from a recipe whose [source] uri is a signed URL (pinned on first
    download), for the verify, export, report and publish paths."""
    folder = tmp_path_factory.mktemp("built")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PACK_WEBGPU_KERNELS", "off")
        patch.setattr("pipeline.progress._isatty", lambda stream: True)  # the download bar and "pinned" line drawn
        uri = f"http://{world['server']}/tiny.onnx?X-Amz-Credential={SECRETS['recipe uri credential']}&X-Amz-Signature={SECRETS['recipe uri']}"
        recipe = write_recipe(folder, uri)
        result = pack("build", str(recipe), "--no-browser", "--out", str(folder / "dist"))
    check(result, 0, folder / "dist", folder / "tiny.lock.json", world=world)  # the recipe is the input: not searched
    return folder / "dist" / "tiny"


# --- the rule ---------------------------------------------------------------------------------


def test_the_masking_rule():
    from pipeline.urls import mask_url, mask_urls, scrub

    assert mask_url("https://user:pw@host:8443/a/m.onnx?X-Amz-Signature=abc&token=t&flag#frag") == "https://***@host:8443/a/m.onnx?X-Amz-Signature=***&token=***&***#***"
    assert mask_url("wss://cloud.example/v1/0123456789abcdefXYZ/chromium", path_keys=True) == "wss://cloud.example/v1/***/chromium"
    assert mask_url("https://huggingface.co/x/resolve/c3c0c9e468934d62e79c329e35d82dd09ff8c444/m.onnx") .endswith("/c3c0c9e468934d62e79c329e35d82dd09ff8c444/m.onnx")
    assert mask_url("pypi:name==1.0!m.onnx") == "pypi:name==1.0!m.onnx"
    assert mask_urls("source http://a/m.onnx?token=SECRET: cannot connect") == "source http://a/m.onnx?token=***: cannot connect"
    assert scrub("nonnumeric port: 'pass-1234@host'", "https://user:pass-1234@host/m.onnx") == "nonnumeric port: '***@host'"


# --- build ------------------------------------------------------------------------------------


def test_build_from_a_signed_recipe_uri_pins_it_without_the_signature(package, world, env):
    lock = package.parent.parent / "tiny.lock.json"
    pin = json.loads(lock.read_text())["tiny"]["source"]
    assert pin["sha256"] == world["tiny.onnx"] and pin["uri"].endswith("/tiny.onnx?X-Amz-Credential=***&X-Amz-Signature=***")
    report = json.loads((package / "report.json").read_text())
    assert report["source"]["uri"] == pin["uri"] and report["source"]["checked"] == "pinned now"
    # signed again, the URL still names the pinned file: checked against the pin, nothing re-pinned
    recipe = write_recipe(package.parent.parent, f"http://{world['server']}/tiny.onnx?X-Amz-Credential=other-0000&X-Amz-Signature=resigned-0000")
    result = pack("build", str(recipe), "--no-browser", "--json", "--out", str(env / "dist"), "--no-reuse")
    check(result, 0, env, lock, world=world)
    assert json.loads(result.stdout)["source"]["checked"] == "lock"


def test_build_with_credentials_in_the_url_sends_basic_auth_and_records_none(world, env):
    _Model.authorizations = []
    url = f"http://{SOURCE_USER}:{SECRETS['source user info']}@{world['server']}/private.onnx?token={SECRETS['source query']}"
    result = pack("build", url, "--sha256", world["private.onnx"], "--no-browser", "--out", str(env / "dist"), "--no-reuse")
    check(result, 0, env, world=world)
    assert _Model.authorizations and all(sent and sent.startswith("Basic ") for sent in _Model.authorizations)
    assert json.loads((env / "dist" / "private" / "report.json").read_text())["source"]["uri"].startswith("http://***@127.0.0.1:")


@pytest.mark.parametrize("case", ["unreachable", "no port", "wrong sha256", "refused credentials", "dead proxy", "unpinned"])
def test_build_failures_name_the_source_masked(case, world, env, monkeypatch):
    sha = hashlib.sha256(case.encode()).hexdigest()  # no cached file has it: the download is tried
    url = signed(world)
    if case == "unreachable":
        url = f"http://{SOURCE_USER}:{SECRETS['source user info']}@127.0.0.1:{closed_port()}/tiny.onnx?token={SECRETS['source query']}"
    elif case == "no port":  # http.client once read `user:pass@host` as a host and a port: a traceback
        url = f"https://{SOURCE_USER}:{SECRETS['source user info']}@127.0.0.1/tiny.onnx?token={SECRETS['source query']}"
    elif case == "refused credentials":
        url = f"http://{SOURCE_USER}:wrong-{SECRETS['source user info']}@{world['server']}/tiny.onnx"
    elif case == "dead proxy":
        monkeypatch.delenv("NO_PROXY")
        monkeypatch.delenv("no_proxy")
    args = ["build", url, "--no-browser", "--out", str(env / "dist"), "--no-reuse"]
    result = pack(*args, *([] if case == "unpinned" else ["--sha256", sha]))
    check(result, 2, env, world=world)
    assert "/tiny.onnx" in result.stderr and "***" in result.stderr


# --- verify -----------------------------------------------------------------------------------


@pytest.mark.parametrize("option, url", [
    ("--browser", f"ws://user:{SECRETS['--browser']}@127.0.0.1:{{port}}/playwright?token={SECRETS['--browser token']}"),
    ("--cdp", f"http://user:{SECRETS['--cdp']}@127.0.0.1:{{port}}/?token={SECRETS['--browser token']}"),
    ("--browser", f"http://user:{SECRETS['--browser']}@127.0.0.1:{{port}}/?token={SECRETS['--browser token']}"),  # not ws://
])
def test_verify_on_an_unreachable_or_wrong_browser_url_masks_it(option, url, package, env):
    result = pack("verify", str(package), option, url.format(port=closed_port()), "--json")
    assert result.exit_code in (1, 2), result.output
    check(result, result.exit_code, package)


def test_verify_report_and_export_with_secrets_in_the_environment(package, world, env):
    check(pack("report", str(package), "--json"), 0, package, world=world)
    check(pack("report", str(env / "nothing")), 2, world=world)
    check(pack("export", str(package), str(env / "app"), "--json"), 0, env / "app", package, world=world)
    (env / "file").write_text("x")
    check(pack("export", str(package), str(env / "file")), 2, world=world)
    check(pack("verify", str(env / "nothing")), 2, world=world)


@pytest.mark.slow
def test_verify_in_the_local_browser_with_secrets_in_the_environment(package, world, env):
    check(pack("verify", str(package), "--json"), 0, package, world=world)


# --- publish ----------------------------------------------------------------------------------


@pytest.fixture
def bucket(s3_server, env):
    """A public bucket on moto (any key pair is accepted: the environment's secret ones sign)."""
    return new_bucket(s3_server)


def test_publish_with_secret_keys_succeeds_without_printing_them(package, s3_server, bucket, env, world):
    common = ["publish", str(package), "--bucket", bucket, "--endpoint-url", s3_server.url, "--public-url", f"{s3_server.url}/{bucket}"]
    for extra in (["--dry-run"], ["--dry-run", "--json"], ["--json"], []):
        check(pack(*common, *extra), 0, package, world=world)


@pytest.mark.parametrize("option", ["--endpoint-url", "--public-url"])
@pytest.mark.parametrize("form", ["user info", "query"])
@pytest.mark.parametrize("extra", [[], ["--dry-run"], ["--json"], ["--dry-run", "--json"]])
def test_publish_refuses_credentials_in_its_urls(option, form, extra, package, s3_server, bucket, env, world):
    secret = SECRETS[option]
    url = f"http://user:{secret}@127.0.0.1:{s3_server.port}/" if form == "user info" else f"http://127.0.0.1:{s3_server.port}/?X-Amz-Signature={secret}"
    others = ["--endpoint-url", s3_server.url] if option == "--public-url" else []
    result = pack("publish", str(package), "--bucket", bucket, option, url, *others, *extra)
    check(result, 2, package, world=world)
    assert f"{option} http://" in result.stderr and "***" in result.stderr


@pytest.mark.parametrize("extra", [[], ["--dry-run"], ["--json"], ["--dry-run", "--json"]])
@pytest.mark.parametrize("case", ["unreachable endpoint", "dead proxy"])
def test_publish_failures_print_no_secret(case, extra, package, s3_server, env, world, monkeypatch):
    endpoint = f"http://127.0.0.1:{closed_port()}"
    if case == "dead proxy":
        endpoint = s3_server.url
        monkeypatch.delenv("NO_PROXY")
        monkeypatch.delenv("no_proxy")
    result = pack("publish", str(package), "--bucket", "b", "--endpoint-url", endpoint, *extra)
    check(result, 0 if "--dry-run" in extra else 2, package, world=world)


# --- serve ------------------------------------------------------------------------------------


def test_serve_with_secrets_in_the_environment(package, env, world):
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    child = interruptible([sys.executable, "-m", "pipeline.cli", "serve", str(package), "--port", "0"], cwd=REPO, env=environment,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        child.stdout.readline()
        index_url = child.stdout.readline().strip().split(": ", 1)[1]
        with urllib.request.urlopen(urllib.request.Request(index_url), timeout=30) as response:
            assert response.status == 200
    finally:
        child.send_signal(signal.SIGINT)
        stdout, stderr = child.communicate(timeout=30)
    assert child.returncode == 0 and "Traceback" not in stderr, stderr
    assert not leaks({"stdout": stdout, "stderr": stderr}, [package])
    failed = subprocess.run([sys.executable, "-m", "pipeline.cli", "serve", str(env / "nothing")], cwd=REPO, env=environment, capture_output=True, text=True, timeout=60)
    assert failed.returncode == 2 and failed.stderr.startswith("error: ")
    assert not leaks({"stdout": failed.stdout, "stderr": failed.stderr}, [])
