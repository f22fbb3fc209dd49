"""The default load of a real built package in Firefox and WebKit, as an app in those engines loads
it (the suite's gtcrn and image-flagship packages; the tiny three-engine build covers the rest)."""

from __future__ import annotations

from pathlib import Path


def assert_default_load_right_in_firefox_and_webkit(package: Path) -> dict[str, dict]:
    """The desktop chain's default load in each engine: the sample's outputs right; Firefox lands on
    a pair the build verified and, where it passes over WebGPU, says why; WebKit runs 1 thread
    without SharedArrayBuffer and says so. Returns each engine's first row. An engine not installed
    is not-verifiable with its install line (never a pass)."""
    from pipeline.sample_file import read_sample
    from pipeline.verify.engines.browser import firefox, webkit
    from pipeline.verify.engines.browser.default_load import verify_default_load
    from pipeline.verify.engines.browser.run_plan import load_manifest

    manifest = load_manifest(package)
    reference = read_sample(package, manifest)[1]
    verified = {(run["ep"], run["variant"]) for run in manifest["verification"]["runs"] if run["stage"] == "browser" and run["status"] == "passed"}
    first: dict[str, dict] = {}
    for engine, driver in (("firefox", firefox), ("webkit", webkit)):
        rows = verify_default_load(package, manifest, reference, engine=engine, platforms=["desktop"])
        if driver.unavailable():
            assert [(c["status"], c["install"]) for c in rows] == [("not-verifiable", driver.INSTALL)], rows
            continue
        assert {c["status"] for c in rows} == {"passed"}, [(c["output"], c["status"], c.get("detail")) for c in rows]
        assert sorted(c["output"] for c in rows) == sorted(reference), rows
        row = first[engine] = rows[0]
        assert row["browser"].startswith({"firefox": "firefox/", "webkit": "webkitgtk/"}[engine]) and row["prewarmError"] is None
        assert (row["ep"], row["variant"]) in verified, (row["ep"], row["variant"], verified)
        passed_over = [f for f in row["fallbacks"] if f["ep"] == "webgpu"]
        if row["ep"] != "webgpu":  # why not WebGPU, in the engine's own words
            assert passed_over and all(f["error"] for f in passed_over), row["fallbacks"]
        if engine == "webkit" and not row["page"]["sharedArrayBuffer"]:
            assert row["threads"] == 1 and "no SharedArrayBuffer" in row["threadsWhy"], (row["threads"], row["threadsWhy"])
    return first
