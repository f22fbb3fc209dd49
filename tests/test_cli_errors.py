"""Bad input and interruptions through the CLI: exit 2 with one `error:` line that names the
culprit and the fix, nothing written, no leftovers (also after SIGTERM); files follow the umask."""

from __future__ import annotations

import functools
import shutil
import hashlib
import http.server
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from build_helpers import conv_model, model_from_text, save
from process_helpers import interruptible

runner = CliRunner()
REPO = Path(__file__).resolve().parent.parent
TWO_INPUTS = """
<ir_version: 8, opset_import: ["" : 17]>
two (float[2, 4] x, float[2, 4] s) => (float[2, 4] y) { y = Mul (x, s) }
"""


@pytest.fixture
def conv_file(tmp_path) -> Path:
    return save(conv_model(), tmp_path / "tiny-conv.onnx")


def refused(args: list[str], *fragments: str, out: Path | None = None) -> str:
    """Run `pack ARGS`; assert exit 2, one `error:` line holding `fragments`, nothing else on the
    output, and `out` (when given) absent or empty. Returns the error line."""
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.output
    if out is not None:
        assert not out.exists() or (out.is_dir() and not any(out.iterdir())) or out.is_file()
    return lines[0]


def test_out_naming_a_file_or_under_a_file(conv_file, tmp_path):
    file = tmp_path / "notes.txt"
    file.write_text("keep me")
    refused(["build", str(conv_file), "--no-browser", "--out", str(file)], f"--out {file}: is a file, not a folder", "give --out a writable folder")
    refused(["build", str(conv_file), "--no-browser", "--out", str(file / "sub")], f"{file} is a file", "--out")
    assert file.read_text() == "keep me"


@contextmanager
def read_only_folder(path: Path):
    """A folder nobody running this test can write into: chmod 555 for a normal user; root
    ignores modes, so for root the folder is made immutable (chattr +i) or the test is skipped."""
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield path
        finally:
            path.chmod(0o755)
        return
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("running as root without chattr +i: no folder is read-only")
    try:
        yield path
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_read_only_out_is_refused_before_any_work(conv_file, tmp_path):
    with read_only_folder(tmp_path / "read-only") as folder:
        refused(["build", str(conv_file), "--no-browser", "--out", str(folder)], f"--out {folder}: {folder} is read-only; give --out a writable folder")
        refused(["build", str(conv_file), "--no-browser", "--out", str(folder / "dist")], f"--out {folder / 'dist'}: {folder} is read-only")
        assert list(folder.iterdir()) == []


def test_read_only_cache_is_refused_before_any_work(conv_file, tmp_path, monkeypatch):
    out = tmp_path / "dist"
    with read_only_folder(tmp_path / "cache") as folder:
        monkeypatch.setenv("PACK_CACHE_DIR", str(folder))
        refused(["build", str(conv_file), "--no-browser", "--out", str(out)], f"PACK_CACHE_DIR={folder}: cannot write there", "set PACK_CACHE_DIR to a writable folder", out=out)
        assert list(folder.iterdir()) == [] and not out.exists()


def test_verify_of_a_model_file_or_a_plain_folder(conv_file, tmp_path):
    refused(["verify", str(conv_file)], f"{conv_file}: is a file, not a package folder", f"pack build {conv_file}")
    refused(["verify", str(tmp_path)], "not a package (no manifest.json)")
    refused(["verify", str(tmp_path / "absent")], "no such folder")


def test_verify_opens_the_shared_store_its_option_names_before_any_work(tmp_path, monkeypatch):
    monkeypatch.delenv("PACK_CACHE_URL", raising=False)
    refused(["verify", str(tmp_path), "--cache-url", "ftp://host/x"], "PACK_CACHE_URL=ftp://host/x: not a shared cache URL")
    monkeypatch.setenv("PACK_CACHE_URL", str(tmp_path / "no-store"))  # the option's variable
    refused(["verify", str(tmp_path)], f"PACK_CACHE_URL={tmp_path / 'no-store'}: no such folder")


