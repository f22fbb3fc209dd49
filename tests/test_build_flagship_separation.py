"""Source-separation flagships (HTDemucs, SCNet, UVR/MDX) built from their exports, verified on the
host and in the browser."""

import pytest

from flagship_helpers import BROWSER_BUILDS, SLOW_IN_BROWSER, assert_builds_on_host_and_browser, assert_host_verified, build


def test_uvr_mdx_vocals_builds_on_its_export_host(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a built-in recipe's lock is ./pack.lock.json
    code, report, output = build(tmp_path, "uvr-mdx-vocals", browser=False)
    assert_host_verified("uvr-mdx-vocals", code, report, output, tmp_path)


@pytest.mark.browser
@pytest.mark.parametrize("recipe_name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_IN_BROWSER else n for n in BROWSER_BUILDS["separation"]])
def test_flagship_recipe_builds_on_its_export_host_and_browser(recipe_name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a built-in recipe's lock is ./pack.lock.json
    assert_builds_on_host_and_browser(recipe_name, tmp_path)
