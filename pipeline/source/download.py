"""https downloads: streamed with a progress bar, resumable, cached by sha256 and checked."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

from pipeline.cache import cache_dir, file_sha256
from pipeline.errors import PackError
from pipeline.progress import Progress

CHUNK = 1 << 20
TIMEOUT_S = 60


def download(url: str, sha256: str | None, progress: Progress, sha256_origin: str = "recipe key 'source.sha256'") -> Path:
    """The cached file for `url`; a partial download left by an earlier run is resumed."""
    if not sha256:
        raise PackError(f"source {url}: an https source needs its sha256 (recipe key 'source.sha256' or --sha256)")
    target = cache_dir("downloads") / sha256
    if target.exists():
        return target
    partial = target.with_suffix(".part")
    offset = partial.stat().st_size if partial.exists() else 0
    request = urllib.request.Request(url, headers={"User-Agent": "pack", **({"Range": f"bytes={offset}-"} if offset else {})})
    try:
        response = urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as error:
        if error.code == 416 and offset:  # the partial file is already complete
            response = None
        else:
            raise PackError(f"source {url}: HTTP {error.code} {error.reason}; check the URL") from None
    except (urllib.error.URLError, TimeoutError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise PackError(f"source {url}: cannot connect ({reason}); check the URL and the network, then run again to resume") from None
    if response is not None:
        with response:
            resumed = offset and response.status == 206
            if not resumed:
                offset = 0
            length = response.headers.get("Content-Length")
            total = offset + int(length) if length else None
            try:
                with partial.open("ab" if resumed else "wb") as handle, progress.task(f"download {url.rsplit('/', 1)[-1]}", total, "bytes") as task:
                    task.advance(offset)
                    for block in iter(lambda: response.read(CHUNK), b""):
                        handle.write(block)
                        task.advance(len(block))
            except (OSError, TimeoutError) as error:
                raise PackError(f"source {url}: download cut off after {partial.stat().st_size} bytes ({error}); run again to resume") from None
            if total is not None and partial.stat().st_size < total:
                raise PackError(f"source {url}: download cut off at {partial.stat().st_size} of {total} bytes; run again to resume")
    actual = file_sha256(partial)
    if actual != sha256:
        partial.unlink()
        raise PackError(f"source {url}: sha256 is {actual}, {sha256_origin} expects {sha256}; fix {sha256_origin} or the URL")
    partial.rename(target)
    return target