def test_recipe_output_that_the_model_lacks_names_the_key_and_the_real_outputs(conv_file, tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'source.uri = "{conv_file.name}"\n[outputs.mask]\nkind = "image"\n')
    out = tmp_path / "dist"
    refused(["build", str(recipe), "--no-browser", "--out", str(out)], f"{recipe}: key 'outputs.mask': the model has no output 'mask'; its outputs are: y", out=out)


def test_npz_narrowing_dtype_or_missing_inputs_are_refused(tmp_path):
    model = save(model_from_text(TWO_INPUTS), tmp_path / "two.onnx")
    out = tmp_path / "dist"
    narrow = tmp_path / "narrow.npz"
    np.savez(narrow, x=np.ones((2, 4), np.float64), s=np.ones((2, 4), np.float32))
    refused(["build", str(model), "--inputs", str(narrow), "--no-browser", "--out", str(out)], f"--inputs {narrow}: 'x' is float64, the model expects float32", "astype('float32')", out=out)
    partial = tmp_path / "partial.npz"
    np.savez(partial, x=np.ones((2, 4), np.float32))
    refused(["build", str(model), "--inputs", str(partial), "--no-browser", "--out", str(out)], f"--inputs {partial}: no array for input(s) s", out=out)


def test_input_option_shapes(conv_file, tmp_path):
    out = tmp_path / "dist"
    refused(["build", str(conv_file), "--input", "x=1xabc", "--no-browser", "--out", str(out)], "--input 'x=1xabc': malformed shape '1xabc'", "e.g. x=1x1", out=out)
    line = refused(["build", str(conv_file), "--input", "x=Nx3x16x16", "--no-browser", "--out", str(out)], "malformed shape", out=out)
    assert "symbolic" not in line and "x=1x3x16x16" in line


def test_sha256_hints_speak_of_the_option_that_gave_it(conv_file, tmp_path):
    out = tmp_path / "dist"
    wrong = "0" * 64
    refused(["build", str(conv_file), "--sha256", wrong, "--no-browser", "--out", str(out)], f"--sha256 expects {wrong}; fix --sha256 or the file", out=out)
    refused(["build", str(conv_file), "--sha256", "abc", "--no-browser", "--out", str(out)], "--sha256 'abc': expected 64 hex digits", out=out)
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'source.uri = "{conv_file.name}"\n')
    refused(["build", str(recipe), "--sha256", wrong, "--no-browser", "--out", str(out)], "set its key 'source.sha256', or give --source with --sha256", out=out)
    recipe.write_text(f'source.uri = "{conv_file.name}"\nsource.sha256 = "{wrong}"\n')
    refused(["build", str(recipe), "--no-browser", "--out", str(out)], "recipe key 'source.sha256' expects", out=out)


@pytest.fixture
def http_folder(conv_file):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(conv_file.parent))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_url_target_with_sha256_builds_over_a_stray_file_with_umask_modes(conv_file, tmp_path, http_folder):
    """One full build covers: a URL target with --sha256, a float16 npz widened with one warning,
    a stray file at the package path replaced without leftovers, and umask modes."""
    url = f"{http_folder}/{conv_file.name}"
    out = tmp_path / "dist"
    wrong = refused(["build", url, "--sha256", "1" * 64, "--no-browser", "--out", str(out)], "fix --sha256 or the URL", out=out)
    assert "source.sha256" not in wrong
    out.mkdir(exist_ok=True)
    (out / "tiny-conv").write_text("stray")
    npz = tmp_path / "half.npz"
    np.savez(npz, x=np.random.default_rng(1).uniform(-1, 1, (1, 3, 16, 16)).astype(np.float16))
    sha = hashlib.sha256(conv_file.read_bytes()).hexdigest()
    previous = os.umask(0o027)
    try:
        result = runner.invoke(app, ["build", url, "--sha256", sha, "--inputs", str(npz), "--no-browser", "--out", str(out)])
    finally:
        os.umask(previous)
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: --inputs {npz}: 'x' is float16, cast to the model's float32 (exact, no value changes)"]
    assert sorted(p.name for p in out.iterdir()) == ["tiny-conv"]
    package = out / "tiny-conv"
    assert package.is_dir() and (package / "manifest.json").is_file()
    for path in [package, *package.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o750 if path.is_dir() else 0o640), f"{path}: {oct(mode)}"


