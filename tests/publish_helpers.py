"""Test helpers for `pack publish`: a real S3 server on loopback (moto in server mode), a loopback
HTTP(S) proxy in front of it that terminates TLS and injects faults, and a package fixture that
follows the package layout of docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import http.client
import ipaddress
import json
import logging
import os
import random
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

import boto3
import brotli
from botocore.config import Config

os.environ.setdefault("MOTO_DISABLE_GLOBAL_CORS", "true")  # must precede the moto import

from moto.server import ThreadedMotoServer  # noqa: E402

from pipeline.assets.files import describe_file  # noqa: E402
from pipeline.manifest import make_manifest, write_manifest  # noqa: E402

logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's access log drowns test output

ACCESS_KEY = "testing-key-id"
SECRET_KEY = "testing-secret"


# --- the S3 server --------------------------------------------------------------------------


class MotoS3:
    """moto's S3 in server mode on 127.0.0.1 (a real HTTP server, state kept in this process)."""

    def __init__(self) -> None:
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.port = port
        self.url = f"http://{host}:{port}"

    def client(self, endpoint_url: str | None = None, **config: object):
        """An admin client for setting up and inspecting buckets (not the one under test)."""
        return boto3.client(
            "s3",
            endpoint_url=endpoint_url or self.url,
            region_name="us-east-1",  # moto refuses CreateBucket signed for 'auto'
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            config=Config(s3={"addressing_style": "path"}, **config),
        )

    def stop(self) -> None:
        self.server.stop()


