"""Speech and codec flagships (MP-SENet, Vocos, WavTokenizer) built from their exports, verified on
the host and in the browser; the WavTokenizer build's report.html is read in Chromium."""

import pytest

from flagship_helpers import BROWSER_BUILDS, SLOW_IN_BROWSER, assert_builds_on_host_and_browser


@pytest.mark.browser
@pytest.mark.parametrize("recipe_name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_IN_BROWSER else n for n in BROWSER_BUILDS["speech"]])
def test_flagship_recipe_builds_on_its_export_host_and_browser(recipe_name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a built-in recipe's lock is ./pack.lock.json
    assert_builds_on_host_and_browser(recipe_name, tmp_path)
