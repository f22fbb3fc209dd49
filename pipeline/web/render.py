"""Write the browser files into a package: loader.js and its ES modules (loader/*.js) and demo.js,
copied as they are, loader.d.ts and index.html, rendered from templates, and package.json
(pipeline/web/npm.py).

The loader is generic (it reads manifest.json beside itself at load time): only the types (input,
output, variant names) and the demo page (headings) are rendered from the manifest. The files are
package data (`pipeline.web_template`, the repo's web_template/ folder) read with
importlib.resources, so an installed wheel renders them too. Output bytes depend on nothing but
the manifest, so a rebuild is byte-identical.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import jinja2

from pipeline.dtypes import TYPED_ARRAYS
from pipeline.web.npm import PACKAGE_JSON, package_json
from pipeline.manifest import validate
from pipeline.errors import PackError

WEB_TEMPLATE = "pipeline.web_template"
# Copied as they are: the entry module, the demo script, and every module of loader/.
STATIC_FILES = ("loader.js", "demo.js")
MODULE_DIR = "loader"
# output name -> template name
TEMPLATES: dict[str, str] = {
    "loader.d.ts": "loader.d.ts.j2",
    "index.html": "index.html.j2",
}

_LINE_BREAKS = re.compile(r"[\r\n\u2028\u2029]+")


def web_template() -> Traversable:
    """The browser files shipped with pack (web_template/ in the repo)."""
    return resources.files(WEB_TEMPLATE)


def static_files() -> dict[str, Traversable]:
    """Package path -> source of every browser file copied verbatim, in a stable order."""
    root = web_template()
    found = {name: root / name for name in STATIC_FILES}
    modules = root / MODULE_DIR
    for module in sorted(modules.iterdir(), key=lambda item: item.name):
        if module.name.endswith(".js"):
            found[f"{MODULE_DIR}/{module.name}"] = module
    return found


def render_loader(package_dir: Path, manifest: dict, sample_rate: int | None = None) -> list[str]:
    """Write the loader files into `package_dir`; returns their package paths (for manifest "files").
    `sample_rate`: the recipe's audio sample rate, which the demo page plays its sound at (it
    is rendered into index.html: report.json, which records it too, is not published by default)."""
    package_dir = Path(package_dir)
    if not package_dir.is_dir():
        raise PackError(f"{package_dir}: not a directory; build the package files before rendering the loader")
    context = template_context(manifest, sample_rate)
    environment = _environment()
    outputs: dict[str, bytes] = {path: source.read_bytes() for path, source in static_files().items()}
    for output, template_name in TEMPLATES.items():
        outputs[output] = environment.get_template(template_name).render(context).encode("utf-8")
    outputs[PACKAGE_JSON] = package_json(manifest, list(outputs))
    for path, data in outputs.items():
        target = package_dir / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return list(outputs)


def template_context(manifest: dict, sample_rate: int | None = None) -> dict[str, Any]:
    """What the templates see, from a valid manifest; PackError names the manifest key at fault."""
    validate(manifest, "manifest.json")
    inputs = [_io_item(item) for item in manifest["inputs"]]
    outputs = [_io_item(item) for item in manifest["outputs"]]
    return {
        # Comments only: a name may not break out of a // line.
        "name": _LINE_BREAKS.sub(" ", manifest["name"]),
        "description": manifest.get("description") or "",
        "license": manifest.get("license"),
        "inputs": inputs,
        "outputs": outputs,
        "input_union": _union(item["name"] for item in inputs),
        "output_union": _union(item["name"] for item in outputs),
        "variant_union": _union(sorted(manifest["variants"])),
        "bundle_union": _union(sorted(manifest["runtime"]["bundles"])),
        "sample_rate": int(sample_rate) if sample_rate else None,
    }


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FunctionLoader(lambda name: (web_template() / name).read_text(encoding="utf-8")),
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
        "typed_array": TYPED_ARRAYS[item["dtype"]],
        "shape": ", ".join(str(dim) for dim in shape),
        # symbolic dims are numbers at run time
        "shape_type": "readonly [" + ", ".join(str(d) if isinstance(d, int) and d >= 0 else "number" for d in shape) + "]",
    }


def _union(names) -> str:
    literals = [json.dumps(name) for name in names]
    return " | ".join(literals) if literals else "never"
