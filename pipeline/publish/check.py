"""After a publish, fetch the package from its public URL as a browser would, without credentials.

Two anonymous GETs per package, each with `Origin` and `Accept-Encoding: br`: `manifest.json` and
the smallest content-hashed file (a brotli-encoded one when there is one, so Content-Encoding is
seen). Each answer must be 200, allow the origin (Access-Control-Allow-Origin), carry the
Content-Encoding that was uploaded, and decode to the sha256 in the manifest. A failure names the
fix: a bucket that answers 403 to anonymous readers needs a public-read policy (S3) or a public
domain (R2, passed as --public-url); a missing CORS answer needs `--cors ORIGIN`.
"""

from __future__ import annotations

import functools
import hashlib
import os
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import brotli

from pipeline.publish.upload_plan import PackagePlan, PlannedObject, Stage
from pipeline.s3 import Target, is_r2

# Sent when no app origin is known (no --cors, no --check-origin): a page on some other origin.
PROBE_ORIGIN = "https://pack-check.example"
_TIMEOUT_S = 30
_BODY_LIMIT = 64 * 1024 * 1024  # the smallest hashed file is read whole; refuse absurd answers


@dataclass
class PackageCheck:
    package: str
    status: str = "passed"  # passed | failed | not-verifiable
    lines: list[str] = field(default_factory=list)  # one per object checked, for people
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # facts that need no action for a same-origin page

    def as_json(self) -> dict[str, object]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class _Answer:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes


def check_origins(cors: list[str], check_origin: list[str]) -> tuple[list[str], bool]:
    """The origins to send, and whether CORS for them is required (an app origin was named).
    `*` stands for any origin: a sample one is sent."""
    named = check_origin or cors
    if not named:
        return [PROBE_ORIGIN], False
    return sorted({PROBE_ORIGIN if origin == "*" else origin for origin in named}), True


def check_package(target: Target, plan: PackagePlan, origins: list[str], cors_required: bool) -> PackageCheck:
    result = PackageCheck(plan.name)
    if is_r2(target.endpoint_url) and not target.public_url:
        result.status = "not-verifiable"
        result.warnings.append(
            f"{plan.name}: not checked from the outside: the R2 API endpoint is never public; connect a custom "
            "domain or enable the r2.dev subdomain on the bucket and pass it as --public-url / PACK_PUBLIC_URL"
        )
        return result
    manifest = next(obj for obj in plan.objects if obj.stage is Stage.MANIFEST)
    hashed = [obj for obj in plan.objects if obj.stage is Stage.HASHED]
    probes = [manifest] + ([min(hashed, key=lambda obj: (obj.content_encoding is None, obj.size))] if hashed else [])
    context = _ssl_context(os.environ.get("AWS_CA_BUNDLE") or None) if any(target.url(o.path).startswith("https:") for o in probes) else None
    for obj in probes:
        for origin in origins:
            if not _check_object(target, plan.name, obj, origin, cors_required, context, result):
                break  # unreachable or refused: the next GET would only say the same
        if result.errors and not result.lines:
            break
    if result.errors:
        result.status = "failed"
    return result


