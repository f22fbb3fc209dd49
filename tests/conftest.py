"""Shared test set-up: one pack cache for the whole run (downloads, brotli, runtime), so tests that
build packages reuse each other's work; CI starts it empty in its clean clone, with a shared cache
behind it that outlives the clone (.ci/run names a folder in PACK_CACHE_URL): only this suite cache
reads and writes it, so a test's private cache (faults, cold starts, poisoned results) stays private
and no test process started by a test sees it.

Test modules are named by the pipeline stage they prove, `test_<stage>_<what>.py`: source
(`recipes_sources`), graph, fp16 (precision), verify and browser (verify/browser), assets, report,
loader (web_template/loader and what pipeline/web renders), publish; build (whole builds, the
flagship exports among them), cli, manifest, runtime, architecture (the import layout) and benchmarks for what spans stages.
Helpers shared by several modules are `<topic>_helpers.py` beside them, imported by name."""

import os
from pathlib import Path

import pytest

# Fixtures of the browser (browser, pages) and of the S3 server (s3_server, aws_env, tls_files,
# proxy), for every module that asks for them by name
pytest_plugins = ["loader_helpers", "publish_helpers"]

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("PACK_CACHE_DIR", str(REPO / ".cache" / "pack"))
SUITE_CACHE = Path(os.environ["PACK_CACHE_DIR"]).expanduser().absolute()
# One Mesa shader cache for every pack cache of the run, a test's private one included (compiled
# shaders change no result; each private cache compiling them again cost minutes).
os.environ.setdefault("MESA_SHADER_CACHE_DIR", str(SUITE_CACHE / "mesa-shader-cache"))
# Moved out of PACK_CACHE_URL (which pack reads) before xdist starts its workers, which inherit it.
if os.environ.get("PACK_CACHE_URL"):
    os.environ["PACK_TEST_SUITE_CACHE_URL"] = os.environ.pop("PACK_CACHE_URL")
SUITE_SHARED_URL = os.environ.get("PACK_TEST_SUITE_CACHE_URL") or None


@pytest.fixture(scope="session", autouse=True)
def shared_cache_behind_the_suite_cache():
    """The run's shared cache (if .ci/run named one) behind the suite cache only, in this process:
    a session on it bound to the cache for the whole run. Its entries are those under the suite
    cache, so a test with a private cache reads nothing from it, and a test (or a command) that
    opens its own store binds that one over it."""
    if SUITE_SHARED_URL is None:
        yield
        return
    from pipeline.cache import reading_through
    from pipeline.shared_cache import StoreSession, store_from_url

    with reading_through(StoreSession(store_from_url(SUITE_SHARED_URL), SUITE_CACHE)):
        yield


def pytest_collection_modifyitems(config, items):
    """Modules with the most `slow` tests run first (scripts/test.sh turns xdist's own order, by
    test count, off), so the long builds start at once and the run does not end on one of them
    while the other workers idle. Within a module the order stays as written."""
    slow_per_module: dict[str, int] = {}
    for item in items:
        slow_per_module.setdefault(item.module.__name__, 0)
        if item.get_closest_marker("slow") is not None:
            slow_per_module[item.module.__name__] += 1
    items.sort(key=lambda item: -slow_per_module[item.module.__name__])


@pytest.fixture
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def chunked_packages(tmp_path_factory) -> dict[str, Path]:
    """`pack build --no-browser` of one small model twice, variants fp16, fp16w and fp32: "chunked"
    at a tiny [assets] chunk_mib (weights in byte-plane coded chunks), "single" at the default (one
    file per variant)."""
    from typer.testing import CliRunner

    from pipeline.cli import app
    from chunk_helpers import CHUNK_MIB, VARIANTS, write_recipe

    folder = tmp_path_factory.mktemp("chunky")
    packages = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PACK_WEBGPU_KERNELS", "off")  # the browser tests check WebGPU; lavapipe adds nothing here
        for key, name, chunk_mib in (("chunked", "chunky", CHUNK_MIB), ("single", "chunky-single", None)):
            recipe = write_recipe(folder, name, chunk_mib, VARIANTS)
            result = CliRunner().invoke(app, ["build", str(recipe), "--no-browser", "--json", "--out", str(folder / "dist")])
            assert result.exit_code == 0, result.output[-3000:]
            packages[key] = folder / "dist" / name
    return packages
