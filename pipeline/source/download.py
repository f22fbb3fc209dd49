"""https downloads: streamed with a progress bar, resumable, cached by sha256 and checked.

Credentials in the URL (`https://user:token@host/...`) are sent as HTTP Basic auth, to that host
only (never on to a redirect's), and never recorded: messages, the lock file and the report show
the URL masked (pipeline/urls.py), as they do a signed URL's query (`X-Amz-Signature=***`).

TLS is always verified, against the system's CAs plus, when `PACK_CA_BUNDLE` names a PEM file,
that file's CAs (a company proxy that re-signs TLS, or a test server); `SSL_CERT_FILE` replaces
the system's CAs as OpenSSL defines it.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import os
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from pipeline.cache import cache_dir, cached_entry, file_sha256, share_entry
from pipeline.errors import PackError, is_environment_error
from pipeline.progress import Progress
from pipeline.urls import mask_url, scrub

CHUNK = 1 << 20
TIMEOUT_S = 60
CA_BUNDLE_ENV = "PACK_CA_BUNDLE"


class SourceUnreachable(PackError):
    """The server could not be reached or refused the file: the caller adds how to get it otherwise."""

    def __init__(self, url: str, reason: str):
        super().__init__(f"source {mask_url(url)}: {reason}")
        self.url = mask_url(url)
        self.reason = reason


def tls_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    extra = os.environ.get(CA_BUNDLE_ENV)
    if extra:
        try:
            context.load_verify_locations(cafile=extra)
        except (OSError, ssl.SSLError) as error:
            raise PackError(f"{CA_BUNDLE_ENV}={extra}: cannot load it as PEM CA certificates ({error}); fix or unset it") from None
    return context


def download(url: str, sha256: str | None, progress: Progress, sha256_origin: str = "recipe key 'source.sha256'") -> Path:
    """The cached file for `url`; a partial download left by an earlier run is resumed. Without
    `sha256` (a source pinned on first download) the file is fetched and cached by the hash it has:
    the caller pins that and checks it ever after."""
    if sha256:
        target = cache_dir("downloads") / sha256
        if cached_entry(target, sha256):  # named by its sha256: checked against its name
            return target
        partial = target.with_suffix(".part")
    else:
        target = None
        partial = cache_dir("downloads") / f"unpinned-{hashlib.sha256(url.encode()).hexdigest()[:24]}.part"
    offset = partial.stat().st_size if partial.exists() else 0
    shown = mask_url(url)
    request = _request(url, {"User-Agent": "pack", **({"Range": f"bytes={offset}-"} if offset else {})})
    try:
        response = urllib.request.urlopen(request, timeout=TIMEOUT_S, context=tls_context() if url.startswith("https://") else None)
    except (http.client.InvalidURL, ValueError) as error:
        raise PackError(f"source {shown}: not a URL pack can fetch ({scrub(str(error), url)}); check it") from None
    except urllib.error.HTTPError as error:
        if error.code == 416 and offset:  # the partial file is already complete
            response = None
        else:
            raise SourceUnreachable(url, f"HTTP {error.code} {error.reason}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as error:
        reason = getattr(error, "reason", error)
        if isinstance(reason, ssl.SSLCertVerificationError):
            raise SourceUnreachable(url, f"the server's TLS certificate is not trusted ({reason.verify_message}); if a proxy re-signs TLS, give its CA certificate with {CA_BUNDLE_ENV}=FILE.pem") from None
        raise SourceUnreachable(url, f"cannot connect ({scrub(str(reason), url)})") from None
    if response is not None:
        with response:
            resumed = offset and response.status == 206
            if not resumed:
                offset = 0
            length = response.headers.get("Content-Length")
            total = offset + int(length) if length else None
            try:
                with partial.open("ab" if resumed else "wb") as handle, progress.task(f"download {Path(urlsplit(url).path).name}", total, "bytes") as task:
                    task.advance(offset)
                    for block in iter(lambda: response.read(CHUNK), b""):
                        handle.write(block)
                        task.advance(len(block))
            except (OSError, TimeoutError) as error:
                if is_environment_error(error):  # the cache's disk, not the connection
                    raise
                raise PackError(f"source {shown}: download cut off after {partial.stat().st_size} bytes ({error}); run again to resume") from None
            if total is not None and partial.stat().st_size < total:
                raise PackError(f"source {shown}: download cut off at {partial.stat().st_size} of {total} bytes; run again to resume")
    actual = file_sha256(partial)
    if sha256 and actual != sha256:
        partial.unlink()
        raise DownloadMismatch(url, actual, sha256, sha256_origin)
    target = target or cache_dir("downloads") / actual
    partial.rename(target)
    share_entry(target, actual)
    return target


class DownloadMismatch(PackError):
    """The downloaded bytes are not the expected ones; the caller says which pin they broke."""

    def __init__(self, url: str, actual: str, expected: str, origin: str):
        super().__init__(f"source {mask_url(url)}: sha256 is {actual}, {origin} expects {expected}; fix {origin} or the URL")
        self.url, self.actual, self.expected = mask_url(url), actual, expected


def _request(url: str, headers: dict[str, str]) -> urllib.request.Request:
    """A GET of `url`; its user info, if any, taken out of the URL (http.client would read
    `user:pass@host` as a host and port) and sent as Basic auth to this host only."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return urllib.request.Request(url, headers=headers)
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    request = urllib.request.Request(urlunsplit(parts._replace(netloc=host)), headers=headers)
    credentials = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode("ascii")
    request.add_unredirected_header("Authorization", f"Basic {credentials}")
    return request
