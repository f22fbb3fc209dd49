"""The default of manifest `loader.select`: how the shipped loader picks the EP and variant.

`measured` (the loader times every verified candidate on the user's device on first load, see
web_template/loader/select.js) costs about four sample runs per candidate, once per device. It is
the default when that is cheap: when the build's fastest browser steady time for the sample run is
under CHEAP_SAMPLE_MS. Otherwise (or without browser timings, e.g. `--no-browser`) the default is
`chain`: the platform's fixed order, sorted by the manifest's measurements when there are any.
The recipe key `[loader] select` overrides the rule.
"""

from __future__ import annotations

from collections.abc import Iterable

CHEAP_SAMPLE_MS = 200.0


def default_select(recipe_select: str | None, steady_ms: Iterable[float | None]) -> tuple[str, str]:
    """(`measured` | `chain`, one line saying why) from the recipe's choice and the build's steady times."""
    if recipe_select:
        return recipe_select, "recipe key loader.select"
    times = [float(t) for t in steady_ms if t is not None]
    if not times:
        return "chain", "no browser timing of the sample run (--no-browser)"
    fastest = min(times)
    if fastest < CHEAP_SAMPLE_MS:
        return "measured", f"the sample run is cheap: {fastest:.1f} ms < {CHEAP_SAMPLE_MS:.0f} ms in the build's browser"
    return "chain", f"the sample run is not cheap: {fastest:.1f} ms >= {CHEAP_SAMPLE_MS:.0f} ms in the build's browser"
