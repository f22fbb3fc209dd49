#!/usr/bin/env python3
"""Benchmark the shared cache (`--cache-url`, pipeline/shared_cache.py): side by side, per target, a
cold machine and a second machine building the same thing through the same shared store.

Each machine is a fresh, empty PACK_CACHE_DIR, npm and pip cache and its own working folder (so a
lock file one machine writes is not read by the next); each build is `pack build TARGET --no-browser --cache-url
URL` as a subprocess, timed by its wall clock. (a) cold: an empty store; (b) second machine: the
store the cold build filled; (c) with --partial, a third machine builds a copy of the recipe with a
looser fp32 bound on its first output (host runs and unchanged conversions stay valid), to show
what is reused below the whole package. The second machine's package is compared with the cold
one, every file byte for byte. Each target gets its own empty store: a bucket of a moto S3 server on
loopback started here (no account), or a folder under --store DIR (empty or new). The issue's goal:
the second machine in at most 0.25x the cold time. --smoke starts every machine with onnxruntime-web
and its brotli encodings linked from this machine's cache (as CI restores them), so it takes seconds.

Targets: a built-in recipe name, a recipe .toml, or an .onnx; an export in tests/data/flagship_real/
is built with its recipe and its real --input sizes (cases.json). Default: gtcrn, isnet-fp16 and
tests/data/flagship_real/vocos.onnx. Not a test: it prints figures, it asserts nothing.

    .venv/bin/python scripts/bench/bench_shared_cache.py [TARGET ...] [--store DIR] [--partial] [--browser] [--json]
    .venv/bin/python scripts/bench/bench_shared_cache.py --smoke --json   # a generated 2-node model, a folder store, seconds
"""

from __future__ import annotations

import argparse
import filecmp
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pipeline.recipe import find_recipe  # noqa: E402
from pipeline.shared_cache import store_from_url  # noqa: E402

FLAGSHIP = REPO / "tests" / "data" / "flagship_real"
DEFAULT_TARGETS = ("gtcrn", "isnet-fp16", "tests/data/flagship_real/vocos.onnx")
GOAL = 0.25  # second machine / cold
# --partial: a looser fp32 bound than the defaults (pipeline/verify/thresholds.py), per output kind
LOOSER_FP32 = {"audio": ("snr_db", 45.0), "image": ("psnr_db", 55.0)}
LOOSER_FP32_OTHER = ("rel_l2", 2e-3)