def test_staging_folders_and_atomic_writes_follow_the_umask(tmp_path):
    from pipeline.cache import atomic_copy, atomic_write, staging_folder

    previous = os.umask(0o022)
    try:
        with staging_folder(tmp_path, ".x.build-") as staging:
            pass
        atomic_write(tmp_path / "a.bin", b"a")
        atomic_copy(tmp_path / "a.bin", tmp_path / "b.bin")
        os.umask(0o077)
        with staging_folder(tmp_path, ".y.build-") as private:
            pass
        atomic_write(tmp_path / "c.bin", b"c")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(staging.stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "a.bin").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "b.bin").stat().st_mode) == 0o644
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "c.bin").stat().st_mode) == 0o600


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_just_after_the_staging_folder_is_made_still_removes_it(tmp_path, monkeypatch, stop):
    """The stop lands between mkdtemp making the folder and the path being bound, with a second
    thread alive (a signal mask on the main thread alone let the kernel hand it to that thread and
    Python raised it all the same: a catalog build left `.consumed.build-…` behind)."""
    import tempfile
    import threading

    from pipeline.cache import staging_folder, swap_into_place
    from pipeline.errors import Terminated, raise_terminated

    made = tempfile.mkdtemp

    def made_then_stopped(*args, **kwargs):
        path = made(*args, **kwargs)
        os.kill(os.getpid(), stop)
        time.sleep(0.05)  # the signal's handler has run before this returns
        return path

    busy = threading.Event()
    other = threading.Thread(target=busy.wait, daemon=True)
    other.start()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler), signal.signal(signal.SIGTERM, raise_terminated)
    try:
        monkeypatch.setattr(tempfile, "mkdtemp", made_then_stopped)
        with pytest.raises(Terminated if stop == signal.SIGTERM else KeyboardInterrupt):
            with staging_folder(tmp_path, ".m.build-"):
                pytest.fail("the stop is raised before the block runs")
        assert list(tmp_path.iterdir()) == []
        monkeypatch.undo()
        # a stop during the swap waits for it: the new package in place, the old one gone
        (tmp_path / "pkg").mkdir()
        (tmp_path / "new").mkdir()
        (tmp_path / "new" / "f").write_text("new")
        renamed = Path.rename

        def rename_then_stopped(self, target):
            done = renamed(self, target)
            os.kill(os.getpid(), stop)
            time.sleep(0.05)
            return done

        monkeypatch.setattr(Path, "rename", rename_then_stopped)
        with pytest.raises(KeyboardInterrupt):
            swap_into_place(tmp_path / "new", tmp_path / "pkg")
        monkeypatch.undo()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg"] and (tmp_path / "pkg" / "f").read_text() == "new"
    finally:
        busy.set()
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])


def _slow_model(path: Path) -> Path:
    """A conv model with ~3 MB of fresh random weights: uncached brotli (q11) and host runs keep
    the build in its staging folder for seconds, long enough to be stopped there."""
    rng = np.random.default_rng()
    weights = rng.normal(0, 0.01, (64, 3, 64, 64)).astype(np.float32)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Conv", ["x", "w"], ["y"], name="conv")],
        "slow",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 64, 64])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 64, 1, 1])],
        [onnx.numpy_helper.from_array(weights, "w")],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 8
    return save(model, path)


