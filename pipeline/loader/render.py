"""Render web_template/ into a package: loader.js, loader.d.ts, index.html and demo.js.

The loader itself is generic (it reads manifest.json beside itself at load time); the manifest
only names the package in comments and gives the d.ts its input/output/variant names and the
demo page its headings. Output bytes depend on nothing but the manifest, so a rebuild is
byte-identical.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jinja2

from pipeline.assets.manifest import validate
from pipeline.errors import PackError

TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "web_template"

# output name -> template name; order is the order of the returned list
TEMPLATES: dict[str, str] = {
    "loader.js": "loader.js.j2",
    "loader.d.ts": "loader.d.ts.j2",
    "index.html": "index.html.j2",
    "demo.js": "demo.js.j2",
}

_LINE_BREAKS = re.compile(r"[\r\n\u2028\u2029]+")


def render_loader(package_dir: Path, manifest: dict) -> list[str]:
    """Write the loader files into `package_dir`; returns their names (package paths)."""
    package_dir = Path(package_dir)
    if not package_dir.is_dir():
        raise PackError(f"{package_dir}: not a directory; build the package files before rendering the loader")
    context = template_context(manifest)
    environment = _environment()
    written = []
    for output, template_name in TEMPLATES.items():
        text = environment.get_template(template_name).render(context)
        (package_dir / output).write_bytes(text.encode("utf-8"))
        written.append(output)
    return written


def template_context(manifest: dict) -> dict[str, Any]:
    """What the templates see, from a valid manifest; PackError names the manifest key at fault."""
    validate(manifest, "manifest.json")
    inputs = [_io_item(item) for item in manifest["inputs"]]
    outputs = [_io_item(item) for item in manifest["outputs"]]
    return {
        # Comments only: a name may not break out of a // line.
        "name": _LINE_BREAKS.sub(" ", manifest["name"]),
        "inputs": inputs,
        "outputs": outputs,
        "input_union": _union(item["name"] for item in inputs),
        "output_union": _union(item["name"] for item in outputs),
        "variant_union": _union(sorted(manifest["variants"])),
        "bundle_union": _union(sorted(manifest["runtime"]["bundles"])),
    }


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",), default_for_string=False),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )


def _io_item(item: dict) -> dict[str, str]:
    shape = item["shape"]
    return {
        "name": item["name"],
        "key": json.dumps(item["name"]),
        "dtype": item["dtype"],
        "dtype_literal": json.dumps(item["dtype"]),
        "shape": ", ".join(str(dim) for dim in shape),
        # symbolic dims are numbers at run time
        "shape_type": "readonly [" + ", ".join(str(d) if isinstance(d, int) and d >= 0 else "number" for d in shape) + "]",
    }


def _union(names) -> str:
    literals = [json.dumps(name) for name in names]
    return " | ".join(literals) if literals else "never"
