"""`pack serve`: preview packages locally exactly as production serves them.

It reuses the verification server (pipeline/package_server.py): brotli bodies with
`Content-Encoding: br` for clients that accept it, the manifest's media types, and the
cross-origin isolation headers (COOP/COEP) that wasm threads need. A page opened from file://
gets none of these, which is why the demo page needs a server.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from pipeline.commands.common import cli_errors, is_package_folder, require_package_folder
from pipeline.errors import PackError


def packages_in(folder: Path) -> list[Path]:
    """`folder` itself when it is a package, else the packages directly inside it."""
    if is_package_folder(folder):
        return [folder]
    if folder.is_dir():
        found = [child for child in sorted(folder.iterdir()) if not child.name.startswith(".") and is_package_folder(child)]
        if found:
            return found
        raise PackError(f"{folder}: holds no package (no <name>/manifest.json inside); `pack serve` takes dist/<name> or dist/ after `pack build`")
    require_package_folder(folder, "serve")  # names what is wrong: missing, or a file
    raise AssertionError("unreachable")


def serve(
    folder: Annotated[Path, typer.Argument(help="A package folder (dist/<name>) or a folder of packages (dist/).")] = Path("dist"),
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to listen on (0: any free port).")] = 8000,
    host: Annotated[str, typer.Option("--host", help="Address to listen on; 0.0.0.0 exposes the server to the network.")] = "127.0.0.1",
    cors: Annotated[
        Optional[list[str]],
        typer.Option("--cors", envvar="PACK_CORS", help="Allow pages on ORIGIN (or *) to fetch the packages, as a bucket CORS rule does (repeatable)."),
    ] = None,
) -> None:
    """Serve built packages locally as production does (brotli, media types, COOP/COEP); Ctrl-C stops."""
    from pipeline.package_server import StaticServer

    from pipeline.publish.cors import validate_origins

    with cli_errors():
        origins = validate_origins(cors or [])
        packages = packages_in(folder)
        # A single package is served under /<name>/ as a bucket does, with its manifest's media types.
        mounts = {f"/{folder.name}/": folder} if packages == [folder] else {}
        try:
            server = StaticServer(folder, mounts, host=host, port=port, cors=origins)
        except OSError as error:
            raise PackError(f"--host {host} --port {port}: cannot listen there ({error.strerror or error}); choose another --port (0 picks a free one)") from None
        server.start()
        # A wildcard address listens everywhere; this machine reaches it as 127.0.0.1.
        base = server.url.replace("//0.0.0.0:", "//127.0.0.1:").replace("//:::", "//127.0.0.1:")
        try:
            # host:port, not the root URL: the root lists nothing (404); the lines below are the URLs to open
            typer.echo(f"serving {folder} on {base.split('//', 1)[1].rstrip('/')} (Ctrl-C stops)")
            if origins:
                typer.echo(f"  CORS: pages on {', '.join(origins)} may fetch these files")
            for package in packages:
                # An export (`pack export`) has no demo page: its manifest is what the loader opens.
                page = "index.html" if (package / "index.html").is_file() else "manifest.json"
                typer.echo(f"  {package.name}: {base}{package.name}/{page}")
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (raised as Terminated): how a server stops
            pass
        finally:
            server.stop()
    typer.echo("stopped")