@pytest.mark.parametrize("stop, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_a_build_stopped_mid_way_leaves_no_staging_folder(tmp_path, stop, code):
    model = _slow_model(tmp_path / "slow.onnx")
    out = tmp_path / "dist"
    child = interruptible([sys.executable, "-m", "pipeline.cli", "build", str(model), "--no-browser", "--out", str(out)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    staged = False
    while time.monotonic() < deadline and child.poll() is None:
        if out.is_dir() and any(p.name.startswith(".slow.build-") for p in out.iterdir()):
            staged = True
            break
        time.sleep(0.01)
    if not staged:
        child.kill()
        pytest.fail(f"the build never reached its staging folder: {child.communicate()[1]}")
    child.send_signal(stop)
    stdout, stderr = child.communicate(timeout=120)
    assert child.returncode == code, stderr
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1].startswith(f"interrupted ({stop.name})"), stderr
    assert list(out.iterdir()) == [], (stderr, sorted(str(p) for p in out.rglob("*")))


def test_non_finite_sample_inputs_name_the_input_and_the_first_bad_index(tmp_path):
    """A NaN in a sample makes every comparison vacuous (issue 28: it gave a PASSED package)."""
    model = save(model_from_text(TWO_INPUTS), tmp_path / "two.onnx")
    out = tmp_path / "dist"
    npz = tmp_path / "nan.npz"
    x = np.ones((2, 4), np.float32)
    x[1, 2] = np.nan
    np.savez(npz, x=x, s=np.ones((2, 4), np.float32))
    refused(["build", str(model), "--inputs", str(npz), "--no-browser", "--out", str(out)],
            f"--inputs {npz}: input 'x' is nan at index [1, 2] (1 of its 8 values are NaN or Inf); give finite sample values", out=out)
    recipe = tmp_path / "inf.toml"
    recipe.write_text('source.uri = "two.onnx"\n[inputs.s]\nvalue = inf\n')
    refused(["build", str(recipe), "--no-browser", "--out", str(out)], f"{recipe}: key 'inputs.s': input 's' is inf at index [0, 0] (8 of its 8", out=out)


def test_a_model_that_yields_nan_on_the_sample_names_the_output(tmp_path):
    model = save(model_from_text("""
<ir_version: 8, opset_import: ["" : 17]>
root (float[2, 4] x) => (float[2, 4] y) { y = Sqrt (x) }
"""), tmp_path / "root.onnx")  # the default sample spans [-1, 1]: a square root of a negative is NaN
    out = tmp_path / "dist"
    line = refused(["build", str(model), "--no-browser", "--out", str(out)],
                   "root.onnx: the fp32 reference output 'y' has", "on finite sample inputs: the model yields NaN on this sample; give another (--inputs", out=out)
    assert re.search(r"has \d NaN or Inf values of 8 \(first at index \[\d, \d\]\)", line), line


def test_a_wrong_input_name_names_the_option_and_the_models_inputs(conv_file, tmp_path):
    out = tmp_path / "dist"
    line = refused(["build", str(conv_file), "--input", "mixx=1x3x16x16", "--no-browser", "--out", str(out)],
                   "error: --input 'mixx=1x3x16x16': the model has no input 'mixx'; its inputs are: x", out=out)
    assert "recipe" not in line


@pytest.mark.parametrize(("content", "said", "fix"), [
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"ab" * 32 + b"\nsize 535190\n",
     "a Git LFS pointer of a 535190-byte file, not the model", "`git lfs pull`"),
    (b"\n<!DOCTYPE html>\n<html><head><title>Sign in &amp; continue</title></head><body>...</body></html>",
     "an HTML page titled 'Sign in & continue', not an ONNX model", "download the model file itself"),
])
def test_a_stand_in_saved_as_onnx_is_named_with_the_fix(tmp_path, content, said, fix):
    model = tmp_path / "model.onnx"
    model.write_bytes(content)
    out = tmp_path / "dist"
    line = refused(["build", str(model), "--no-browser", "--out", str(out)], f"{model}: {said}", fix, out=out)
    assert "truncated" not in line and "re-download" not in line
