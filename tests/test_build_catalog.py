"""Catalog builds: `pack build A B --jobs N` (each target in its own process, the same packages as
single builds, exit codes 2 > 1 > 0, targets checked before anything is built, --json an array,
Ctrl-C/SIGTERM reaching every child), `pack recipes --matrix`, --cache-url, and the lock file that
concurrent builds share. Tiny generated models, --no-browser."""

from __future__ import annotations

import json
import stat
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from build_helpers import OUTPUT_ALSO_CONSUMED, conv_model, model_from_text, save
from pipeline.cli import app

runner = CliRunner()
ENTRY_KEYS = {"target", "name", "passed", "exit_code", "seconds", "error", "report"}


def pack(*args: str):
    return runner.invoke(app, list(args))


@pytest.fixture(autouse=True)
def no_lavapipe(monkeypatch):
    monkeypatch.setenv("PACK_WEBGPU_KERNELS", "off")  # what is proven here needs no WebGPU check; the builds' processes inherit it


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """Two tiny models (packages tiny-conv and consumed) and recipes around them: strict.toml
    fails its build (fp16 required, bound 0), gone.toml names a source that is not there."""
    folder = tmp_path_factory.mktemp("catalog")
    save(conv_model(), folder / "tiny-conv.onnx")
    save(model_from_text(OUTPUT_ALSO_CONSUMED), folder / "consumed.onnx")
    (folder / "strict.toml").write_text('source.uri = "tiny-conv.onnx"\n[outputs.y.fp16]\nmax_abs = 0.0\n[verify]\nrequire = ["fp16"]\n')
    (folder / "gone.toml").write_text('source.uri = "missing.onnx"\n')
    return folder


def _files(folder: Path) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


def test_two_targets_two_at_a_time_make_the_packages_single_builds_make(models, tmp_path):
    targets = [str(models / "tiny-conv.onnx"), str(models / "consumed.onnx")]
    single = tmp_path / "single"
    for target in targets:
        assert pack("build", target, "--no-browser", "--no-reuse", "--out", str(single)).exit_code == 0
    catalog = tmp_path / "catalog"
    result = pack("build", *targets, "--jobs", "2", "--no-browser", "--no-reuse", "--json", "--out", str(catalog))
    assert result.exit_code == 0, result.output
    entries = json.loads(result.stdout)  # the array and nothing else on stdout
    assert [entry["name"] for entry in entries] == ["tiny-conv", "consumed"] and [entry["target"] for entry in entries] == targets
    for entry in entries:
        assert set(entry) == ENTRY_KEYS and entry["passed"] is True and entry["exit_code"] == 0 and entry["error"] is None
        package = catalog / entry["name"]
        assert entry["report"] == json.loads((package / "report.json").read_text())
        assert (package / "manifest.json").read_bytes() == (single / entry["name"] / "manifest.json").read_bytes()
        assert _files(package) == _files(single / entry["name"])
    assert not [path for path in catalog.iterdir() if path.name.startswith(".")]  # no staging folder left


def test_exit_code_is_2_for_bad_input_else_1_for_a_failed_build(models, tmp_path):
    tiny, strict, gone = (str(models / name) for name in ("tiny-conv.onnx", "strict.toml", "gone.toml"))
    failed = pack("build", tiny, strict, "-j", "2", "--no-browser", "--json", "--out", str(tmp_path / "a"))
    assert failed.exit_code == 1, failed.output
    by_name = {entry["name"]: entry for entry in json.loads(failed.stdout)}
    assert by_name["tiny-conv"]["exit_code"] == 0 and by_name["strict"]["exit_code"] == 1 and by_name["strict"]["passed"] is False
    assert by_name["strict"]["report"]["verdict"][0].startswith("variant fp16 is required")
    assert (tmp_path / "a" / "strict" / "manifest.json").is_file()  # a failed build still writes its package
    # a source found missing only when its build fetches it: that target is bad input, the others still build
    out = tmp_path / "b"
    bad = pack("build", gone, tiny, "--no-browser", "--out", str(out))
    assert bad.exit_code == 2, bad.output
    assert (out / "tiny-conv" / "manifest.json").is_file() and not (out / "gone").exists()
    # for people: a line as each starts and as it ends (verdict, seconds, where), then the count
    lines = bad.stdout.splitlines()
    assert lines[0] == f"building 2 packages, 1 at a time, into {out}/"
    assert lines[1:3] == [f"gone: started ({gone})", next(line for line in lines if line.startswith("gone: error (exit 2) after "))]
    assert lines[2].endswith(f": source 'missing.onnx': no such file ({models / 'missing.onnx'}); check the path")
    assert lines[3] == f"tiny-conv: started ({tiny})"
    assert lines[4].startswith("tiny-conv: PASSED in ") and lines[4].endswith(f" skipped) -> {out / 'tiny-conv'}")
    assert lines[5].startswith("1 of 2 packages passed; not passed: gone") and len(lines) == 6


