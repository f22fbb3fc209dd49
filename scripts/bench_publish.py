"""Benchmark `pack publish` against a loopback S3 server (moto in server mode, its own process).

Measures, for a package of about --size-mb MB: validation (hash + brotli check) time, first
publish time and throughput, and the time of a no-change re-publish (which must upload nothing).

    .venv/bin/python scripts/bench_publish.py [--size-mb 200] [--part-size-mb 8 16] [--json]

Numbers depend on the machine: moto keeps objects in memory and is the bottleneck on loopback,
so the throughput is a floor for what the client side sustains, not a network figure.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.progress import Progress  # noqa: E402
from pipeline.publish.plan import plan_package  # noqa: E402
from pipeline.publish.publisher import publish  # noqa: E402
from pipeline.publish.s3 import Target, make_client  # noqa: E402
from tests.publish_helpers import ACCESS_KEY, SECRET_KEY, write_package  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=200, help="package size (decoded bytes), MB")
    parser.add_argument("--part-size-mb", type=int, nargs="+", default=[8], help="multipart part sizes to compare")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()

    os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_EC2_METADATA_DISABLED="true")
    port = free_port()
    server = start_moto(port)
    results = []
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
                first = publish(client, target, [plan], part_size=part_mb * MIB, progress=Progress.quiet())
                again = publish(client, target, [plan], part_size=part_mb * MIB, progress=Progress.quiet())
                assert again.uploaded == 0, "a no-change re-publish uploaded something"
                cli_s = time_cli_republish(package.root, target, part_mb)
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
    finally:
        server.terminate()
        server.wait(timeout=10)

    if args.json:
        print(json.dumps(results, indent=2))
        return
    for row in results:
        print(
            f"part {row['part_size_mb']} MiB: package {row['package_mb']} MB ({row['objects']} objects, "
            f"{row['uploaded_mb']} MB uploaded) validated in {row['validate_s']} s, published in "
            f"{row['publish_s']} s = {row['throughput_mb_s']} MB/s; unchanged re-publish {row['republish_unchanged_s']} s "
            f"({row['republish_unchanged_cli_s']} s as a fresh `pack publish` process)"
        )


if __name__ == "__main__":
    main()
