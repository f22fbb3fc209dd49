"""The command line itself: --version, -h everywhere with an example, and light imports."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli import app

runner = CliRunner()
from pipeline.cli import COMMANDS as COMMAND_TABLE, load_command

COMMANDS = list(COMMAND_TABLE)
HEAVY = ("onnx", "onnxruntime", "playwright")
# What `pack --help` and `pack recipes` must not load either: they run in every CI job.
LIGHT_FORBIDS = (*HEAVY, "numpy", "boto3", "botocore", "s3transfer", "brotli", "jsonschema")


def test_version_comes_from_the_package_metadata():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"pack {metadata.version('pack')}"


@pytest.mark.parametrize("command", COMMANDS)
def test_short_help_with_an_example(command):
    short, long = runner.invoke(app, [command, "-h"]), runner.invoke(app, [command, "--help"])
    assert short.exit_code == 0 and short.output == long.output
    assert "Example" in short.output and f"pack {command}" in short.output.split("Example", 1)[1]


def test_top_level_short_help_lists_every_command():
    result = runner.invoke(app, ["-h"])
    assert result.exit_code == 0
    for command in COMMANDS:
        assert command in result.output


def _modules_loaded_by(args_list: list[list[str]], watched: tuple[str, ...]) -> tuple[list[int], list[str]]:
    """Exit codes of `pack ARGS...` run in one fresh interpreter, and which `watched` modules it loaded."""
    script = f"""
