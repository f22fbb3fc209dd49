"""What every command shares: error reporting, signal handling, output-folder checks, JSON output."""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Iterator, Optional

import typer

from pipeline.errors import PackError, environment_error, interrupt_exit_code, is_environment_error, raise_terminated
from pipeline.progress import Progress
from pipeline.urls import mask_urls

# The shared cache behind the local one: read here, from the option or its variable, and nowhere
# below the command line; the command hands the store it opens (`open_shared_store`) down.
CACHE_URL_ENV = "PACK_CACHE_URL"
CacheUrlOption = Annotated[Optional[str], typer.Option(
    "--cache-url", envvar=CACHE_URL_ENV, show_envvar=True,
    help="Shared cache behind the local one: s3://BUCKET/PREFIX (S3 or R2; endpoint and credentials as boto3 reads them, e.g. AWS_ENDPOINT_URL) or a folder.")]


def open_shared_store(url: str | None):
    """The session on the shared store --cache-url names, behind the local cache, checked before
    any work (exit 2 when unusable); None when none is named. Returns a shared_cache.StoreSession."""
    from pipeline.cache import cache_root
    from pipeline.shared_cache import open_session

    return open_session(url, cache_root())


@contextmanager
def cli_errors(out: Path | None = None, out_option: str = "--out") -> Iterator[None]:
    """Run a command body: a PackError becomes its one-line message on stderr (every URL in it
    masked) and exit code 2, and so does a full disk, a quota, no permission or a read-only file
    system under `out`, the cache or the temporary folder (named as the user set them); Ctrl-C
    (exit 130) and SIGTERM (exit 143) unwind through the same clean-up paths and end with one line
    instead of a traceback."""
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    except PackError as error:
        typer.echo(f"error: {mask_urls(str(error))}", err=True)
        raise typer.Exit(error.exit_code) from None
    except OSError as error:
        if not is_environment_error(error):
            raise
        message = environment_error(error, _written_folders(out, out_option))
        typer.echo(f"error: {message}", err=True)
        raise typer.Exit(message.exit_code) from None
    except KeyboardInterrupt as error:
        code = interrupt_exit_code(error)
        typer.echo(f"interrupted ({signal.Signals(code - 128).name}): stopped and cleaned up", err=True)
        raise typer.Exit(code) from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _written_folders(out: Path | None, out_option: str) -> dict[str, tuple[Path, str]]:
    """The folders a command writes to, as the user names them, with the fix for each."""
    from pipeline.cache import CACHE_ENV, cache_root

    configured = os.environ.get(CACHE_ENV)
    folders = {
        f"{CACHE_ENV}={configured}" if configured else f"the cache folder {cache_root()}": (cache_root(), f"set {CACHE_ENV} to another folder"),
        f"the temporary folder {tempfile.gettempdir()}": (Path(tempfile.gettempdir()), "set TMPDIR to another folder"),
    }
    if out is not None:
        folders[f"{out_option} {out}"] = (out, f"give {out_option} another folder")
    return folders


def check_output_folder(folder: Path, option: str = "--out") -> None:
    """Refuse, before any work, an output folder that is a file, lies under a file, or cannot be
    written (the package goes to FOLDER/<name>/)."""
    fix = f"give {option} a writable folder (the package goes to {option.removeprefix('--').upper()}/<name>/)"
    if folder.exists() and not folder.is_dir():
        raise PackError(f"{option} {folder}: is a file, not a folder; {fix}")
    existing = folder
    while not existing.exists() and not existing.is_symlink():
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise PackError(f"{option} {folder}: {existing} is a file, so no folder can be made under it; {fix}")
    if not is_writable_folder(existing):
        raise PackError(f"{option} {folder}: {existing} is read-only; {fix}")


def is_writable_folder(folder: Path) -> bool:
    """Whether a folder can be made in `folder`, by trying (permission bits alone miss read-only
    mounts, immutable folders and root's override); the probe is removed at once."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".pack-probe-", dir=folder))
    except OSError:
        return False
    return True


def is_package_folder(folder: Path) -> bool:
    return folder.is_dir() and (folder / "manifest.json").is_file()


def require_package_folder(folder: Path, command: str) -> None:
    """Refuse what is not a folder made by `pack build`, saying what to give instead."""
    usage = f"`pack {command}` takes a package folder made by `pack build` (dist/<name>)"
    if not folder.exists():
        raise PackError(f"{folder}: no such folder; {usage}")
    if not folder.is_dir():
        build_hint = f"; build one first: pack build {folder}" if folder.suffix in (".onnx", ".toml") else ""
        raise PackError(f"{folder}: is a file, not a package folder; {usage}{build_hint}")
    if not (folder / "manifest.json").is_file():
        raise PackError(f"{folder}: not a package (no manifest.json); {usage}")


def progress_for(json_output: bool, lines_when_piped: bool = False) -> Progress:
    """Quiet under --json; bars on a terminal; with `lines_when_piped`, plain lines on stdout when
    it is a pipe or a file (a CI log: pipeline/progress.py)."""
    if json_output:
        return Progress.quiet()
    if lines_when_piped and piped(sys.stdout):
        return Progress.lines(sys.stdout)
    return Progress()


def piped(stream) -> bool:
    """A pipe or a file: a real descriptor that is no terminal (not a test runner's buffer)."""
    try:
        return stream.fileno() >= 0 and not stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def print_json(document: Any) -> None:
    """`document` on stdout, every URL in it masked (pipeline/urls.py)."""
    sys.stdout.write(json.dumps(_masked(document), indent=2, sort_keys=False) + "\n")


def _masked(value: Any) -> Any:
    if isinstance(value, str):
        return mask_urls(value)
    if isinstance(value, dict):
        return {key: _masked(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_masked(item) for item in value]
    return value
