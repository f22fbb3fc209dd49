"""An S3 client that works against AWS S3 and Cloudflare R2, and S3 errors as one-line messages.

R2 rejects the `aws-chunked` upload form that boto3 >= 1.36 uses over https for its default CRC32
checksums (and S3 then stores `Content-Encoding: br,aws-chunked`), so checksums are only sent
where an operation requires them.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import json
import marshal
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

import botocore.exceptions
import botocore.loaders
import botocore.session
from botocore.config import Config

from pipeline.cache_location import cache_root
from pipeline.errors import PackError
from pipeline.urls import mask_url

# One pool slot per transfer thread plus the HEAD workers, so threads never wait for a socket.
# 16 in flight: on loopback moto, 200 MB went up in 5.9-6.6 s against 6.7-9.0 s with 8
# (scripts/bench/bench_publish.py); a remote endpoint's latency favours more requests in flight too.
TRANSFER_THREADS = 16
_DEFAULT_ATTEMPTS = 5


@dataclass(frozen=True)
class Target:
    """Where packages go: `s3://bucket/prefix/<name>/...` at `endpoint_url`."""

    bucket: str
    prefix: str = ""  # normalized: no leading/trailing slash
    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    public_url: str | None = None

    def __post_init__(self) -> None:
        # The bucket's keys come from the AWS credentials, and browsers fetch the public URL
        # anonymously: credentials in either URL would only end up in logs. Object URLs are the
        # base URL plus a key, so neither takes a query either.
        for option, url, fix in (
            ("--endpoint-url", self.endpoint_url, "the bucket's key pair goes in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or --profile / AWS_PROFILE)"),
            ("--public-url", self.public_url, "browsers fetch the package anonymously, so its public URL holds no credentials"),
        ):
            parts = urlsplit(url or "")
            if "@" in parts.netloc or parts.query or parts.fragment:
                raise PackError(f"{option} {mask_url(url or '')}: give the base URL alone, without user info, query or fragment; {fix}")

    def key(self, package: str, path: str) -> str:
        return "/".join(part for part in (self.prefix, package, path) if part)

    def package_prefix(self, package: str) -> str:
        return self.key(package, "") + "/"

    def url(self, key: str) -> str:
        """The public URL of an object: `--public-url` when given, else the endpoint's URL."""
        quoted = quote(key)
        if self.public_url:
            return f"{self.public_url.rstrip('/')}/{quoted}"
        if self.endpoint_url:
            return f"{self.endpoint_url.rstrip('/')}/{self.bucket}/{quoted}"
        region = self.region or "us-east-1"
        if "." in self.bucket:  # a dotted bucket name breaks the wildcard certificate of virtual hosts
            return f"https://s3.{region}.amazonaws.com/{self.bucket}/{quoted}"
        return f"https://{self.bucket}.s3.{region}.amazonaws.com/{quoted}"

    def describe(self) -> str:
        where = f"s3://{self.bucket}/{self.prefix + '/' if self.prefix else ''}"
        return f"{where} at {mask_url(self.endpoint_url)}" if self.endpoint_url else where


def normalize_prefix(prefix: str | None) -> str:
    return "/".join(part for part in (prefix or "").split("/") if part)


def is_r2(endpoint_url: str | None) -> bool:
    host = urlsplit(endpoint_url or "").hostname or ""
    return host.endswith(".r2.cloudflarestorage.com")


