"""Publish validated package plans to a bucket: incremental, in a safe order, then optional prune.

Order per package: content-hashed files, then manifest.json, then the loader's other files, then
loader.js, then the demo page (demo.js, index.html); each stage starts only after the previous
one fully succeeded. The loader reads the
manifest at run time, so a manifest is never visible before every object it names, and a failed
run leaves the previously published version working. Re-running completes it: objects already
stored with the same sha256 and headers are skipped.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from itertools import groupby

from pipeline.errors import PackError
from pipeline.progress import Progress
from pipeline.publish.upload_plan import PackagePlan, PlannedObject, Stage
from pipeline.publish.prune import PruneResult, prune
from pipeline.s3 import Target, describe_error
from pipeline.publish.remembered import Memory
from pipeline.publish.transfer import UploadFailed, is_current, list_package, stored_objects, upload_batch

_AFTER_FAILURE = {
    Stage.HASHED: "manifest.json of {name} was not changed, so the previously published version keeps working",
    Stage.MANIFEST: (
        "manifest.json of {name} is either the previous or the new one (a PUT is all-or-nothing); both name "
        "only objects that are present"
    ),
    Stage.SUPPORT: (
        "manifest.json of {name} is the new one with every file it names present; the loader's modules may be "
        "partly the previous ones"
    ),
    Stage.LOADER: "manifest.json and the loader's modules of {name} are the new ones; loader.js may be the previous one",
    Stage.DEMO: "manifest.json and the loader of {name} are the new ones; the demo page may be the previous one",
    Stage.PAGE: "manifest.json, the loader and demo.js of {name} are the new ones; index.html may be the previous one",
}


@dataclass(frozen=True)
class ObjectResult:
    package: str
    key: str
    action: str  # uploaded | skipped | deleted, or would-upload | would-delete under --dry-run
    bytes: int  # stored bytes of the object (totals count uploads only)
    sha256: str | None = None
    content_type: str | None = None
    content_encoding: str | None = None
    cache_control: str | None = None

    def as_json(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class PublishResult:
    dry_run: bool
    objects: list[ObjectResult] = field(default_factory=list)
    loader_urls: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    kept_folders_without_manifest: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # printed before publishing (trust gate, unlisted files)
    remote_unchecked: str | None = None  # --dry-run without a bucket to ask: why

    def count(self, *actions: str) -> int:
        return sum(1 for obj in self.objects if obj.action in actions)

    @property
    def uploaded(self) -> int:
        return self.count("uploaded", "would-upload")

    @property
    def skipped(self) -> int:
        return self.count("skipped")

    @property
    def deleted(self) -> int:
        return self.count("deleted", "would-delete")

    @property
    def bytes(self) -> int:
        return sum(obj.bytes for obj in self.objects if obj.action in ("uploaded", "would-upload"))


def publish(
    client,
    target: Target,
    plans: list[PackagePlan],
    *,
    part_size: int,
    dry_run: bool = False,
    prune_unreferenced: bool = False,
    progress: Progress,
) -> PublishResult:
    started = time.monotonic()
    result = PublishResult(dry_run=dry_run)
    done: list[str] = []
    for plan in plans:
        try:
            _publish_package(client, target, plan, part_size, dry_run, progress, result)
        except PackError as error:
            if done:
                raise PackError(f"{error} (already published in this run: {', '.join(done)})") from None
            raise
        done.append(plan.name)
        result.loader_urls[plan.name] = target.url(target.key(plan.name, "loader.js"))
    if prune_unreferenced:
        # The packages of this run are pruned against their plans (under --dry-run the new manifests
        # are not in the bucket yet; reports this run published (--with-report) are in the plan, not the manifest).
        planned = {plan.name: set(plan.paths) for plan in plans}
        pruned = prune(client, target, dry_run, progress, planned)
        _record_prune(result, pruned, target, dry_run)
    result.seconds = time.monotonic() - started
    return result


def local_plan(target: Target, plans: list[PackagePlan], with_urls: bool = True) -> PublishResult:
    """--dry-run without a bucket to ask: every planned object as would-upload, in upload order."""
    result = PublishResult(dry_run=True)
    for plan in plans:
        result.objects += [_result(plan.name, target.key(plan.name, o.path), o, "would-upload") for o in plan.objects]
        if with_urls:
            result.loader_urls[plan.name] = target.url(target.key(plan.name, "loader.js"))
    return result


def _publish_package(
    client,
    target: Target,
    plan: PackagePlan,
    part_size: int,
    dry_run: bool,
    progress: Progress,
    result: PublishResult,
) -> None:
    listed = list_package(client, target, plan.name)
    memory = Memory.load(client.meta.endpoint_url or "", target.bucket, target.package_prefix(plan.name))
    memory.keep_only(set(listed))
    stored = stored_objects(client, target, plan.name, plan.objects, listed, memory)
    memory.save()
    pending: list[PlannedObject] = []
    for obj in plan.objects:
        key = target.key(plan.name, obj.path)
        if is_current(obj, stored.get(key)):
            result.objects.append(_result(plan.name, key, obj, "skipped"))
        else:
            pending.append(obj)
    total = sum(obj.size for obj in pending)
    progress.note(
        f"{plan.name}: {len(pending)} to upload ({total / 1e6:.1f} MB), "
        f"{len(plan.objects) - len(pending)} unchanged → {target.describe()}{plan.name}/"
    )
    if dry_run:
        result.objects += [_result(plan.name, target.key(plan.name, o.path), o, "would-upload") for o in pending]
        return
    if not pending:
        return
    with progress.task(f"upload {plan.name}", total=total, unit="bytes") as bar:
        for stage, group in groupby(pending, key=lambda obj: obj.stage):
            batch = list(group)
            try:
                upload_batch(client, target, plan.name, batch, part_size, bar.advance)
            except KeyboardInterrupt:
                # s3transfer has cancelled the batch (and aborted multipart uploads) by now.
                consequence = _AFTER_FAILURE[stage].format(name=plan.name)
                print(f"interrupted: {consequence}; run the same command again to finish", file=sys.stderr)
                raise
            except UploadFailed as failure:
                consequence = _AFTER_FAILURE[stage].format(name=plan.name)
                raise PackError(
                    f"{describe_error(failure.cause, f'upload of s3://{target.bucket}/{failure.key}')}; "
                    f"{consequence}; run the same command again to finish"
                ) from None
            result.objects += [_result(plan.name, target.key(plan.name, o.path), o, "uploaded") for o in batch]


def _result(package: str, key: str, obj: PlannedObject, action: str) -> ObjectResult:
    return ObjectResult(
        package=package,
        key=key,
        action=action,
        bytes=obj.size,
        sha256=obj.sha256,
        content_type=obj.content_type,
        content_encoding=obj.content_encoding,
        cache_control=obj.cache_control,
    )


def _record_prune(result: PublishResult, pruned: PruneResult, target: Target, dry_run: bool) -> None:
    action = "would-delete" if dry_run else "deleted"
    for key, size in pruned.deleted:
        package = key[len(target.prefix) + 1 :] if target.prefix else key
        result.objects.append(ObjectResult(package=package.split("/", 1)[0], key=key, action=action, bytes=size))
    result.kept_folders_without_manifest = pruned.kept_folders_without_manifest
