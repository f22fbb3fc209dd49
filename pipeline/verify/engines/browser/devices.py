"""What a device is, for reports and the manifest: the browser (brand, version), the OS, the WebGPU
adapter (vendor, architecture, description, fallback or hardware) and shader-f16, from one
page's probes. Checks are grouped by `device_key`; the manifest's per-adapter record is keyed by
`adapter_class`.
"""

from __future__ import annotations

import re

_OS_FROM_UA = (("Windows", "Windows"), ("Android", "Android"), ("iPhone", "iOS"), ("iPad", "iOS"),
               ("Mac OS X", "macOS"), ("CrOS", "ChromeOS"), ("Linux", "Linux"))


def device_facts(browser_version: str | None, browser_type: str | None, adapter: dict, navigator: dict) -> dict:
    """The report's `device` entry of one browser."""
    brands = navigator.get("brands") or []
    # "Google Chrome" / "Microsoft Edge" before the engine's own "Chromium" entry
    brand = next((b for b in brands if b.get("brand") != "Chromium"), None) or next(iter(brands), None)
    name = brand["brand"] if brand else (browser_type or "browser").capitalize()
    os_name = navigator.get("platform") or next((os for needle, os in _OS_FROM_UA if needle in (navigator.get("userAgent") or "")), "")
    facts = {
        "browser": name,
        "version": browser_version or (brand or {}).get("version") or "",
        "os": " ".join(part for part in (os_name, navigator.get("platformVersion") or "") if part).strip(),
        "cpuArchitecture": navigator.get("architecture") or "",
        "userAgent": navigator.get("userAgent") or "",
        "adapter": None,
        "shaderF16": False,
    }
    if adapter.get("available"):
        facts["adapter"] = {
            "vendor": str(adapter.get("vendor") or ""),
            "architecture": str(adapter.get("architecture") or ""),
            "description": str(adapter.get("description") or ""),
            "fallback": bool(adapter.get("isFallbackAdapter")),
        }
        facts["shaderF16"] = "shader-f16" in (adapter.get("features") or [])
    return facts


def device_key(device: dict) -> str:
    """One string per device: the same browser build, OS and adapter give the same key."""
    adapter = device.get("adapter") or {}
    parts = [device.get("browser"), device.get("version"), device.get("os"), adapter.get("vendor"), adapter.get("architecture"),
             adapter.get("description"), "fallback" if adapter.get("fallback") else ("hardware" if adapter else "no-adapter")]
    return "|".join(re.sub(r"\s+", " ", str(part or "")).strip() for part in parts)


def device_label(device: dict) -> str:
    """`Chromium 150.0.7871.100 on Linux; google swiftshader (fallback adapter); no shader-f16`."""
    adapter = device.get("adapter")
    if adapter:
        name = " ".join(p for p in (adapter["vendor"], adapter["architecture"] or adapter["description"]) if p) or "unnamed adapter"
        kind = "fallback adapter" if adapter["fallback"] else "hardware adapter"
        gpu = f"{name} ({kind}); {'shader-f16' if device.get('shaderF16') else 'no shader-f16'}"
    else:
        gpu = "no WebGPU adapter"
    where = f" on {device['os']}" if device.get("os") else ""
    return f"{device.get('browser')} {device.get('version')}{where}; {gpu}"


def adapter_class(device: dict) -> dict | None:
    """The manifest's adapter class of a device: vendor, architecture, description, fallback
    (the loader compares vendor and architecture, as for `measurements`); None without WebGPU."""
    adapter = device.get("adapter")
    return dict(adapter) if adapter else None
