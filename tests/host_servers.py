"""Real web servers configured from what `pack export --host` writes, for tests and benchmarks:
nginx and Apache from Debian and `serve` from npm, each started on a free loopback port as the
current user (Apache, which refuses to serve as root, drops to `nobody`), stopped on exit; a
relay that counts the bytes a server sends, whoever asks (a page or its service worker); and the
app page that loads an exported package as an app would and reports what it got."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from npm_helpers import locked_node_modules

HOST_TOOLS = Path(__file__).resolve().parent / "hosts"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(port: int, process: subprocess.Popen, log: Path | None = None) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server exited {process.returncode}: {process.stdout.read() if process.stdout else ''} {log.read_text() if log and log.exists() else ''}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"the server did not listen on {port} in 20 s")


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextmanager
def _running(command: list[str], port: int, log: Path | None = None, env: dict[str, str] | None = None) -> Iterator[str]:
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        wait_for(port, process, log)
        yield f"http://127.0.0.1:{port}/"
    finally:
        stop(process)


def _binary(name: str, package: str) -> str:
    found = shutil.which(name) or (f"/usr/sbin/{name}" if Path(f"/usr/sbin/{name}").exists() else None)
    if found is None:
        raise AssertionError(f"{name} is not installed: scripts/setup.sh installs it (apt-get install {package})")
    return found


@contextmanager
def nginx(site: Path, snippets: list[Path], run: Path) -> Iterator[str]:
    """nginx serving `site` with `snippets` (an export's pack-site.nginx.conf, then each package's
    <name>.nginx.conf) included in its server block, as docs/hosts.md says; `run` holds its pid,
    logs and temp folders. Yields the base URL."""
    port = free_port()
    temp = "".join(f"    {kind}_temp_path {run / kind};\n" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    conf = run / "nginx.conf"
    conf.write_text(
        f"daemon off;\nmaster_process off;\npid {run / 'nginx.pid'};\nerror_log {run / 'error.log'};\nevents {{}}\n"
        f"http {{\n    access_log off;\n    include /etc/nginx/mime.types;\n{temp}"
        f"    server {{\n        listen 127.0.0.1:{port};\n        root {site};\n"
        + "".join(f"        include {snippet};\n" for snippet in snippets)
        + "    }\n}\n"
    )
    with _running([_binary("nginx", "nginx-light"), "-c", str(conf), "-p", str(run)], port, run / "error.log") as url:
        yield url


@contextmanager
def apache(site: Path, run: Path) -> Iterator[str]:
    """Apache with `site` as its DocumentRoot and `.htaccess` files read (AllowOverride FileInfo, the
    modules docs/hosts.md names). `site` must be readable by `nobody` when running as root."""
    port = free_port()
    modules = Path("/usr/lib/apache2/modules")
    loaded = "".join(f"LoadModule {name}_module {modules / f'mod_{name}.so'}\n" for name in ("mpm_event", "authz_core", "mime", "headers", "rewrite", "dir"))
    conf = run / "httpd.conf"
    conf.write_text(
        f"ServerRoot {run}\n{loaded}"
        + ("User nobody\nGroup nogroup\n" if os.geteuid() == 0 else "")
        + f"Listen 127.0.0.1:{port}\nServerName 127.0.0.1\nPidFile {run / 'httpd.pid'}\nErrorLog {run / 'error.log'}\n"
        f"DefaultRuntimeDir {run}\nMutex file:{run}\nTypesConfig /etc/mime.types\nDocumentRoot {site}\n"
        f"<Directory />\n    AllowOverride None\n    Require all denied\n</Directory>\n"
        f"<Directory {site}>\n    AllowOverride FileInfo\n    Require all granted\n</Directory>\n"
    )
    with _running([_binary("apache2", "apache2"), "-f", str(conf), "-DFOREGROUND"], port, run / "error.log") as url:
        yield url


def host_tools() -> Path:
    """The node_modules of tests/hosts/package-lock.json: serve and the hosts' config parsers."""
    return locked_node_modules(HOST_TOOLS, "host-tools/", "serve")


@contextmanager
def serve(site: Path, config: Path) -> Iterator[str]:
    """`serve` from npm serving `site` with `config` (an export's serve.json)."""
    port = free_port()
    command = [str(host_tools() / ".bin" / "serve"), "--no-clipboard", "--no-port-switching", "-L", "-l", f"tcp://127.0.0.1:{port}", "-c", str(config), str(site)]
    with _running(command, port, env={**os.environ, "NO_UPDATE_CHECK": "1"}) as url:
        yield url


class ByteCount:
    """Bytes a relay passed from the server to its clients, response headers included."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sent = 0

    def add(self, count: int) -> None:
        with self._lock:
            self.sent += count


@contextmanager
def counting_relay(upstream: str) -> Iterator[tuple[str, ByteCount]]:
    """A TCP relay on its own loopback port in front of `upstream` (a base URL on 127.0.0.1): what
    the server sends through it is counted, for a page, its workers and its service worker alike
    (the browser's own counters miss what a service worker fetches). Yields (base URL, count)."""
    target = ("127.0.0.1", int(upstream.rstrip("/").rsplit(":", 1)[1]))
    listener = socket.create_server(("127.0.0.1", 0))
    count = ByteCount()
    stopping = threading.Event()

    def pump(source: socket.socket, sink: socket.socket, counted: bool) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
                if counted:
                    count.add(len(chunk))
        except OSError:
            pass
        finally:
            for end in (sink, source):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def accept() -> None:
        while not stopping.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(target)
            threading.Thread(target=pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=pump, args=(server, client, True), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/", count
    finally:
        stopping.set()
        listener.close()


APP_PAGE = Path(__file__).resolve().parent / "data" / "host_page.html"


def app_page(site: Path, shim: bool = False) -> None:
    """The app page as `site`/index.html; `shim`: it loads coi-serviceworker.js first."""
    text = APP_PAGE.read_text()
    (site / "index.html").write_text(text.replace("<!-- shim -->", '<script src="coi-serviceworker.js"></script>') if shim else text)


def page_result(browser, url: str, isolated: bool, timeout_s: float = 90) -> dict:
    """window.result of the app page at `url` in a fresh context (empty caches), once it is there:
    with `isolated`, the result of a cross-origin isolated document (the shim reloads the page
    once, and the first document's result is not the one). Adds `seconds`: from the navigation to
    the result, reloads included."""
    context = browser.new_context()
    try:
        page = context.new_page()
        console: list[str] = []
        page.on("console", lambda message: console.append(f"{message.type}: {message.text}"))
        started = time.monotonic()
        page.goto(url)
        result = None
        while time.monotonic() - started < timeout_s:
            try:
                result = page.evaluate("window.result && (window.result.isolated || !%s) ? window.result : null" % json.dumps(isolated))
            except Exception:  # the context went away with the reload
                result = None
            if result:
                break
            time.sleep(0.1)
        seconds = time.monotonic() - started
    finally:
        context.close()
    assert result, f"{url}: no result in {timeout_s:.0f} s; console: {console[-10:]}"
    assert result["ok"], (result, console[-10:])
    return {**result, "seconds": round(seconds, 2)}
