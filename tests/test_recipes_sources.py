"""Recipe keys of the flagship work (license, source facts, input patterns), `pack recipes`, the lock
file, and sources pinned on first download / unreachable / replaced upstream, against a loopback
HTTPS server with a self-signed certificate trusted through PACK_CA_BUNDLE."""

import hashlib
import http.server
import json
import ssl
import threading
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from pipeline.assets.patterns import generate, speech_signal
from pipeline.cli import app
from pipeline.errors import PackError
from pipeline.lockfile import LockFile, lock_for
from pipeline.recipe import RECIPES_DIR, InputSpec, builtin_recipes, load_recipe_file, parse_recipe
from publish_helpers import make_loopback_cert

runner = CliRunner()
DATA = Path(__file__).resolve().parent / "data" / "flagship"
MODEL = DATA / "mdx.onnx"  # the smallest export: a host-only build takes seconds
MODEL_SHA = hashlib.sha256(MODEL.read_bytes()).hexdigest()


# --- recipe keys ------------------------------------------------------------------------------


def _parse(text: str, tmp_path: Path):
    import tomllib

    return parse_recipe(tomllib.loads(text), tmp_path / "r.toml")


@pytest.mark.parametrize(("text", "message"), [
    ('license = 3', "key 'license'"),
    ('license = "a\\nb"', "key 'license'"),
    ('source.precision = "int4"', "key 'source.precision'"),
    ('source.size = -1', "key 'source.size'"),
    ('[inputs.m]\npattern = "circle"', "key 'inputs.m.pattern'"),
    ('[inputs.m]\nhole = 1', "'inputs.m.hole' belongs to pattern 'box'"),
    ('[inputs.m]\npattern = "box"\nvalue = 1', "'inputs.m.value' and 'inputs.m.pattern'"),
    ('[inputs.m]\npattern = "spectrogram"\ncomponent = "power"', "key 'inputs.m.component'"),
    ('[inputs.m]\npattern = "mel"\nn_fft = 0', "key 'inputs.m.n_fft'"),
])
def test_bad_flagship_keys_are_named(text, message, tmp_path):
    with pytest.raises(PackError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _parse(text, tmp_path)


def test_every_builtin_recipe_loads_with_a_license_line():
    for path in builtin_recipes():
        recipe = load_recipe_file(path)
        assert recipe.license, f"{path.name}: no license key"


def test_box_mask_is_a_real_hole_in_known_pixels():
    spec = InputSpec("mask", pattern="box", pattern_options={"hole": 0, "known": 255})
    mask = generate(spec, [1, 1, 64, 64], "uint8", seed=0)
    assert mask.dtype == np.uint8 and set(np.unique(mask)) == {0, 255}
    hole = np.mean(mask == 0)
    assert 1 / 16 <= hole <= 1 / 4
    rows, cols = np.nonzero(mask[0, 0] == 0)
    assert (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1) == rows.size  # one rectangle


def test_image_pattern_spans_its_range_smoothly():
    image = generate(InputSpec("image", pattern="image", range=(0.0, 1.0)), [1, 3, 64, 64], "float32", seed=0)
    assert 0 <= image.min() and image.max() <= 1 and image.std() > 0.05
    # neighbouring pixels are close, unlike uniform noise
    assert np.mean(np.abs(np.diff(image, axis=-1))) < 0.05


def test_speech_is_voiced_with_pauses_and_the_spectrogram_describes_it():
    signal = speech_signal(16000, 16000, seed=0)
    assert np.max(np.abs(signal)) == pytest.approx(1.0)
    frames = signal[: 16000 // 160 * 160].reshape(-1, 160)
    energy = np.sqrt(np.mean(frames**2, axis=1))
    assert energy.min() < 0.1 * energy.max()  # pauses between syllables
    spectrum = np.abs(np.fft.rfft(signal * np.hanning(signal.size)))
    assert 80 <= np.argmax(spectrum) * 16000 / signal.size <= 1000  # voiced energy sits low
    spec = InputSpec("s", pattern="spectrogram", range=(-0.5, 0.5), pattern_options={"n_fft": 64, "hop": 16, "sample_rate": 16000})
    complex_planes = generate(spec, [1, 4, 32, 8], "float32", seed=0)
    assert complex_planes.shape == (1, 4, 32, 8) and np.abs(complex_planes).max() > 0
    np.testing.assert_allclose(complex_planes[0, 2], complex_planes[0, 0] * 0.925, rtol=1e-5, atol=1e-6)  # right channel
    mel = generate(InputSpec("mel", pattern="mel", pattern_options={"n_fft": 1024, "hop": 256}), [1, 80, 16], "float32", seed=0)
    assert mel.shape == (1, 80, 16) and np.isfinite(mel).all() and mel.max() > np.log(1e-5)


def test_a_pattern_that_does_not_fit_the_input_names_the_key():
    with pytest.raises(PackError, match="inputs.s.pattern.*n_fft 64 gives 33"):
        generate(InputSpec("s", pattern="spectrogram", pattern_options={"n_fft": 64}), [1, 4, 100, 8], "float32", 0)


# --- pack recipes ----------------------------------------------------------------------------


def test_pack_recipes_lists_what_each_ships_with_size_licence_and_source():
    result = runner.invoke(app, ["recipes"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == len(builtin_recipes())
    lama = next(line for line in lines if line.startswith("lama "))
    assert "fp16+fp32" in lama and "208.0 MB" in lama and "Apache-2.0" in lama and "lama_fp32.onnx" in lama
    assert "quantized as-is" in next(line for line in lines if line.startswith("isnet-uint8 "))
    assert "export it yourself" in next(line for line in lines if line.startswith("mp-senet "))
    rows = json.loads(runner.invoke(app, ["recipes", "--json"]).stdout)
    by_name = {row["name"]: row for row in rows}
    assert by_name["htdemucs"]["sha256"].startswith("e5e425c1") and by_name["htdemucs"]["size"] == 180534758
    assert by_name["scnet"]["sha256"] is None and by_name["scnet"]["license"] == "unstated"


# --- errors a new user meets -----------------------------------------------------------------


def test_mp_senet_without_source_says_how_to_export_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["build", "mp-senet", "--no-browser"])
    assert result.exit_code == 2
    line = result.output.strip()
    assert "\n" not in line and "tests/data/generators/make_flagship_models.py" in line and "--source" in line


def test_a_local_file_that_is_not_the_published_one_says_what_it_is_and_how_to_override(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["build", "uvr-mdx", "--source", str(MODEL), "--no-browser"])
    assert result.exit_code == 2
    line = result.output.strip()
    assert "\n" not in line
    assert f"sha256 is {MODEL_SHA}" in line and f"{MODEL.stat().st_size} bytes, opset 18, inputs input" in line
    assert "recipe key 'source.sha256' expects 317554b0" in line and "the published UVR-MDX-NET-Inst_HQ_3.onnx (66759214 bytes" in line
    assert f"pass --sha256 {MODEL_SHA}" in line
    assert not (tmp_path / "dist").exists()


# --- lock file -------------------------------------------------------------------------------


def test_lock_location_follows_the_contract(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    builtin = load_recipe_file(RECIPES_DIR / "scnet.toml")
    assert lock_for(builtin, None).path == tmp_path / "pack.lock.json"
    own = tmp_path / "mine.toml"
    own.write_text('source.uri = "m.onnx"\n')
    assert lock_for(load_recipe_file(own), None).path == tmp_path / "mine.lock.json"
    assert lock_for(load_recipe_file(own), tmp_path / "x.json").path == tmp_path / "x.json"
    from pipeline.recipe import recipe_from_model

    assert lock_for(recipe_from_model(Path("m.onnx")), None).path is None


def test_lock_file_round_trips_sorted_and_refuses_garbage(tmp_path):
    path = tmp_path / "pack.lock.json"
    lock = LockFile(path)
    lock.put("zeta", "source", {"uri": "u", "sha256": "b" * 64, "size": 3})
    lock.put("alpha", "fp16", {"model_sha256": "a" * 64})
    text = path.read_text()
    assert json.loads(text) == {"schema": 1, "alpha": {"fp16": {"model_sha256": "a" * 64}}, "zeta": {"source": {"uri": "u", "sha256": "b" * 64, "size": 3}}}
    assert text.index('"alpha"') < text.index('"schema"') < text.index('"zeta"') and text.endswith("}\n")
    assert LockFile(path).get("zeta", "source")["size"] == 3 and LockFile(path).get("zeta", "fp16") is None
    LockFile(None).put("x", "source", {})  # no path: remembers nothing, writes nothing
    path.write_text("{not json")
    with pytest.raises(PackError, match="pack.lock.json: cannot read the lock file"):
        LockFile(path).get("zeta", "source")


# --- HTTPS sources: pinning, upstream changes, offline ---------------------------------------


class _Files(http.server.BaseHTTPRequestHandler):
    body = b""

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(type(self).body)))
        self.end_headers()
        self.wfile.write(type(self).body)


@pytest.fixture
def https_server(tmp_path_factory):
    cert, key = make_loopback_cert(tmp_path_factory.mktemp("tls"))
    _Files.body = MODEL.read_bytes()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{httpd.server_address[1]}", cert, httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """Downloads in a cache of this test only (the runtime files stay in the shared one)."""
    import importlib

    download_module = importlib.import_module("pipeline.source.download")  # the package re-exports a function of that name
    folder = tmp_path / "downloads"
    folder.mkdir()
    monkeypatch.setattr(download_module, "cache_dir", lambda *parts: folder)
    return folder


def _recipe(tmp_path: Path, url: str, sha: str | None = None) -> Path:
    recipe = tmp_path / "remote.toml"
    sha_line = f'sha256 = "{sha}"\n' if sha else ""
    recipe.write_text(f'license = "MIT"\nvariants = ["fp32"]\n[source]\nuri = "{url}/mdx.onnx"\n{sha_line}[inputs.input]\npattern = "spectrogram"\nn_fft = 64\n')
    return recipe


def _build(recipe: Path, tmp_path: Path, *extra: str):
    return runner.invoke(app, ["build", str(recipe), "--no-browser", "--out", str(tmp_path / "dist"), *extra])


def test_untrusted_certificate_is_refused_with_the_way_to_trust_it(https_server, own_cache, tmp_path, monkeypatch):
    url, _, _ = https_server
    monkeypatch.delenv("PACK_CA_BUNDLE", raising=False)
    result = _build(_recipe(tmp_path, url, MODEL_SHA), tmp_path)
    assert result.exit_code == 2
    assert "TLS certificate is not trusted" in result.output and "PACK_CA_BUNDLE" in result.output
    assert f"sha256 {MODEL_SHA}" in result.output and "--source PATH" in result.output


def test_source_without_hash_is_pinned_then_checked_and_a_changed_upstream_is_refused(https_server, own_cache, tmp_path, monkeypatch):
    url, cert, _ = https_server
    monkeypatch.setenv("PACK_CA_BUNDLE", str(cert))
    recipe = _recipe(tmp_path, url)
    first = _build(recipe, tmp_path)
    assert first.exit_code == 0, first.output
    lock = json.loads((tmp_path / "remote.lock.json").read_text())
    assert lock["schema"] == 1 and lock["remote"]["source"] == {"uri": f"{url}/mdx.onnx", "sha256": MODEL_SHA, "size": MODEL.stat().st_size}
    report = json.loads((tmp_path / "dist" / "remote" / "report.json").read_text())
    assert report["source"]["checked"] == "pinned now" and report["license"] == "MIT"

    again = _build(recipe, tmp_path)  # served from the cache, checked against the pin
    assert again.exit_code == 0, again.output
    assert json.loads((tmp_path / "dist" / "remote" / "report.json").read_text())["source"]["checked"] == "lock"

    _Files.body = MODEL.read_bytes() + b"\0"  # upstream replaced the file
    changed_sha = hashlib.sha256(_Files.body).hexdigest()
    for cached in own_cache.iterdir():
        cached.unlink()
    changed = _build(recipe, tmp_path)
    assert changed.exit_code == 2
    line = changed.output.strip()
    assert "\n" not in line and "upstream file changed" in line
    assert changed_sha in line and MODEL_SHA in line and "re-pin" in line and "remote.lock.json" in line
    assert json.loads((tmp_path / "remote.lock.json").read_text()) == lock  # the pin stays


def test_offline_source_says_url_hash_and_source_option(https_server, own_cache, tmp_path, monkeypatch):
    url, cert, httpd = https_server
    monkeypatch.setenv("PACK_CA_BUNDLE", str(cert))
    recipe = _recipe(tmp_path, url)
    assert _build(recipe, tmp_path).exit_code == 0  # pinned
    httpd.shutdown()
    httpd.server_close()
    for cached in own_cache.iterdir():
        cached.unlink()
    offline = _build(recipe, tmp_path)
    assert offline.exit_code == 2
    line = offline.output.strip()
    assert "\n" not in line and f"{url}/mdx.onnx" in line and "cannot connect" in line
    assert f"sha256 {MODEL_SHA}" in line and f"pack build {recipe} --source PATH" in line
    # the file downloaded by other means is checked against the pin
    wrong = tmp_path / "wrong.onnx"
    wrong.write_bytes(MODEL.read_bytes() + b"\0")
    refused = _build(recipe, tmp_path, "--source", str(wrong))
    assert refused.exit_code == 2 and "remote.lock.json pins" in refused.output
    local = _build(recipe, tmp_path, "--source", str(MODEL))
    assert local.exit_code == 0, local.output


def test_offline_source_without_a_pin_says_it_will_be_pinned(own_cache, tmp_path, monkeypatch):
    recipe = _recipe(tmp_path, "https://127.0.0.1:9")
    result = _build(recipe, tmp_path)
    assert result.exit_code == 2
    assert "https://127.0.0.1:9/mdx.onnx: cannot connect" in result.output
    assert "sha256 not published: the file you pass is pinned in" in result.output and "--source PATH" in result.output
    # the file downloaded by other means stands in for the URL: pinned under it, checked ever after
    local = _build(recipe, tmp_path, "--source", str(MODEL))
    assert local.exit_code == 0, local.output
    pin = json.loads((tmp_path / "remote.lock.json").read_text())["remote"]["source"]
    assert pin == {"uri": "https://127.0.0.1:9/mdx.onnx", "sha256": MODEL_SHA, "size": MODEL.stat().st_size}
    wrong = tmp_path / "wrong.onnx"
    wrong.write_bytes(MODEL.read_bytes() + b"\0")
    assert "remote.lock.json pins" in _build(recipe, tmp_path, "--source", str(wrong)).output


def test_a_wrong_precision_claim_in_a_recipe_is_refused(tmp_path):
    recipe = tmp_path / "claim.toml"
    recipe.write_text(f'license = "MIT"\n[source]\nuri = "{MODEL}"\nprecision = "quantized"\n[inputs.input]\npattern = "spectrogram"\nn_fft = 64\n')
    result = _build(recipe, tmp_path)
    assert result.exit_code == 2
    assert "key 'source.precision' says quantized, but mdx.onnx is fp32" in result.output
    assert not (tmp_path / "dist" / "claim").exists()


def test_a_local_file_that_is_another_recipes_published_file_names_that_recipe(tmp_path, monkeypatch):
    import pipeline.recipe as recipe_module

    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "uvr-mdx.toml").write_text((RECIPES_DIR / "uvr-mdx.toml").read_text())
    (recipes / "twin.toml").write_text(f'license = "MIT"\n[source]\nuri = "https://example.invalid/twin.onnx"\nsha256 = "{MODEL_SHA}"\n')
    monkeypatch.setattr(recipe_module, "RECIPES_DIR", recipes)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["build", "uvr-mdx", "--source", str(MODEL), "--no-browser"])
    assert result.exit_code == 2
    assert "this file is the published source of recipe 'twin'" in result.output
    assert f"pack build twin --source {MODEL}" in result.output
