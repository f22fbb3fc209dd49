"""What is already in the bucket, and uploading a batch of planned objects in parallel.

Incremental publishing compares the sha256 kept in each object's metadata (plus its headers):
ETags cannot be compared because a multipart ETag is not an MD5 of the file. A listing shows
neither, so an existing key is read with HEAD, unless this machine remembers the very object the
listing shows (pipeline/publish/remembered.py): an unchanged re-publish from the machine that
published is then one listing.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Callable, Iterable

from pipeline.errors import PackError
from pipeline.publish.remembered import Headers, Listed, Memory, Seen
from pipeline.publish.upload_plan import PlannedObject
from pipeline.s3 import TRANSFER_THREADS, Target, describe_error

MIB = 1024 * 1024
MIN_PART_SIZE = 5 * MIB  # S3 and R2 refuse smaller parts (except the last)


@dataclass(frozen=True)
class StoredObject:
    size: int
    sha256: str | None
    body_sha256: str | None
    content_type: str | None
    content_encoding: str | None
    cache_control: str | None


def list_objects(client, bucket: str, prefix: str) -> dict[str, Listed]:
    """Every key under `prefix` with its size, ETag and LastModified (ListObjectsV2, all pages)."""
    found: dict[str, Listed] = {}
    token = None
    while True:  # the paginator's machinery costs more than these few lines
        page = client.list_objects_v2(Bucket=bucket, Prefix=prefix, **({"ContinuationToken": token} if token else {}))
        for item in page.get("Contents", []):
            found[item["Key"]] = Listed(size=item["Size"], etag=item.get("ETag", ""), modified=_seconds(item.get("LastModified")))
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or not token:
            return found


def list_keys(client, bucket: str, prefix: str) -> dict[str, int]:
    """Every key under `prefix` with its size."""
    return {key: listed.size for key, listed in list_objects(client, bucket, prefix).items()}


def _seconds(when) -> int:
    """Whole seconds since the epoch of a datetime botocore parsed; far future when missing (never vouches)."""
    return int(when.timestamp()) if hasattr(when, "timestamp") else 2**62


def list_package(client, target: Target, package: str) -> dict[str, Listed]:
    prefix = target.package_prefix(package)
    try:
        return list_objects(client, target.bucket, prefix)
    except Exception as error:  # noqa: BLE001
        raise PackError(describe_error(error, f"listing s3://{target.bucket}/{prefix}")) from None


def stored_objects(
    client, target: Target, package: str, objects: Iterable[PlannedObject], listed: dict[str, Listed], memory: Memory
) -> dict[str, StoredObject]:
    """The stored state of those planned objects that exist: from `memory` where the listing vouches
    for what it holds (pipeline/publish/remembered.py), else read with HEAD (in parallel) and remembered."""
    found: dict[str, StoredObject] = {}
    to_read: list[str] = []
    for obj in objects:
        key = target.key(package, obj.path)
        if key not in listed:
            continue
        headers = memory.headers(key, listed[key])
        if headers is None:
            to_read.append(key)
        else:
            found[key] = StoredObject(listed[key].size, *_fields(headers))

    def head(key: str) -> tuple[str, StoredObject]:
        try:
            answer = client.head_object(Bucket=target.bucket, Key=key)
        except Exception as error:  # noqa: BLE001
            raise PackError(describe_error(error, f"reading s3://{target.bucket}/{key}")) from None
        metadata = answer.get("Metadata", {})
        headers = Headers(
            sha256=metadata.get("sha256"),
            body_sha256=metadata.get("body-sha256", metadata.get("sha256")),
            content_type=answer.get("ContentType"),
            content_encoding=answer.get("ContentEncoding"),
            cache_control=answer.get("CacheControl"),
        )
        size = answer.get("ContentLength", -1)
        answered = _answered(answer)
        if answered is not None and answer.get("ETag"):
            memory.remember(key, Seen(etag=answer["ETag"], size=size, answered=answered, headers=headers))
        return key, StoredObject(size, *_fields(headers))

    if len(to_read) == 1:
        found.update([head(to_read[0])])
    elif to_read:
        with ThreadPoolExecutor(min(TRANSFER_THREADS, len(to_read))) as pool:
            found.update(pool.map(head, to_read))
    return found


def _answered(answer: dict) -> int | None:
    """The server's time of an answer (its Date header), whole seconds since the epoch."""
    date = answer.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    try:
        return int(parsedate_to_datetime(date).timestamp()) if date else None
    except (TypeError, ValueError):
        return None


def _fields(headers: Headers) -> tuple:
    return (headers.sha256, headers.body_sha256, headers.content_type, headers.content_encoding, headers.cache_control)


def is_current(planned: PlannedObject, stored: StoredObject | None) -> bool:
    """True when the stored object has the same bytes and headers: uploading it again changes nothing."""
    return (
        stored is not None
        and stored.size == planned.size
        and stored.sha256 == planned.sha256
        and stored.body_sha256 == planned.body_sha256
        and stored.content_type == planned.content_type
        and (stored.content_encoding or None) == planned.content_encoding
        and stored.cache_control == planned.cache_control
    )


class UploadFailed(Exception):
    """One object of a batch failed; the others of the batch may or may not have been stored."""

    def __init__(self, key: str, cause: BaseException):
        super().__init__(key)
        self.key = key
        self.cause = cause


def upload_batch(
    client,
    target: Target,
    package: str,
    objects: list[PlannedObject],
    part_size: int,
    on_bytes: Callable[[int], None],
) -> None:
    """Upload all `objects` in parallel; files above `part_size` go multipart in equal parts.

    Raises UploadFailed for the first object that failed, after every transfer has ended, so
    the caller knows nothing of this batch is still in flight.
    """
    if not objects:
        return
    # s3transfer is imported only when something is uploaded: an unchanged re-publish needs it not.
    from s3transfer.manager import TransferConfig, TransferManager
    from s3transfer.subscribers import BaseSubscriber

    class _Progress(BaseSubscriber):
        def __init__(self, on_bytes: Callable[[int], None]):
            super().__init__()
            self._on_bytes = on_bytes

        def on_progress(self, future, bytes_transferred: int, **kwargs) -> None:  # type: ignore[override]
            self._on_bytes(bytes_transferred)

    config = TransferConfig(
        multipart_threshold=part_size,
        multipart_chunksize=part_size,
        max_request_concurrency=TRANSFER_THREADS,
    )
    lock = threading.Lock()

    def counted(n: int) -> None:
        with lock:  # s3transfer reports from its worker threads
            on_bytes(n)

    futures = []
    with TransferManager(client, config) as manager:
        for obj in objects:
            extra_args = {
                "ContentType": obj.content_type,
                "CacheControl": obj.cache_control,
                "Metadata": obj.metadata,
            }
            if obj.content_encoding:
                extra_args["ContentEncoding"] = obj.content_encoding
            key = target.key(package, obj.path)
            future = manager.upload(str(obj.source), target.bucket, key, extra_args, [_Progress(counted)])
            futures.append((key, future))
        failure: UploadFailed | None = None
        for key, future in futures:
            try:
                future.result()
            except Exception as error:  # noqa: BLE001 - reported with its key below
                failure = failure or UploadFailed(key, error)
    if failure is not None:
        raise failure