@pytest.mark.parametrize(
    "targets, extra, message",
    [
        (["tiny-conv.onnx", "no-such-recipe"], [], "'no-such-recipe': not a built-in recipe"),
        (["tiny-conv.onnx", "absent.onnx"], [], "absent.onnx: no such model file"),
        (["tiny-conv.onnx", "mp-senet"], [], "mp-senet: "),  # a recipe with no public file
        (["tiny-conv.onnx", "tiny-conv.onnx"], [], "makes the package 'tiny-conv', as "),
        (["tiny-conv.onnx", "https://example.com/m.onnx"], [], "a model URL needs --sha256"),
        (["tiny-conv.onnx", "consumed.onnx"], ["--input", "x=1x3"], "--input describes one target, and 2 are given"),
    ],
    ids=["unknown-recipe", "missing-model", "no-source", "same-package", "url", "per-target-option"],
)
def test_a_bad_target_exits_2_before_anything_is_built(models, tmp_path, targets, extra, message):
    out = tmp_path / "dist"
    paths = [str(models / target) if target.endswith(".onnx") and "://" not in target else target for target in targets]
    result = pack("build", *paths, *extra, "--no-browser", "--out", str(out))
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], result.output
    assert "started" not in result.output and not out.exists()


def _children(pid: int) -> set[int]:
    """The processes `pid` started, from any of its threads."""
    found = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found.update(int(child) for child in (task / "children").read_text().split())
        except OSError:
            pass
    return found


def test_a_catalog_build_into_a_log_never_falls_silent_and_json_stays_quiet(models, tmp_path):
    """stdout a pipe (a CI log): timestamped lines, and a "still running" line per running target
    whenever the log was silent for the interval (0.5 s here, 30 s by default); --json: the array alone."""
    import re

    command = [sys.executable, "-m", "pipeline.cli", "build", str(models / "tiny-conv.onnx"), str(models / "consumed.onnx"), "-j", "2", "--no-browser"]
    env = {**os.environ, "PACK_PROGRESS_INTERVAL_S": "0.5"}
    log = subprocess.run([*command, "--no-reuse", "--out", str(tmp_path / "a")], capture_output=True, text=True, env=env, timeout=300)
    assert log.returncode == 0, log.stdout + log.stderr
    timed = [re.match(r"\[\s*(\d+)s\] (.*)", line) for line in log.stdout.splitlines()[:-1]]  # the count line last, as on a terminal
    assert all(timed), log.stdout
    seconds = [int(match.group(1)) for match in timed]
    assert max(b - a for a, b in zip(seconds, seconds[1:])) <= 1, log.stdout  # whole seconds: 0.5 s apart at most
    said = [match.group(2) for match in timed]
    for name in ("tiny-conv", "consumed"):
        assert any(line.startswith(f"{name}: still running (") for line in said), log.stdout
        assert any(line.startswith(f"{name}: PASSED in ") for line in said), log.stdout
    # the stored builds reused: each child still runs for seconds (a Python process, the package copied)
    quiet = subprocess.run([*command, "--json", "--out", str(tmp_path / "b")], capture_output=True, text=True, env=env, timeout=300)
    assert quiet.returncode == 0 and [entry["passed"] for entry in json.loads(quiet.stdout)] == [True, True], quiet.stdout + quiet.stderr
    assert "still running" not in quiet.stdout + quiet.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_stops_every_build_and_leaves_no_half_written_package(models, tmp_path, signum):
    out = tmp_path / "dist"
    command = [sys.executable, "-m", "pipeline.cli", "build", str(models / "tiny-conv.onnx"), str(models / "consumed.onnx"), "-j", "2", "--no-browser", "--no-reuse", "--out", str(out)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    children: set[int] = set()
    deadline = time.monotonic() + 60
    # signalled while a build is assembling its package (a staging folder exists)
    while not (out.is_dir() and any(path.name.startswith(".") for path in out.iterdir())):
        children |= _children(process.pid)
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.005)
    children |= _children(process.pid)
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=60)
    name = signal.Signals(signum).name
    assert process.returncode == 128 + signum, stdout + stderr
    assert f"stopped ({name}) after" in stdout
    assert stderr.count(f"interrupted ({name}): stopped and cleaned up") == 1 and "Traceback" not in stderr, stderr
    # each child got the signal, cleaned up and ended before this process did
    assert len(children) == 2 and not [pid for pid in children if Path(f"/proc/{pid}").exists()]
    leftovers = [path.name for path in out.iterdir() if path.name.startswith(".")]
    assert not leftovers
    for package in out.iterdir():  # a build that ended before the signal is whole
        assert (package / "manifest.json").is_file() and (package / "report.json").is_file()
        assert f"{package.name}: PASSED in " in stdout