def _check_object(target: Target, package: str, obj: PlannedObject, origin: str, cors_required: bool, context, result: PackageCheck) -> bool:
    """Record what one GET showed; False when no 200 came back."""
    url = target.url(target.key(package, obj.path))
    try:
        answer = _get(url, origin, context)
    except OSError as error:
        result.errors.append(f"{url}: anonymous GET failed ({_reason(error)}); check --public-url / PACK_PUBLIC_URL and that the host is reachable")
        return False
    if answer.status in (401, 403):
        result.errors.append(f"{url}: {answer.status} to an anonymous GET: the bucket is not public, so browsers get {answer.status}; {_public_fix(target)}")
        return False
    if answer.status != 200:
        result.errors.append(f"{url}: {answer.status} to an anonymous GET (expected 200); check --public-url / PACK_PUBLIC_URL points at this bucket{' and prefix' if target.prefix else ''}")
        return False
    allowed = answer.headers.get("access-control-allow-origin")
    cors_ok = allowed in ("*", origin)
    if not cors_ok:
        said = f"Access-Control-Allow-Origin: {allowed}" if allowed else "no Access-Control-Allow-Origin"
        if cors_required:
            result.errors.append(f"{url}: {said} for Origin {origin}, so pages on {origin} cannot load the package; pass --cors {origin} (PACK_CORS) to set the bucket's CORS rule")
        elif not result.notes:
            # No app origin was named: same-origin pages work; say what pages elsewhere would meet.
            result.notes.append(
                f"{said} for another origin ({origin}): only pages served from {_origin_of(url)} can load {package}; "
                "pass --cors https://your.app (PACK_CORS) for an app on another origin"
            )
    encoding = answer.headers.get("content-encoding") or None
    try:
        decoded = _decode(answer.body, encoding)
    except ValueError as error:
        result.errors.append(f"{url}: Content-Encoding {encoding}: {error}; the stored object is damaged, publish again")
        return True
    digest = hashlib.sha256(decoded).hexdigest()
    if digest != obj.sha256:
        if obj.stage is Stage.MANIFEST:
            result.warnings.append(
                f"{url}: serves another manifest.json (sha256 {digest[:16]}…, published {obj.sha256[:16]}…); a CDN in front of the "
                "bucket may still hold the previous one for its max-age (60 s), else --public-url points at another copy"
            )
        else:
            result.errors.append(f"{url}: body decodes to sha256 {digest[:16]}…, manifest.json says {obj.sha256[:16]}…; publish again, and check --public-url points at this bucket")
            return True
    if obj.content_encoding and encoding != obj.content_encoding:
        # Cloudflare may decode br for clients that do not ask for it; this GET asked.
        result.warnings.append(f"{url}: served with Content-Encoding {encoding or 'none'} although it is stored as {obj.content_encoding}: browsers download {len(answer.body):,} B instead of {obj.size:,} B")
    encoded = f", Content-Encoding {encoding}" if encoding else ""
    cors = f"Origin {origin} allowed" if cors_ok else f"Origin {origin} not allowed"
    result.lines.append(f"  {'FAIL' if cors_required and not cors_ok else 'ok  '} {url}: 200 anonymous{encoded}, {len(answer.body):,} B, sha256 {'matches' if digest == obj.sha256 else 'differs'}; {cors}")
    return True


def _get(url: str, origin: str, context) -> _Answer:
    request = urllib.request.Request(url, headers={"Origin": origin, "Accept-Encoding": "br", "User-Agent": "pack-publish-check"})
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT_S, context=context) as response:
            return _Answer(response.status, {k.lower(): v for k, v in response.headers.items()}, response.read(_BODY_LIMIT))
    except urllib.error.HTTPError as error:
        return _Answer(error.code, {k.lower(): v for k, v in error.headers.items()}, b"")


def _decode(body: bytes, encoding: str | None) -> bytes:
    if encoding in (None, "identity"):
        return body
    if encoding == "br":
        try:
            return brotli.decompress(body)
        except brotli.error as error:
            raise ValueError(f"not a brotli stream ({error})") from None
    if encoding == "gzip":
        import gzip

        return gzip.decompress(body)
    raise ValueError("an encoding browsers may not decode")


def _public_fix(target: Target) -> str:
    if is_r2(target.endpoint_url):
        return "on R2 serve the bucket from a custom domain or its r2.dev subdomain (bucket settings → Public access) and pass that URL as --public-url"
    resource = f"arn:aws:s3:::{target.bucket}/{target.prefix + '/' if target.prefix else ''}*"
    return (
        f"allow public reads with a bucket policy (s3:GetObject for Principal \"*\" on {resource}, with Block Public Access off "
        "for the bucket), or serve it through a CDN and pass that URL as --public-url; see docs/publish.md"
    )


@functools.cache
def _ssl_context(bundle: str | None) -> ssl.SSLContext:
    """The system's CAs, plus AWS_CA_BUNDLE (a private CA in front of the bucket) where set."""
    context = ssl.create_default_context()
    if bundle and os.path.isfile(bundle):
        context.load_verify_locations(cafile=bundle)
    return context


def _origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _reason(error: OSError) -> str:
    if isinstance(error, urllib.error.URLError):
        return str(error.reason)
    return f"{type(error).__name__}: {error}"
