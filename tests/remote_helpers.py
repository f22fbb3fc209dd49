"""Remote browsers for tests: `playwright run-server` (the PyPI package's, from this venv) in its own
network namespace, so the browser it launches cannot reach this machine's loopback: whatever
it loads from pack's local server came through the Playwright connection (expose_network).

Needs root and `ip` (iproute2); `available()` says why not otherwise.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

_counter = itertools.count()


def available() -> str | None:
    """None when namespaces can be made here, else the reason."""
    if os.geteuid() != 0:
        return "needs root for `ip netns`"
    if shutil.which("ip") is None:
        return "needs iproute2 (`ip`)"
    if not Path("/usr/bin/chromium").is_file():
        return "needs Debian's chromium"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@dataclass
class RemoteServer:
    namespace: str
    address: str  # the namespace's end of the veth pair
    port: int
    process: subprocess.Popen
    # TMPDIR of what runs in the namespace: the servers are killed, so Playwright and Chromium
    # never remove their profiles there; this folder goes with the server
    tmp: Path | None = None

    @property
    def url(self) -> str:
        return f"ws://{self.address}:{self.port}/"

    def in_namespace(self, *command: str, timeout: float = 10) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.namespace, *command], capture_output=True, text=True, timeout=timeout)

    def browser_pids(self) -> list[int]:
        """Chromium processes started in the namespace (the server launched a browser: connected)."""
        listed = subprocess.run(["ip", "netns", "pids", self.namespace], capture_output=True, text=True).stdout.split()
        pids = []
        for pid in listed:
            try:
                if "chromium" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[0]:
                    pids.append(int(pid))
            except OSError:
                continue
        return pids

    def kill(self) -> None:
        """The endpoint dies: the server, its driver and the browser it launched, at once."""
        for pid in subprocess.run(["ip", "netns", "pids", self.namespace], capture_output=True, text=True).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        self.process.wait(timeout=10)


def _namespace() -> tuple[str, str]:
    """A fresh network namespace joined to this one by a veth pair of its own /30: (name, its address)."""
    n = next(_counter)
    tag = f"{os.getpid() % 100000}x{n}"
    namespace, host_if, ns_if = f"packrs{tag}", f"pkh{tag}", f"pkn{tag}"
    subnet = f"10.{200 + os.getpid() % 50}.{n % 250}"
    host_ip, ns_ip = f"{subnet}.1", f"{subnet}.2"
    _ip("netns", "add", namespace)
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _ip("link", "set", ns_if, "netns", namespace)
        _ip("addr", "add", f"{host_ip}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("netns", "exec", namespace, "ip", "addr", "add", f"{ns_ip}/30", "dev", ns_if)
        _ip("netns", "exec", namespace, "ip", "link", "set", ns_if, "up")
        _ip("netns", "exec", namespace, "ip", "link", "set", "lo", "up")
    except BaseException:
        stop_remote_server_namespace(namespace)
        raise
    return namespace, ns_ip


def _wait_listening(process: subprocess.Popen, address: str, port: int, what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=1):
                return
        except OSError:
            if process.poll() is not None:
                raise RuntimeError(f"{what} exited: {process.stdout.read().decode(errors='replace')[-500:]}")
            time.sleep(0.2)
    raise RuntimeError(f"{what} did not listen within 30 s")


def start_remote_servers(count: int, port: int = 3000) -> list[RemoteServer]:
    """`count` fresh namespaces, each running `playwright run-server --unsafe` (launch options from
    the client), started side by side."""
    servers: list[RemoteServer] = []
    try:
        for _ in range(count):
            namespace, ns_ip = _namespace()
            tmp = Path(tempfile.mkdtemp(prefix="pack-remote-server-"))
            process = subprocess.Popen(
                ["ip", "netns", "exec", namespace, sys.executable, "-m", "playwright", "run-server", "--port", str(port), "--host", "0.0.0.0", "--unsafe"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, "TMPDIR": str(tmp)},
            )
            servers.append(RemoteServer(namespace, ns_ip, port, process, tmp))
        for server in servers:
            _wait_listening(server.process, server.address, port, "run-server")
    except BaseException:
        for server in servers:
            stop_remote_server(server)
        raise
    return servers


# Chromium's DevTools port listens on the namespace's loopback only: this relays it to the veth.
_RELAY = """
import asyncio, sys
async def pipe(r, w):
    try:
        while data := await r.read(65536):
            w.write(data); await w.drain()
    finally:
        w.close()
async def handle(r, w):
    tr, tw = await asyncio.open_connection("127.0.0.1", int(sys.argv[2]))
    await asyncio.gather(pipe(r, tw), pipe(tr, w), return_exceptions=True)
async def main():
    async with await asyncio.start_server(handle, "0.0.0.0", int(sys.argv[1])) as server:
        await server.serve_forever()
asyncio.run(main())
"""


def start_cdp_browser(profile: Path, port: int = 9223) -> RemoteServer:
    """A fresh namespace running headless Chromium with its DevTools (CDP) port relayed on `port`."""
    namespace, ns_ip = _namespace()
    tmp = Path(tempfile.mkdtemp(prefix="pack-remote-cdp-"))
    try:
        subprocess.Popen(
            ["ip", "netns", "exec", namespace, "/usr/bin/chromium", "--headless=new", "--no-sandbox", "--enable-unsafe-webgpu",
             f"--user-data-dir={profile}", "--remote-debugging-port=9222", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env={**os.environ, "TMPDIR": str(tmp)},
        )
        relay = subprocess.Popen(["ip", "netns", "exec", namespace, sys.executable, "-c", _RELAY, str(port), "9222"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        _wait_listening(relay, ns_ip, port, "relay")
    except BaseException:
        stop_remote_server_namespace(namespace)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return RemoteServer(namespace, ns_ip, port, relay, tmp)


def stop_remote_server(server: RemoteServer) -> None:
    server.kill()
    stop_remote_server_namespace(server.namespace)
    if server.tmp is not None:
        shutil.rmtree(server.tmp, ignore_errors=True)


def stop_remote_server_namespace(namespace: str) -> None:
    for pid in subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    subprocess.run(["ip", "netns", "del", namespace], capture_output=True)  # removes the veth pair too
