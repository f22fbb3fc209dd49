"""Open a package's report.html in headless Chromium and check what a person would see: every check
of report.json, pictures that loaded and are not blank, audio that can play, nothing fetched from
anywhere, no sideways scrolling at 400 px; screenshots kept under .cache/report-screenshots/
(git-ignored) for a person to look at."""

from __future__ import annotations

import json
from pathlib import Path

SCREENSHOTS = Path(__file__).resolve().parent.parent / ".cache" / "report-screenshots"
STATUS_ORDER = ["failed", "refused", "not-verifiable", "skipped", "passed"]

# Per <img>: loaded size and how many distinct colours its pixels have (1 = blank).
PICTURE_FACTS = """
() => Promise.all([...document.images].map(async (image) => {
  await image.decode();
  const canvas = document.createElement('canvas');
  canvas.width = Math.min(image.naturalWidth, 600);
  canvas.height = Math.round(canvas.width * image.naturalHeight / image.naturalWidth);
  const context = canvas.getContext('2d');
  context.fillStyle = '#fff';
  context.fillRect(0, 0, canvas.width, canvas.height);
  context.drawImage(image, 0, 0, canvas.width, canvas.height);
  const pixels = context.getImageData(0, 0, canvas.width, canvas.height).data;
  const colours = new Set();
  for (let i = 0; i < pixels.length && colours.size < 64; i += 4 * 7) colours.add((pixels[i] << 16) | (pixels[i + 1] << 8) | pixels[i + 2]);
  return {cls: image.className, alt: image.alt, width: image.naturalWidth, colours: colours.size};
}))
"""

# Per <audio>: its duration once the browser has decoded enough to play (canplay).
AUDIO_FACTS = """
() => Promise.all([...document.querySelectorAll('audio')].map((audio) => new Promise((resolve) => {
  const done = () => resolve({label: audio.dataset.label, duration: audio.duration, ready: audio.readyState, error: audio.error && audio.error.code});
  if (audio.readyState >= 3) done();
  audio.addEventListener('canplay', done, {once: true});
  audio.addEventListener('error', done, {once: true});
  audio.load();
})))
"""


def check_report_page(browser, package: Path) -> dict:
    """Open `package`/report.html; assert what any report must show; return the page's facts for
    the caller's own assertions (check rows, pictures, audio, output sections)."""
    from pipeline.report.data import load

    report = json.loads((package / "report.json").read_text())
    verification = load(package).verification  # after `pack verify`: its checks, and the build's host checks
    expected = report["checks"] if not verification else [c for c in report["checks"] if c["stage"] == "host"] + verification["checks"]
    page_path = package / "report.html"
    facts = {}
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for width in (400, 1100):
        context = browser.new_context(viewport={"width": width, "height": 900})
        try:
            page = context.new_page()
            fetched = []
            page.on("request", lambda request: fetched.append(request.url))
            page.goto(page_path.as_uri())
            page.wait_for_load_state("load")
            assert [url for url in fetched if not url.startswith(("file:", "data:", "blob:"))] == [], "the report fetched from the network"
            overflow = page.evaluate("document.documentElement.scrollWidth")
            assert overflow <= width, f"report.html is {overflow} px wide in a {width} px window"
            page.screenshot(path=str(SCREENSHOTS / f"{package.name}-{width}px.png"), full_page=True)
            if width == 400:
                continue
            facts["rows"] = page.eval_on_selector_all("tr.check", "rows => rows.map(r => ({...r.dataset}))")
            facts["pictures"] = page.evaluate(PICTURE_FACTS)
            facts["audio"] = page.evaluate(AUDIO_FACTS)
            facts["sections"] = page.eval_on_selector_all("section.output", "all => all.map(s => ({...s.dataset}))")
            facts["verdict"] = page.inner_text("#verdict")
            facts["text"] = page.inner_text("body")
        finally:
            context.close()
    # every check of report.json, once, failures first
    shown = sorted((row["stage"], row["status"], row["output"]) for row in facts["rows"])
    assert shown == sorted((c["stage"], c["status"], c.get("output") or "") for c in expected)
    order = [STATUS_ORDER.index(row["status"]) for row in facts["rows"]]
    assert order == sorted(order), "failures are not first"
    failed = any(c["status"] == "failed" for c in expected)
    assert facts["verdict"] == ("FAILED" if failed else "PASSED")
    # pictures: the sizes chart, the timings chart where the browser ran, one per output; none blank
    assert {p["cls"] for p in facts["pictures"]} >= {"chart", "picture"}
    blank = [p["alt"] for p in facts["pictures"] if p["width"] == 0 or p["colours"] < 8]
    assert blank == [], f"blank pictures: {blank}"
    # audio plays
    silent = [a for a in facts["audio"] if a["error"] or not a["duration"] or a["duration"] <= 0 or a["ready"] < 3]
    assert silent == [], f"audio that cannot play: {silent}"
    return facts