def make_client(target: Target):  # -> botocore S3 client (boto3 ships no static type)
    """A client with R2-safe settings; fails with PackError when no credentials are found."""
    session = botocore.session.Session(profile=target.profile)
    # The service model JSON is parsed once per process, not once per client.
    session.register_component("data_loader", _shared_loader())
    try:
        credentials = session.get_credentials()
        region_name = session.get_config_variable("region")
    except botocore.exceptions.ProfileNotFound:
        raise PackError(
            f"AWS profile {session.profile!r} not found in the AWS config files; fix --profile / AWS_PROFILE"
        ) from None
    except botocore.exceptions.BotoCoreError as error:
        raise PackError(f"cannot load AWS credentials: {error}") from None
    if credentials is None:
        raise PackError(
            "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (for R2: an R2 API token's "
            "key pair), or pass --profile / AWS_PROFILE"
        )
    region = target.region or (
        "auto"
        if is_r2(target.endpoint_url)
        # botocore reads AWS_DEFAULT_REGION and profiles; CI actions often set only AWS_REGION
        else region_name or os.environ.get("AWS_REGION") or "us-east-1"
    )
    config = Config(
        signature_version="s3v4",
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        retries={"mode": "standard", "total_max_attempts": _max_attempts()},
        max_pool_connections=2 * TRANSFER_THREADS,
        # Path style works on every endpoint (R2, MinIO, loopback IPs); AWS keeps virtual hosts.
        s3={"addressing_style": "path" if target.endpoint_url else "auto"},
    )
    client = session.create_client("s3", endpoint_url=target.endpoint_url, region_name=region, config=config)
    for operation in ("DeleteObjects", "PutBucketCors"):
        client.meta.events.register(f"before-sign.s3.{operation}", _add_content_md5)
    return client


def _add_content_md5(request, **kwargs) -> None:
    """Since boto3 1.36 these operations carry a CRC32 only; several S3-compatible servers still
    demand Content-MD5 for them (MissingContentMD5). AWS accepts both, so send both."""
    body = request.body
    if isinstance(body, str):
        body = body.encode("utf-8")
    if isinstance(body, bytes) and "Content-MD5" not in request.headers:
        request.headers["Content-MD5"] = base64.b64encode(hashlib.md5(body).digest()).decode("ascii")


@functools.cache
def _shared_loader() -> botocore.loaders.Loader:
    search_path = os.environ.get("AWS_DATA_PATH")  # what botocore's own session would read
    loader = _Loader(file_loader=_ModelFiles()) if not search_path else botocore.loaders.create_loader(search_path)
    return loader


class _Loader(botocore.loaders.Loader):
    """botocore's loader, with the same results, that starts faster (`pack publish` runs as a fresh
    process, so creating the client is a good part of an unchanged re-publish): to check that the
    service asked for exists, botocore lists the folders of all its 400-odd services (once per kind
    of model file); this looks in the asked service's folder only."""

    def list_available_services(self, type_name):
        return _ServicesWith(self, type_name)


class _ServicesWith:
    """The services that have a `type_name` model file, looked up one at a time; iterating lists
    them all (botocore does that only to name them in an unknown-service error)."""

    def __init__(self, loader: _Loader, type_name: str):
        self._loader, self._type_name = loader, type_name

    def __contains__(self, service: object) -> bool:
        if not isinstance(service, str) or not service or os.sep in service:
            return False
        for root in self._loader._potential_locations():
            folder = os.path.join(root, service)
            versions = os.listdir(folder) if os.path.isdir(folder) else []
            if any(self._loader.file_loader.exists(os.path.join(folder, version, self._type_name)) for version in versions):
                return True
        return False

    def __iter__(self):
        return iter(botocore.loaders.Loader.list_available_services(self._loader, self._type_name))


class _ModelFiles(botocore.loaders.JSONFileLoader):
    """botocore's model files (JSON, some gzipped), parsed without botocore's OrderedDict hook
    (three times slower; dicts keep their order), and kept parsed in pack's cache in marshal form,
    keyed by the file's path, size and mtime: S3's service model, endpoint rules and the endpoint
    list are 3.6 MB of JSON that every fresh process would parse again."""

    def load_file(self, file_path):
        for extension, opener in ((".json", open), (".json.gz", gzip.open)):
            if os.path.isfile(file_path + extension):
                return _parsed_model(file_path + extension, opener)
        return None


