"""What every command shares: error reporting and JSON output."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from typing import Any, Iterator

import typer

from pipeline.errors import PackError
from pipeline.progress import Progress


@contextmanager
def cli_errors() -> Iterator[None]:
    """Turn a PackError into its one-line message on stderr and exit code 2."""
    try:
        yield
    except PackError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(error.exit_code) from None


def progress_for(json_output: bool) -> Progress:
    return Progress.quiet() if json_output else Progress()


def print_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False) + "\n")