def test_cache_url_reaches_each_target_as_a_flag_not_the_environment(monkeypatch, tmp_path):
    from pipeline.commands.build_target import BuildFlags

    monkeypatch.delenv("PACK_CACHE_URL", raising=False)
    (tmp_path / "shared").mkdir()
    url = f"file://{tmp_path / 'shared'}"
    pack("build", "no-such-recipe", "--cache-url", url, "--out", str(tmp_path / "d"))
    assert "PACK_CACHE_URL" not in os.environ  # the command hands the store down; it sets nothing for the process
    # each target's process gets it with the rest of its flags (on stdin) and opens its own session
    assert BuildFlags.from_data(json.loads(json.dumps(BuildFlags(cache_url=url).to_data()))).cache_url == url
    bad = pack("build", "gtcrn", "migan", "--cache-url", "ftp://host/x", "--out", str(tmp_path / "d"))
    assert bad.exit_code == 2 and bad.output.startswith("error: PACK_CACHE_URL=ftp://host/x: not a shared cache URL"), bad.output
    assert not (tmp_path / "d").exists() or not list((tmp_path / "d").iterdir())


def test_recipes_matrix_for_github_actions():
    rows = json.loads(pack("recipes", "--json").stdout)
    every = pack("recipes", "--matrix")
    assert every.exit_code == 0 and len(every.stdout.splitlines()) == 1  # one line: $GITHUB_OUTPUT's matrix=...
    assert json.loads(every.stdout) == {"include": [{"recipe": row["name"]} for row in rows]}
    public = json.loads(pack("recipes", "--matrix", "--public").stdout)["include"]
    assert [entry["recipe"] for entry in public] == [row["name"] for row in rows if row["source"]]
    assert {"gtcrn"} <= {entry["recipe"] for entry in public} and "mp-senet" not in {entry["recipe"] for entry in public}
    assert json.loads(pack("recipes", "migan", "gtcrn", "--matrix").stdout) == {"include": [{"recipe": "gtcrn"}, {"recipe": "migan"}]}
    assert [row["name"] for row in json.loads(pack("recipes", "gtcrn", "--json").stdout)] == ["gtcrn"]
    for args, message in ((["nope", "--matrix"], "recipe 'nope': not a built-in recipe"), (["--matrix", "--json"], "--json with --matrix")):
        result = pack("recipes", *args)
        assert result.exit_code == 2 and result.output.startswith(f"error: {message}"), result.output


def test_builds_writing_one_lock_file_at_once_lose_no_entry(tmp_path):
    lock = tmp_path / "pack.lock.json"
    script = (
        "import sys; from pathlib import Path; from pipeline.lockfile import LockFile\n"
        "lock = LockFile(Path(sys.argv[1]))\n"
        "for i in range(40): lock.put(f'{sys.argv[2]}-{i}', 'source', {'sha256': str(i)})\n"
    )
    writers = [subprocess.Popen([sys.executable, "-c", script, str(lock), tag]) for tag in ("a", "b", "c")]
    assert [writer.wait(timeout=60) for writer in writers] == [0, 0, 0]
    data = json.loads(lock.read_text())
    assert len(data) == 1 + 3 * 40 and data["c-39"] == {"source": {"sha256": "39"}}
    assert stat.S_IMODE(lock.stat().st_mode) == 0o666 & ~umask()  # the umask's, as a committed file expects


def umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