def _parsed_model(path: str, opener):
    state = os.stat(path)
    stamp = (path, state.st_size, state.st_mtime_ns)
    memo = None
    try:
        name = hashlib.sha256(path.encode()).hexdigest()[:32]
        memo = cache_root() / "botocore-models" / f"{name}.{sys.implementation.cache_tag}.marshal"
        stored = memo.read_bytes()  # its sha256, then the marshalled (stamp, data): a damaged memo reads as none
        if hashlib.sha256(stored[32:]).digest() == stored[:32]:
            remembered_stamp, data = marshal.loads(stored[32:])  # marshal.load(file) reads piecemeal: slow
            if tuple(remembered_stamp) == stamp:
                return data
    except (OSError, EOFError, ValueError, TypeError):
        pass  # not parsed yet, another botocore, or no usable cache
    with opener(path, "rb") as handle:
        data = json.loads(handle.read().decode("utf-8"))
    if memo is not None:
        scratch = None
        try:  # whole or not at all (a rename)
            memo.parent.mkdir(parents=True, exist_ok=True)
            fd, scratch = tempfile.mkstemp(dir=memo.parent, prefix=f".{memo.name}.")
            with os.fdopen(fd, "wb") as handle:
                payload = marshal.dumps((stamp, data))
                handle.write(hashlib.sha256(payload).digest() + payload)
            os.replace(scratch, memo)
        except (OSError, ValueError):
            if scratch is not None:
                Path(scratch).unlink(missing_ok=True)  # a cache that cannot be written only costs the next process the parse
    return data


def _max_attempts() -> int:
    # botocore reads AWS_MAX_ATTEMPTS only when the Config leaves it unset; keep that override.
    value = os.environ.get("AWS_MAX_ATTEMPTS", "")
    return int(value) if value.isdigit() and int(value) > 0 else _DEFAULT_ATTEMPTS


def check_bucket(client, target: Target) -> None:
    """Fail early, before any upload, when the bucket is missing or not ours to write."""
    try:
        client.head_bucket(Bucket=target.bucket)
    except botocore.exceptions.ClientError as error:
        # Tokens scoped to objects (R2 "Object Read & Write", IAM policies on bucket/*) may be
        # refused HeadBucket yet allowed to list and write: listing decides then.
        if not _is_denied(error):
            raise PackError(describe_error(error, f"bucket {target.describe()}")) from None
        try:
            client.list_objects_v2(Bucket=target.bucket, Prefix=target.prefix, MaxKeys=1)
        except Exception:  # noqa: BLE001 - report the first refusal
            raise PackError(describe_error(error, f"bucket {target.describe()}")) from None
    except Exception as error:  # noqa: BLE001 - every failure becomes one message
        raise PackError(describe_error(error, f"bucket {target.describe()}")) from None


def _is_denied(error: botocore.exceptions.ClientError) -> bool:
    return str(error.response.get("Error", {}).get("Code")) in ("403", "AccessDenied")


def describe_error(error: BaseException, what: str) -> str:
    """One line naming what failed, what the server or network said, and what to do."""
    if isinstance(error, botocore.exceptions.ClientError):
        response = error.response
        info = response.get("Error", {})
        code = str(info.get("Code", "?"))
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        attempts = response.get("ResponseMetadata", {}).get("RetryAttempts", 0)
        message = info.get("Message") or ""
        # a HEAD's error has no body: botocore then gives the status as the code ("404") and its
        # reason as the message ("Not Found"), which must not read "404 404"
        answer = " ".join(dict.fromkeys(str(part) for part in (status, code) if part))
        said = f"server answered {answer}" + (f" ({message})" if message and message != code else "")
        if attempts:
            said += f" after {attempts + 1} attempts"
        if code in ("404", "NoSuchBucket"):
            return f"{what}: bucket not found ({said}); create it or fix --bucket / PACK_BUCKET"
        if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled"):
            return (
                f"{what}: access denied ({said}); the credentials need list, read and write "
                "(and delete for --prune) on this bucket"
            )
        if status == 501 or code == "NotImplemented":
            return (
                f"{what}: the server does not support this request ({said}); if this is Cloudflare R2 "
                "the operation or header has no R2 equivalent"
            )
        return f"{what}: {said}"
    if isinstance(error, botocore.exceptions.NoCredentialsError):
        return f"{what}: no credentials; set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or --profile"
    if isinstance(error, botocore.exceptions.EndpointConnectionError):
        return f"{what}: cannot reach the endpoint ({error}); check --endpoint-url and the network"
    if isinstance(error, (botocore.exceptions.ConnectionClosedError, botocore.exceptions.ConnectionError)):
        return f"{what}: the connection failed ({error}); the server went away or reset the connection"
    if isinstance(error, botocore.exceptions.BotoCoreError):
        return f"{what}: {error}"
    if isinstance(error, OSError):
        return f"{what}: {type(error).__name__}: {error}"
    return f"{what}: {type(error).__name__}: {error}"
