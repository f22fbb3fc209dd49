"""What is already in the bucket, and uploading a batch of planned objects in parallel.

Incremental publishing compares the sha256 kept in each object's metadata (plus its headers):
ETags cannot be compared because a multipart ETag is not an MD5 of the file.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable

from s3transfer.manager import TransferConfig, TransferManager
from s3transfer.subscribers import BaseSubscriber

from pipeline.errors import PackError
from pipeline.publish.upload_plan import PlannedObject
from pipeline.publish.s3 import TRANSFER_THREADS, Target, describe_error

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


def list_keys(client, bucket: str, prefix: str) -> dict[str, int]:
    """Every key under `prefix` with its size (ListObjectsV2, all pages)."""
    found: dict[str, int] = {}
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            found[item["Key"]] = item["Size"]
    return found


def stored_objects(client, target: Target, package: str, objects: Iterable[PlannedObject]) -> dict[str, StoredObject]:
    """The stored state of those planned objects that exist (one list, then HEAD the existing ones)."""
    prefix = target.package_prefix(package)
    try:
        existing = list_keys(client, target.bucket, prefix)
    except Exception as error:  # noqa: BLE001
        raise PackError(describe_error(error, f"listing s3://{target.bucket}/{prefix}")) from None
    keys = [target.key(package, obj.path) for obj in objects]
    keys = [key for key in keys if key in existing]

    def head(key: str) -> tuple[str, StoredObject]:
        try:
            answer = client.head_object(Bucket=target.bucket, Key=key)
        except Exception as error:  # noqa: BLE001
            raise PackError(describe_error(error, f"reading s3://{target.bucket}/{key}")) from None
        metadata = answer.get("Metadata", {})
        return key, StoredObject(
            size=answer.get("ContentLength", -1),
            sha256=metadata.get("sha256"),
            body_sha256=metadata.get("body-sha256", metadata.get("sha256")),
            content_type=answer.get("ContentType"),
            content_encoding=answer.get("ContentEncoding"),
            cache_control=answer.get("CacheControl"),
        )

    with ThreadPoolExecutor(TRANSFER_THREADS) as pool:
        return dict(pool.map(head, keys))


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


class _Progress(BaseSubscriber):
    def __init__(self, on_bytes: Callable[[int], None]):
        super().__init__()
        self._on_bytes = on_bytes

    def on_progress(self, future, bytes_transferred: int, **kwargs) -> None:  # type: ignore[override]
        self._on_bytes(bytes_transferred)


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