import json, sys
from typer.testing import CliRunner
from pipeline.cli import app
runner = CliRunner(env={{"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_MAX_ATTEMPTS": "1"}})
codes = [runner.invoke(app, args).exit_code for args in {args_list!r}]
print(json.dumps({{"codes": codes, "loaded": sorted(m for m in {watched!r} if m in sys.modules)}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return report["codes"], report["loaded"]


def test_help_and_recipes_load_no_numpy_boto_brotli_jsonschema_or_onnx():
    codes, loaded = _modules_loaded_by([["--help"], ["recipes"], ["recipes", "--json"]], LIGHT_FORBIDS)
    assert codes == [0, 0, 0]
    assert loaded == []


def test_publish_does_not_load_onnx_onnxruntime_or_playwright(tmp_path):
    from publish_helpers import write_package

    package = write_package(tmp_path / "dist").root
    # The bucket is unreachable: --dry-run prints the local plan.
    codes, loaded = _modules_loaded_by([["publish", str(package), "--bucket", "b", "--endpoint-url", "http://127.0.0.1:9", "--dry-run"]], HEAVY)
    assert codes == [0]
    assert loaded == []


@pytest.mark.parametrize("name", COMMANDS)
def test_each_listed_summary_is_the_first_line_of_the_command_help(name):
    # The table in pipeline/cli.py lists commands without importing them; it must say what they say.
    command = load_command(name)
    assert command.help.strip().splitlines()[0] == COMMAND_TABLE[name].summary


def test_progress_draws_concurrent_bars_with_amounts_and_rates_and_is_silent_otherwise():
    import io
    import threading

    from pipeline.progress import Progress

    stream = io.StringIO()
    progress = Progress(enabled=True, stream=stream)
    progress.note("step [one]")
    with progress.task("upload a", total=4_000_000, unit="bytes") as first, progress.task("checks", total=3) as second:
        workers = [threading.Thread(target=lambda: [first.advance(1_000_000) for _ in range(4)]), threading.Thread(target=lambda: [second.advance(1) for _ in range(3)])]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "step [one]"
    upload = next(line for line in lines if line.startswith("upload a"))
    checks = next(line for line in lines if line.startswith("checks"))
    assert "100%" in upload and "4.0/4.0 MB" in upload and "/s" in upload
    assert "100%" in checks and "3/3" in checks
    for silent in (Progress.quiet(), Progress(stream=io.StringIO())):  # --json; not a terminal
        with silent.task("x", total=2) as task:
            task.advance(2)
        silent.note("nothing")
        assert silent.enabled is False
    quiet_stream = io.StringIO()
    not_a_terminal = Progress(stream=quiet_stream)
    with not_a_terminal.task("x", total=1) as task:
        task.advance(1)
    assert quiet_stream.getvalue() == ""


class _TimedLines:
    """A log stream that records when each line was written."""

    def __init__(self):
        import time

        self.clock = time.monotonic
        self.lines: list[tuple[float, str]] = []

    def write(self, text: str) -> None:
        for line in text.splitlines():
            self.lines.append((self.clock(), line))

    def flush(self) -> None:
        pass


def test_plain_lines_never_leave_the_log_silent_longer_than_the_interval():
    """A CI log (not a terminal): a line as each step begins and ends, and while a slow step runs a
    "still running" line whenever the interval passed without one; the interval is injected (here
    0.1 s for a 0.7-s step: the same code writes one every 30 s in a real build)."""
    import time

    from pipeline.progress import Progress

    stream = _TimedLines()
    started = stream.clock()
    progress = Progress.lines(stream, interval_s=0.1)
    progress.note("stage one, https://user:secret@example.com/m.onnx")
    slow = progress.step("stage slow", lambda seconds: time.sleep(seconds) or "made")
    assert slow(0.7) == "made"
    with progress.task("upload", total=3, unit="files") as task:
        for _ in range(3):
            time.sleep(0.15)
            task.advance(1)
    failing = progress.step("stage broken", lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failing()
    ended = stream.clock()
    text = [line for _, line in stream.lines]
    assert all(line.startswith("[") and "s] " in line for line in text), text
    messages = [line.split("s] ", 1)[1] for line in text]
    assert messages[0] == "stage one, https://***@example.com/m.onnx"  # URLs masked as everywhere
    assert messages[1] == "stage slow: started" and any(m.startswith("stage slow: done in 0.7") for m in messages), messages
    assert sum(m.startswith("stage slow: still running") for m in messages) >= 4, messages
    assert any(m.startswith("upload: still running") and "/3 files" in m for m in messages), messages
    assert messages[-1].startswith("stage broken: stopped after"), messages
    # the gaps: from the start, between lines, to the end; never much over the interval
    times = [started, *(when for when, _ in stream.lines), ended]
    gaps = [later - earlier for earlier, later in zip(times, times[1:])]
    assert max(gaps) < 0.1 + 0.15, gaps
    # no watcher left behind
    assert not [thread for thread in __import__("threading").enumerate() if thread.name.startswith("progress: ")]


def test_pack_build_into_a_pipe_logs_each_stage_and_nothing_under_json(tmp_path):
    import os

    from build_helpers import conv_model, save

    model = save(conv_model(), tmp_path / "tiny.onnx")
    env = {**os.environ, "PACK_WEBGPU_KERNELS": "off", "PACK_PROGRESS_INTERVAL_S": "0.5", "NO_COLOR": "1"}
    command = [sys.executable, "-m", "pipeline.cli", "build", str(model), "--no-browser", "--out", str(tmp_path / "dist")]
    built = subprocess.run([*command, "--no-reuse"], capture_output=True, text=True, env=env, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    log = built.stdout.splitlines()
    for stage in ("fetch", "host_verify", "write"):
        assert any(line.endswith(f"stage {stage}: started") for line in log), log
        assert any(f"stage {stage}: done in " in line for line in log), log
    assert "\x1b" not in built.stdout + built.stderr  # plain lines: no bars, no colours
    # --json: the report alone on stdout
    quiet = subprocess.run([*command, "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert quiet.returncode == 0, quiet.stderr
    assert json.loads(quiet.stdout)["name"] == "tiny"
    bad = subprocess.run(command, capture_output=True, text=True, env={**env, "PACK_PROGRESS_INTERVAL_S": "soon"}, timeout=120)
    assert bad.returncode == 2 and "PACK_PROGRESS_INTERVAL_S='soon'" in bad.stderr, bad.stderr
