"""Benchmark `pack publish` against a loopback S3 server (moto in server mode, its own process):
part sizes side by side, and with --aws `pack publish` beside `aws s3 sync`.

Measures, for a package of about --size-mb MB: validation (hash + brotli check) time, first
publish time and throughput, and the time of a no-change re-publish (which must upload nothing).

With --aws, the same run also compares `pack publish` with `aws s3 sync` (awscli from PyPI, in
its own virtual environment: the bench installs it into .cache/bench-awscli when no `aws` is
given or on PATH), both as fresh processes against the same server and the same bodies (the
stored bytes of each object, .br bodies included): a full publish into an empty bucket (pack: of
a fresh copy of the package, with the hashes `pack build` records for the files it writes), then
an unchanged one. pack does what sync does not (sha256 metadata, headers, upload order, the manifest
last, the check from the outside); sync compares sizes and mtimes only.

    .venv/bin/python scripts/bench/bench_publish.py [--size-mb 200] [--part-size-mb 8 16] [--aws [PATH]] [--repeat 3] [--json]
    .venv/bin/python scripts/bench/bench_publish.py --smoke --json [--aws PATH]   # 2 MB, one round

Numbers depend on the machine: moto keeps objects in memory and is the bottleneck on loopback,
so the throughput is a floor for what the client side sustains, not a network figure.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pipeline.cache import remember_digest  # noqa: E402
from pipeline.progress import Progress  # noqa: E402
from pipeline.publish.upload_plan import plan_package  # noqa: E402
from pipeline.publish.publisher import publish  # noqa: E402
from pipeline.s3 import Target, make_client  # noqa: E402
from tests.publish_helpers import ACCESS_KEY, SECRET_KEY, public_read_policy, write_package  # noqa: E402

MIB = 1024 * 1024


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_moto(port: int) -> subprocess.Popen:
    env = {**os.environ, "MOTO_DISABLE_GLOBAL_CORS": "true"}
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1)
            return server
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise SystemExit("moto server did not start")


def time_cli_republish(root: Path, target: Target, part_mb: int) -> float:
    """Wall time of `pack publish` as a fresh process (imports, validation, client, HEADs)."""
    command = [sys.executable, "-c", "from pipeline.cli import app; app()", "publish", str(root),
               "--bucket", target.bucket, "--endpoint-url", str(target.endpoint_url),
               "--part-size", str(part_mb), "--json"]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True)
    elapsed = time.perf_counter() - started
    assert json.loads(done.stdout)["uploaded"] == 0, "a no-change re-publish uploaded something"
    return elapsed


def ensure_awscli(given: str | None) -> str:
    """`aws` to run: the one given, else one on PATH, else awscli from PyPI in .cache/bench-awscli."""
    if given:
        return given
    found = shutil.which("aws")
    if found:
        return found
    venv = REPO / ".cache" / "bench-awscli"
    aws = venv / "bin" / "aws"
    if not aws.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "awscli"], check=True)
    return str(aws)


def aws_version(aws: str) -> str:
    done = subprocess.run([aws, "--version"], capture_output=True, text=True)
    return (done.stdout or done.stderr).strip().split(" ")[0]


def sync_tree(plan, folder: Path) -> Path:
    """The bodies pack stores, laid out under their keys, for `aws s3 sync` to upload."""
    for obj in plan.objects:
        target = folder / obj.path
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(obj.source, target)
    return folder


def as_built(root: Path, manifest: dict) -> None:
    for path, entry in manifest["files"].items():
        if entry["cache"] == "immutable":
            remember_digest(root / path, "sha256", entry["sha256"])
            if entry["encodings"]:
                remember_digest(root / entry["encodings"]["br"]["path"], "br-decoded-sha256", entry["sha256"])


def timed(command: list[str]) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (user + system, of the process and its children) and stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])}… failed ({done.returncode}): {done.stderr[-2000:]}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return elapsed, cpu, done.stdout


def empty_bucket(client, bucket: str) -> None:
    keys = [{"Key": item["Key"]} for item in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    if keys:
        client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})


def compare_with_aws(aws: str, root: Path, plan, endpoint: str, scratch: Path, repeat: int) -> dict:
    """Fresh-process wall times of `pack publish` and `aws s3 sync`: full, then unchanged; best of `repeat`.
    Also their CPU times (the 2-core development machine is shared: CPU time moves less with its
    load than wall time), and pack's second unchanged run (`pack_unchanged_again_s`): from its
    first one on, this machine remembers what each object holds (pipeline/publish/remembered.py)."""
    tree = sync_tree(plan, scratch / "sync" / plan.name)
    copies = scratch / "copies"
    admin = make_client(Target(bucket="admin", endpoint_url=endpoint, region="us-east-1"))
    rows: dict[str, list[float]] = {
        "pack_full_s": [], "pack_unchanged_s": [], "aws_full_s": [], "aws_unchanged_s": [], "pack_unchanged_again_s": [],
        "pack_full_cpu_s": [], "pack_unchanged_cpu_s": [], "aws_full_cpu_s": [], "aws_unchanged_cpu_s": [],
    }
    for round_ in range(repeat):
        for tool in ("pack", "aws"):
            bucket = f"cmp-{tool}-{round_}"
            admin.create_bucket(Bucket=bucket)
            admin.put_bucket_policy(Bucket=bucket, Policy=public_read_policy(bucket))
            if tool == "pack":
                # A fresh copy (new inodes), with the hashes `pack build` records for the content-hashed
                # files it writes (pipeline/assets/files.py): the full publish starts as after a build.
                fresh = copies / f"{round_}" / root.name
                shutil.copytree(root, fresh)
                as_built(fresh, plan.manifest)
                command = [sys.executable, "-c", "from pipeline.cli import app; app()", "publish", str(fresh), "--bucket", bucket, "--endpoint-url", endpoint, "--json"]
            else:
                command = [aws, "s3", "sync", str(tree), f"s3://{bucket}/{plan.name}/", "--endpoint-url", endpoint, "--only-show-errors"]
            full, full_cpu, out = timed(command)
            unchanged, unchanged_cpu, again = timed(command)
            if tool == "pack":
                assert json.loads(out)["uploaded"] == len(plan.objects) and json.loads(again)["uploaded"] == 0
                once_more, _, third = timed(command)
                assert json.loads(third)["uploaded"] == 0
                rows["pack_unchanged_again_s"].append(once_more)
            rows[f"{tool}_full_s"].append(full)
            rows[f"{tool}_unchanged_s"].append(unchanged)
            rows[f"{tool}_full_cpu_s"].append(full_cpu)
            rows[f"{tool}_unchanged_cpu_s"].append(unchanged_cpu)
            empty_bucket(admin, bucket)  # moto spools every object to a temporary file: free the disk
            if tool == "pack":
                shutil.rmtree(copies / f"{round_}")
    best = {key: round(min(values), 2) for key, values in rows.items()}
    best["full_ratio"] = round(best["pack_full_s"] / best["aws_full_s"], 2)
    best["unchanged_ratio"] = round(best["pack_unchanged_s"] / best["aws_unchanged_s"], 2)
    best["aws"] = f"{aws_version(aws)} ({aws})"
    best["load_average"] = [round(value, 1) for value in os.getloadavg()]
    best["all_runs_s"] = {key: [round(v, 2) for v in values] for key, values in rows.items()}
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=200, help="package size (decoded bytes), MB")
    parser.add_argument("--part-size-mb", type=int, nargs="+", default=[8], help="multipart part sizes to compare")
    parser.add_argument("--aws", nargs="?", const="", default=None, metavar="PATH", help="also compare with `aws s3 sync` (PATH to aws; default: PATH or awscli from PyPI)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of the comparison (the best time of each is reported)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--smoke", action="store_true", help="a 2 MB package, one part size, one round: checks the benchmark runs")
    args = parser.parse_args()
    if args.smoke:
        args.size_mb, args.part_size_mb, args.repeat = 2, args.part_size_mb[:1], 1

    os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_EC2_METADATA_DISABLED="true")
    port = free_port()
    server = start_moto(port)
    results = []
    comparison = None
    aws = ensure_awscli(args.aws or None) if args.aws is not None else None
    try:
        with tempfile.TemporaryDirectory() as scratch:
            # Mostly an incompressible model (as real fp32 weights are), plus a compressible one with a .br.
            package = write_package(
                Path(scratch) / "dist",
                name="bench",
                model_bytes=8 * MIB,
                incompressible_bytes=max(args.size_mb * 1_000_000 - 8 * MIB - 64 * 1024, MIB),
            )
            package_bytes = sum(p.stat().st_size for p in package.root.rglob("*") if not p.name.endswith(".br"))
            started = time.perf_counter()
            plan = plan_package(package.root)
            validate_s = time.perf_counter() - started

            for part_mb in args.part_size_mb:
                target = Target(bucket=f"bench-{part_mb}", endpoint_url=f"http://127.0.0.1:{port}", region="us-east-1")
                client = make_client(target)
                client.create_bucket(Bucket=target.bucket)
                client.put_bucket_policy(Bucket=target.bucket, Policy=public_read_policy(target.bucket))  # the check reads anonymously
                first = publish(client, target, [plan], part_size=part_mb * MIB, progress=Progress.quiet())
                again = publish(client, target, [plan], part_size=part_mb * MIB, progress=Progress.quiet())
                assert again.uploaded == 0, "a no-change re-publish uploaded something"
                cli_s = time_cli_republish(package.root, target, part_mb)
                empty_bucket(client, target.bucket)
                results.append(
                    {
                        "part_size_mb": part_mb,
                        "package_mb": round(package_bytes / 1e6, 1),
                        "uploaded_mb": round(first.bytes / 1e6, 1),
                        "objects": first.uploaded,
                        "validate_s": round(validate_s, 2),
                        "publish_s": round(first.seconds, 2),
                        "throughput_mb_s": round(first.bytes / 1e6 / first.seconds, 1),
                        "republish_unchanged_s": round(again.seconds, 3),
                        "republish_unchanged_cli_s": round(cli_s, 2),
                    }
                )
            if aws:
                comparison = compare_with_aws(aws, package.root, plan, f"http://127.0.0.1:{port}", Path(scratch), args.repeat)
    finally:
        server.terminate()
        server.wait(timeout=10)

    if args.json:
        print(json.dumps({"pack": results, "versus_aws_s3_sync": comparison}, indent=2))
        return
    for row in results:
        print(
            f"part {row['part_size_mb']} MiB: package {row['package_mb']} MB ({row['objects']} objects, "
            f"{row['uploaded_mb']} MB uploaded) validated in {row['validate_s']} s, published in "
            f"{row['publish_s']} s = {row['throughput_mb_s']} MB/s; unchanged re-publish {row['republish_unchanged_s']} s "
            f"({row['republish_unchanged_cli_s']} s as a fresh `pack publish` process)"
        )

    if comparison:
        c = comparison
        print(
            f"fresh processes, best of {args.repeat}: full pack publish {c['pack_full_s']} s vs aws s3 sync {c['aws_full_s']} s "
            f"({c['full_ratio']}x); unchanged {c['pack_unchanged_s']} s vs {c['aws_unchanged_s']} s ({c['unchanged_ratio']}x); "
            f"pack unchanged again {c['pack_unchanged_again_s']} s; CPU full {c['pack_full_cpu_s']} s vs {c['aws_full_cpu_s']} s, "
            f"unchanged {c['pack_unchanged_cpu_s']} s vs {c['aws_unchanged_cpu_s']} s; {c['aws']}; load {c['load_average']}"
        )


if __name__ == "__main__":
    main()