def fail(message: str) -> None:
    """Bad input: one line naming the option or target, exit 2, before any build."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def target_args(target: str) -> tuple[list[str], Path | None]:
    """The `pack build` arguments for `target`, and the recipe file it is built with (None: a bare model)."""
    path = Path(target).absolute() if Path(target).exists() else REPO / target  # from here, or from the repository
    if path.suffix == ".onnx" and path.parent.resolve() == FLAGSHIP.resolve():
        case = json.loads((FLAGSHIP / "cases.json").read_text())[path.stem]
        args = [case["recipe"], "--source", str(path), "--sha256", hashlib.sha256(path.read_bytes()).hexdigest()]
        return args + [f"--input={shape}" for shape in case["inputs"]], find_recipe(case["recipe"])
    if path.suffix in (".onnx", ".toml"):
        return [str(path)], path if path.suffix == ".toml" else None
    return [target], find_recipe(target)


def looser_recipe(recipe: Path, folder: Path) -> Path:
    """A copy of `recipe` (same file name: it is keyed) with a looser fp32 bound on its first output."""
    import tomllib

    outputs = tomllib.loads(recipe.read_text()).get("outputs") or {}
    if not outputs:
        fail(f"--partial: recipe {recipe} has no [outputs] table to loosen a bound in; give a target whose recipe names its outputs")
    name, spec = next(iter(outputs.items()))
    if "fp32" in spec:
        fail(f"--partial: recipe {recipe} already sets [outputs.{name}.fp32]; give a target without one")
    key, value = LOOSER_FP32.get(spec.get("kind"), LOOSER_FP32_OTHER)
    folder.mkdir(parents=True)
    copy = folder / recipe.name
    copy.write_text(f"{recipe.read_text()}\n[outputs.{name}.fp32]\n{key} = {value}\n")
    return copy


def timed_build(args: list[str], machine: Path, url: str, env: dict[str, str], browser: bool, seed: bool) -> dict:
    """One build on a fresh machine: wall seconds, the package folder, what it printed about reuse."""
    (machine / "cache").mkdir(parents=True)
    if seed:
        seed_machine(machine / "cache")
    out = machine / "dist"
    command = [sys.executable, "-m", "pipeline.cli", "build", *args, "--out", str(out), "--cache-url", url, *([] if browser else ["--no-browser"])]
    start = time.perf_counter()
    # npm's and pip's own caches are per machine too: on one host, a second machine would otherwise
    # find the registry archives the first one fetched
    own = {"PACK_CACHE_DIR": str(machine / "cache"), "npm_config_cache": str(machine / "npm-cache"), "PIP_CACHE_DIR": str(machine / "pip-cache")}
    done = subprocess.run(command, capture_output=True, text=True, cwd=machine, env={**env, **own})
    wall = time.perf_counter() - start
    if done.returncode not in (0, 1):  # 1: built, not every check passed; still a package to compare
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")] or done.stderr.strip().splitlines()[-1:] or ["no message"]
        print(f"error: pack {' '.join(command[3:])} exited {done.returncode}: {errors[-1].removeprefix('error: ')}", file=sys.stderr)
        sys.exit(done.returncode)
    (package,) = [p for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")]
    shared = next((line for line in done.stdout.splitlines() if line.startswith("shared cache ")), None)
    read = re.search(r": (\d+) entries read \(([\d.]+) MB\), (\d+) written \(([\d.]+) MB\)", shared or "")
    report = json.loads((package / "report.json").read_text())
    return {
        "seconds": round(wall, 2),
        "package": package,
        "exit_code": done.returncode,
        "unchanged": any(line.startswith("unchanged:") for line in done.stdout.splitlines()),
        "warnings": [line for line in done.stderr.splitlines() if line.startswith("warning:")],  # a discarded object, a store that stopped answering
        "shared": shared,
        "entries_read": int(read[1]) if read else 0,
        "read_mb": float(read[2]) if read else 0.0,
        "entries_written": int(read[3]) if read else 0,
        # what the machine holds after the build, per cache area: beside what it read from the store,
        # what it fetched or made itself (a registry's archive in packages/, a runtime installed)
        "local_areas": {area.name: round(sum(f.stat().st_size for f in area.rglob("*") if f.is_file()) / 1e6, 2) for area in sorted((machine / "cache").iterdir()) if area.is_dir()},
        "timings": report.get("timings", {}),
    }


def same_files(a: Path, b: Path) -> bool:
    """Every file of both packages, by relative path and bytes."""
    files = lambda root: sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())  # noqa: E731
    names = files(a)
    return names == files(b) and all(filecmp.cmp(a / name, b / name, shallow=False) for name in names)


def store_contents(url: str) -> dict:
    """Objects and bytes in the store, in all and per cache area (blobs: the files of folder entries)."""
    areas: dict[str, list[int]] = {}
    for stored in store_from_url(url).objects():
        area = areas.setdefault(stored.name.split("/")[0], [0, 0])
        area[0], area[1] = area[0] + 1, area[1] + stored.size
    return {"objects": sum(a[0] for a in areas.values()), "bytes": sum(a[1] for a in areas.values()),
            "areas": {name: {"objects": a[0], "bytes": a[1]} for name, a in sorted(areas.items())}}


def measure(target: str, scratch: Path, url: str, env: dict[str, str], partial: bool, browser: bool, seed: bool) -> dict:
    args, recipe = target_args(target)
    if partial and recipe is None:
        fail(f"--partial: target {target} is a bare model; give a recipe (name or .toml) to change a setting in")
    looser = looser_recipe(recipe, scratch / "partial-recipe") if partial else None  # bad input shows before any build
    cold = timed_build(args, scratch / "cold", url, env, browser, seed)
    store = store_contents(url)
    second = timed_build(args, scratch / "second", url, env, browser, seed)
    row = {
        "target": target,
        "cold_s": cold["seconds"],
        "second_s": second["seconds"],
        "ratio": round(second["seconds"] / cold["seconds"], 3),
        "identical": same_files(cold["package"], second["package"]),
        "store_objects": store["objects"],
        "store_bytes": store["bytes"],
        "store_areas": store["areas"],
        "cold": {k: v for k, v in cold.items() if k != "package"},
        "second": {k: v for k, v in second.items() if k not in ("package", "timings")},
        "partial": None,
    }
    if looser is not None:
        changed = timed_build([str(looser), *args[1:]], scratch / "partial", url, env, browser, seed)
        row["partial"] = {"ratio": round(changed["seconds"] / cold["seconds"], 3), **{k: v for k, v in changed.items() if k != "package"}}
    return row


def smoke_target(folder: Path) -> str:
    """A recipe for a generated 2-node model (scripts/bench/bench_build.py's), with an output table for --partial."""
    from scripts.bench.bench_build import small_model

    model = small_model(folder)
    recipe = folder / "small.toml"
    recipe.write_text(f'name = "small"\n\n[source]\nuri = "{model}"\n\n[outputs.y]\nkind = "tensor"\n')
    return str(recipe)


def seed_machine(cache: Path) -> None:
    """--smoke only: a machine image with onnxruntime-web installed and its brotli encodings (what
    CI restores before its suite, scripts/ci_brotli_seed.py), linked from this machine's cache, so a
    2-node build takes seconds; the model's own work still starts cold."""
    from pipeline.cache import cache_root

    for area in ("runtime", "brotli"):
        if (cache_root() / area).is_dir():
            shutil.copytree(cache_root() / area, cache / area, copy_function=_link_or_copy, ignore=shutil.ignore_patterns("*.lock"))


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


class Stores:
    """A fresh, empty shared store per target (a cold machine finds nothing, not even the runtime
    an earlier target stored): buckets of one moto S3 server on loopback, or folders under --store."""

    def __init__(self, folder: Path | None, env: dict[str, str]):
        self.folder, self.server, self.count = folder, None, 0
        if folder is not None:
            if folder.exists() and any(folder.iterdir()):
                fail(f"--store {folder}: not empty; give an empty or new folder (each cold machine needs an empty store)")
            return
        from tests.publish_helpers import ACCESS_KEY, SECRET_KEY, MotoS3

        self.server = MotoS3()
        aws = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_ENDPOINT_URL": self.server.url, "AWS_EC2_METADATA_DISABLED": "true"}
        env.update(aws)
        os.environ.update(aws)  # this process lists the stores too

    def new(self) -> str:
        self.count += 1
        if self.server is None:
            store = self.folder / f"store-{self.count}"
            store.mkdir(parents=True)
            return str(store.resolve())
        from tests.publish_helpers import new_bucket

        return f"s3://{new_bucket(self.server, public=False)}/pack-cache"

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", help=f"recipe names, recipe .toml files or .onnx models (default: {' '.join(DEFAULT_TARGETS)})")
    parser.add_argument("--store", type=Path, default=None, help="a folder as the shared store (empty or new) instead of a moto S3 server")
    parser.add_argument("--partial", action="store_true", help="also a third machine with a looser fp32 bound in a recipe copy: what is reused below the package")
    parser.add_argument("--browser", action="store_true", help="build with the browser check (slow under SwiftShader)")
    parser.add_argument("--smoke", action="store_true", help="a generated 2-node model and a folder store: checks the benchmark runs")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PACK_", "AWS_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))  # builds run from each machine's folder
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="pack-bench-shared-") as tmp:
        scratch = Path(tmp)
        if args.smoke:
            targets = [smoke_target(scratch)]
            args.store = args.store or scratch / "stores"
            env["PACK_WEBGPU_KERNELS"] = "off"  # lavapipe's shader compiles would dominate a 2-node build
        else:
            targets = args.targets or list(DEFAULT_TARGETS)
        stores = Stores(args.store, env)
        try:
            rows = [measure(target, scratch / f"target-{i}", stores.new(), env, args.partial, args.browser, args.smoke) for i, target in enumerate(targets)]
        finally:
            stores.stop()
    figures = {"store": "folder" if args.store else "moto S3", "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]},
               "cpus": os.cpu_count(), "goal_ratio": GOAL, "targets": rows}
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"shared store: {figures['store']}; load average {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after, {os.cpu_count()} CPUs; goal: second <= {GOAL} x cold")
    print(f"{'target':<40} {'cold s':>8} {'second s':>9} {'ratio':>6} {'identical':>9} {'store bytes':>14}" + ("  partial s (ratio)" if args.partial else ""))
    for row in rows:
        partial = f"  {row['partial']['seconds']:.1f} ({row['partial']['ratio']:.2f})" if row["partial"] else ""
        print(f"{Path(row['target']).name:<40} {row['cold_s']:>8.1f} {row['second_s']:>9.1f} {row['ratio']:>6.2f} {str(row['identical']):>9} {row['store_bytes']:>14,}{partial}")
    for row in rows:
        second = row["second"]
        print(f"{Path(row['target']).name}: second machine {'linked the stored package (unchanged)' if second['unchanged'] else 'ran the stages'}; {second['shared'] or 'read nothing from the shared store'}")
        if row["cold"]["exit_code"] or second["exit_code"]:
            print(f"  exit codes: cold {row['cold']['exit_code']}, second {second['exit_code']} (a build that failed a check is never stored)")
        for machine in ("cold", "second"):
            for line in row[machine]["warnings"]:
                print(f"  {machine} machine: {line}")
        print("  second machine's local cache (MB): " + ", ".join(f"{name} {mb:.1f}" for name, mb in second["local_areas"].items()))
        print("  store: " + ", ".join(f"{name} {area['bytes'] / 1e6:.1f} MB ({area['objects']})" for name, area in row["store_areas"].items()))
        if row["partial"]:
            print(f"  partial: {row['partial']['shared'] or 'read nothing from the shared store'}; stages: " + ", ".join(f"{k} {v:.1f}" for k, v in row["partial"]["timings"].items()))


if __name__ == "__main__":
    main()