def isolate_aws_env(monkeypatch, home: Path) -> None:
    """No credentials, config files or metadata service from the machine running the tests."""
    for name in list(os.environ):
        if name.startswith(("AWS_", "PACK_")):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(home / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(home / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def use_test_credentials(monkeypatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")  # keeps failing-retry tests short


def new_bucket(s3: MotoS3, name: str | None = None, public: bool = True) -> str:
    """A bucket; `public`: anonymous reads allowed by a bucket policy, as a bucket serving
    packages to browsers has them (`pack publish` checks this from the outside)."""
    bucket = name or f"pack-{random.getrandbits(48):012x}"
    admin = s3.client()
    admin.create_bucket(Bucket=bucket)
    if public:
        admin.put_bucket_policy(Bucket=bucket, Policy=public_read_policy(bucket))
    return bucket


def public_read_policy(bucket: str) -> str:
    """The bucket policy docs/publish.md gives for public reads."""
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Sid": "PublicRead", "Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{bucket}/*"}],
    })


# --- TLS ------------------------------------------------------------------------------------


def make_loopback_cert(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (cert.pem doubles as the client's CA bundle)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


# --- the fault-injecting proxy --------------------------------------------------------------


@dataclass(frozen=True)
class SeenRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body_size: int

    @property
    def query(self) -> str:
        return self.path.partition("?")[2]


def is_upload(request: SeenRequest) -> bool:
    """PutObject or UploadPart (bodies of objects), not CreateMultipartUpload/Complete."""
    return request.method == "PUT" and request.body_size > 0 and "cors" not in request.query


def key_endswith(suffix: str) -> Callable[[SeenRequest], bool]:
    return lambda request: request.method == "PUT" and request.path.partition("?")[0].endswith(suffix)


@dataclass
class Fault:
    """From the `nth` request that `match`es on, `times` times (None: forever): `action` is
    'reset' (TCP RST before answering), 'status' (answer `status` with an S3 error `code`),
    'down' (the proxy stops listening and drops every connection: the server is gone),
    'cut' (read half the request's body, then TCP RST: the connection dies mid-upload), or
    'stall' (hold the request until `release` is set, then forward it)."""

    action: str
    match: Callable[[SeenRequest], bool] = lambda request: True
    nth: int = 1
    times: int | None = 1
    status: int = 500
    code: str = "InternalError"
    seen: int = 0
    fired: int = 0
    release: threading.Event = field(default_factory=threading.Event)

    def fires(self, request: SeenRequest) -> bool:
        if not self.match(request):
            return False
        self.seen += 1
        if self.seen < self.nth or (self.times is not None and self.fired >= self.times):
            return False
        self.fired += 1
        return True


_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "expect", "upgrade"}


class FaultProxy:
    """A loopback HTTP/1.1 proxy to `upstream_port`; TLS-terminating when given a cert/key."""

    def __init__(self, upstream_port: int, tls: tuple[Path, Path] | None = None, port: int = 0):
        self.upstream_port = upstream_port
        self.faults: list[Fault] = []
        self.requests: list[SeenRequest] = []
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._tls = None
        if tls is not None:
            self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._tls.load_cert_chain(str(tls[0]), str(tls[1]))
        self._server: ThreadingHTTPServer | None = None
        self.down = False  # set at once by a 'down' fault; the listener closes a moment later
        self.port = port
        self.start()

    @property
    def url(self) -> str:
        return f"{'https' if self._tls else 'http'}://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Listen (again) on the same port: a restarted server keeps moto's state behind it."""
        proxy = self

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

            def finish_request(self, request, client_address):  # TLS handshake in the worker thread
                if proxy._tls is not None:
                    try:
                        request = proxy._tls.wrap_socket(request, server_side=True)
                    except (ssl.SSLError, OSError):
                        return
                with proxy._lock:
                    proxy._connections.add(request)
                try:
                    super().finish_request(request, client_address)
                finally:
                    with proxy._lock:
                        proxy._connections.discard(request)
                    if proxy._tls is not None:
                        request.close()

            def handle_error(self, request, client_address):  # resets are the point; stay quiet
                pass

        self.down = False
        deadline = time.monotonic() + 5
        while True:  # a 'down' fault's listener may still be closing on another thread
            try:
                self._server = Server(("127.0.0.1", self.port), _handler_for(self))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        """Stop listening and reset every open connection."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            _reset(connection)

    def uploads(self) -> list[SeenRequest]:
        return [request for request in self.requests if is_upload(request)]

    def _decide(self, request: SeenRequest, mid_body: bool = False) -> Fault | None:
        """The fault for this request: 'cut' faults are decided before the body is read (`mid_body`,
        the declared size standing for the body's), the others after it."""
        with self._lock:
            if self.down:
                return Fault("reset")
            if not mid_body:
                self.requests.append(request)
            for fault in self.faults:
                if (fault.action == "cut") == mid_body and fault.fires(request):
                    return fault
        return None


def _reset(connection: socket.socket) -> None:
    try:
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        connection.close()
    except OSError:
        pass


def _handler_for(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _read_body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0], 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b""):
                            pass
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))

        def _relay(self) -> None:
            headers = {name.lower(): value for name, value in self.headers.items()}
            declared = int(headers.get("content-length", 0) or 0)
            if proxy._decide(SeenRequest(self.command, self.path, headers, declared), mid_body=True) is not None:
                self.rfile.read(declared // 2)
                self.close_connection = True
                _reset(self.connection)
                return
            body = self._read_body()
            request = SeenRequest(self.command, self.path, headers, len(body))
            fault = proxy._decide(request)
            if fault is not None and fault.action in ("reset", "down"):
                if fault.action == "down":
                    proxy.down = True
                    threading.Thread(target=proxy.stop, daemon=True).start()
                self.close_connection = True
                _reset(self.connection)
                return
            if fault is not None and fault.action == "stall":
                fault.release.wait(timeout=60)
            elif fault is not None:
                return self._answer_error(fault.status, fault.code)
            upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=60)
            try:
                forward = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                forward["Content-Length"] = str(len(body))
                upstream.request(self.command, self.path, body=body, headers=forward)
                answer = upstream.getresponse()
                payload = answer.read()
            finally:
                upstream.close()
            self.send_response(answer.status, answer.reason)
            for name, value in answer.getheaders():
                if name.lower() not in _HOP_BY_HOP and name.lower() not in ("content-length", "server", "date"):
                    self.send_header(name, value)
            length = answer.getheader("Content-Length") if self.command == "HEAD" else str(len(payload))
            self.send_header("Content-Length", length or "0")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        def _answer_error(self, status: int, code: str) -> None:
            xml = (
                f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                f"<Message>injected {code}</Message></Error>"
            ).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", "0" if self.command == "HEAD" else str(len(xml)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(xml)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay

    return Handler


# --- a package per docs/ARCHITECTURE.md -------------------------------------------------------


@dataclass
class BuiltPackage:
    root: Path
    name: str
    manifest: dict
    hashed: dict[str, bytes] = field(default_factory=dict)  # package path -> decoded bytes

    def key(self, prefix: str, path: str) -> str:
        return "/".join(part for part in (prefix, self.name, path) if part)


def _hashed_name(stem: str, ext: str, data: bytes) -> str:
    return f"{stem}.{hashlib.sha256(data).hexdigest()[:16]}.{ext}"


def write_package(
    dist: Path,
    name: str = "demo",
    version: str = "v1",
    model_bytes: int = 64 * 1024,
    incompressible_bytes: int = 0,
    verification: dict | None = None,
) -> BuiltPackage:
    """Write dist/<name>/ with models that change with `version` and runtime files that do not.

    `incompressible_bytes` > 0 adds a random-bytes fp32 model (no .br: brotli saves nothing), e.g.
    to force multipart uploads. `verification` replaces the default (browser-verified, passed).
    The manifest comes from the package's own builder, so it is what `pack build` would write.
    """
    root = dist / name
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(f"{name}-{version}")
    words = [f"{rng.random():.6f}".encode() for _ in range(64)]
    compressible = b" ".join(rng.choice(words) for _ in range(model_bytes // 9 + 1))[:model_bytes]
    runtime_js = b"export const ort = {version: '1.30.0'};\n" * 300
    runtime_wasm = b"\x00asm\x01\x00\x00\x00" + bytes(range(256)) * 40

    package = BuiltPackage(root=root, name=name, manifest={})
    files: dict[str, dict] = {}

    def add(stem: str, ext: str, data: bytes, media_type: str, folder: str = "") -> str:
        path = folder + _hashed_name(stem, ext, data)
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        digest = hashlib.sha256(data).digest()
        entry = {
            "sha256": digest.hex(),
            "integrity": "sha256-" + base64.b64encode(digest).decode(),
            "size": len(data),
            "mediaType": media_type,
            "encodings": {},
            "cache": "immutable",
        }
        encoded = brotli.compress(data, quality=5)
        if len(encoded) < len(data) * 0.9:
            (root / f"{path}.br").write_bytes(encoded)
            entry["encodings"] = {"br": {"path": f"{path}.br", "size": len(encoded)}}
        files[path] = entry
        package.hashed[path] = data
        return path

    fp16 = add("model.fp16", "onnx", compressible, "application/octet-stream")
    if incompressible_bytes:
        fp32 = add("model.fp32", "onnx", rng.randbytes(incompressible_bytes), "application/octet-stream")
    else:
        fp32 = add("model.fp32", "onnx", compressible + b"fp32", "application/octet-stream")
    sample = add("sample", "bin", struct.pack("<4f", 0.0, 1.0, 2.0, 3.0), "application/octet-stream")
    module = add("ort.wasm.bundle.min", "mjs", runtime_js, "text/javascript", folder="ort/")
    wasm = add("ort-wasm-simd-threaded", "wasm", runtime_wasm, "application/wasm", folder="ort/")

    (root / "loader.js").write_text(f"// loader {version}\nexport async function load() {{ return fetch('manifest.json'); }}\n")
    (root / "loader.d.ts").write_text("export declare function load(): Promise<Response>;\n")
    (root / "index.html").write_text(f"<!doctype html><title>{name} {version}</title><script type=module src=demo.js></script>\n")
    (root / "demo.js").write_text("import { load } from './loader.js';\nwindow.packDemo = await load();\n")
    # the build's record: in the folder, not in manifest.files (published only with --with-report)
    (root / "report.json").write_text(json.dumps({"name": name, "passed": True, "refused": None, "checks": []}))
    for plain in ("loader.js", "loader.d.ts", "index.html", "demo.js"):
        files[plain] = describe_file(root, plain).manifest_entry()

    manifest = make_manifest(
        name=name,
        files=files,
        variants={
            "fp16": {"precision": "fp16", "model": fp16, "requires": ["shader-f16"]},
            "fp32": {"precision": "fp32", "model": fp32, "requires": []},
        },
        variant_for={"webgpu": ["fp16", "fp32"], "wasm": ["fp32"]},
        inputs=[{"name": "x", "shape": [1, 4], "dtype": "float32"}],
        outputs=[{"name": "y", "shape": [1, 4], "dtype": "float32", "kind": "tensor"}],
        sample={"file": sample, "tensors": {"x": {"dtype": "float32", "dims": [1, 4], "offset": 0, "length": 16}}, "outputs": {}},
        runtime={
            "package": "onnxruntime-web",
            "version": "1.30.0",
            "bundles": {"wasm": {"entry": "onnxruntime-web/wasm", "module": module, "wasm": wasm}},
        },
        execution_providers={"desktop": ["wasm"], "apple-mobile": ["wasm"], "android": ["wasm"]},
        loader={"watchdogMs": 60000, "prewarm": True, "select": "chain"},
        verification=verification or {
            "browser": True,
            "passed": True,
            "runs": [{"stage": "browser", "bundle": "wasm", "ep": "wasm", "variant": "fp32", "status": "passed"}],
        },
    )
    write_manifest(root, manifest)
    package.manifest = manifest
    return package


# --- checks on the bucket ---------------------------------------------------------------------


def bucket_snapshot(client, bucket: str) -> dict[str, dict]:
    """key -> {body, headers...} of every object (bodies as stored, i.e. still brotli-encoded)."""
    snapshot: dict[str, dict] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            got = client.get_object(Bucket=bucket, Key=item["Key"])
            snapshot[item["Key"]] = {
                "body": got["Body"].read(),
                "content_type": got.get("ContentType"),
                "content_encoding": got.get("ContentEncoding"),
                "cache_control": got.get("CacheControl"),
                "metadata": got.get("Metadata", {}),
            }
    return snapshot


def decoded_body(stored: dict) -> bytes:
    return brotli.decompress(stored["body"]) if stored["content_encoding"] == "br" else stored["body"]


def assert_manifests_complete(client, bucket: str, prefix: str = "") -> list[str]:
    """Every published manifest names only present objects, and the decoded bytes of each
    content-hashed one match its sha256 (files without a hash in their name, such as loader.js and
    index.html, are replaced in place after the manifest, so mid-publish they may still be the
    previous version). Returns the manifest keys checked."""
    snapshot = bucket_snapshot(client, bucket)
    manifests = [key for key in snapshot if key.endswith("/manifest.json") and key.startswith(prefix)]
    for manifest_key in manifests:
        folder = manifest_key[: -len("manifest.json")]
        manifest = json.loads(snapshot[manifest_key]["body"])
        for path, entry in manifest["files"].items():
            stored = snapshot.get(folder + path)
            assert stored is not None, f"{manifest_key} names {path}, which is not in the bucket"
            if entry.get("cache", "immutable") == "immutable":
                assert hashlib.sha256(decoded_body(stored)).hexdigest() == entry["sha256"], f"{folder + path} differs"
    return manifests


# --- pytest fixtures (import them into a test module to use them) ----------------------------

import pytest  # noqa: E402


@pytest.fixture(scope="module")
def s3_server():
    server = MotoS3()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory) -> tuple[Path, Path]:
    return make_loopback_cert(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def aws_env(monkeypatch, tmp_path):
    """Test credentials only; nothing from the machine's AWS configuration."""
    isolate_aws_env(monkeypatch, tmp_path)
    use_test_credentials(monkeypatch)


@pytest.fixture(params=["http", "https"])
def proxy(request, s3_server, tls_files, aws_env, monkeypatch):
    """A fault proxy in front of moto, plain or TLS-terminating (boto3 uploads differently over https)."""
    tls = tls_files if request.param == "https" else None
    if tls is not None:
        monkeypatch.setenv("AWS_CA_BUNDLE", str(tls_files[0]))
    front = FaultProxy(s3_server.port, tls=tls)
    yield front
    front.stop()


def run_cli(*args: str):
    """`pack publish ARGS` through typer's CliRunner; stdout and stderr kept apart."""
    from typer.testing import CliRunner

    from pipeline.cli import app

    return CliRunner().invoke(app, ["publish", *args])


def run_json(*args: str) -> dict:
    result = run_cli(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)
