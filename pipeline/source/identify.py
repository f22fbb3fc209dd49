"""What a model file seems to be, for the error when it is not the file a recipe names."""

from __future__ import annotations

import html
import re
from pathlib import Path

from pipeline.errors import PackError

LFS_POINTER = b"version https://git-lfs.github.com/spec/"
SNIFF_BYTES = 4096  # an LFS pointer is ~130 bytes; an HTML page says so in its first line


def stand_in(path: Path) -> tuple[str, str] | None:
    """(what the file is, how to get the model) when `path` holds something often saved in a
    model's place: a Git LFS pointer (a clone without `git lfs`) or an HTML page (a login, error
    or download page fetched instead of the file); None otherwise."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(SNIFF_BYTES)
    except OSError:
        return None
    if head.startswith(LFS_POINTER):
        size = re.search(rb"^size (\d+)", head, re.MULTILINE)
        of = f" of a {int(size.group(1))}-byte file" if size else ""
        return (f"a Git LFS pointer{of}, not the model",
                "fetch the real file with `git lfs pull` in its repository (after `git lfs install`), or download the model itself; downloading the pointer again gives the same pointer")
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if text.startswith((b"<!doctype html", b"<html", b"<head", b"<body")):
        title = re.search(rb"<title[^>]*>([^<]{1,120})", head, re.IGNORECASE)
        titled = f" titled '{html.unescape(title.group(1).decode('utf-8', 'replace')).strip()}'" if title else ""
        return (f"an HTML page{titled}, not an ONNX model (an error, login or download page saved in its place)",
                "download the model file itself (the direct link to the .onnx, e.g. a hub's /resolve/ URL rather than its /blob/ page)")
    return None


def describe_file(path: Path, sha256: str) -> str:
    """'N bytes, opset K, inputs a, b' (or why it is not an ONNX model), read without its weights."""
    import onnx

    size = path.stat().st_size
    found = stand_in(path)
    if found:
        return f"{size} bytes, {found[0]}"
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 (any parse failure means the same thing here)
        return f"{size} bytes, not an ONNX model"
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    initializers = {t.name for t in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in initializers]
    custom = sorted({o.domain for o in model.opset_import if o.domain not in ("", "ai.onnx", "ai.onnx.ml", "com.microsoft")})
    text = f"{size} bytes, opset {opset}, inputs {', '.join(inputs) or 'none'}"
    return text + (f", custom op domains {', '.join(custom)}" if custom else "")


def recipe_with_sha256(sha256: str) -> str | None:
    """The built-in recipe whose published source has this hash, if any."""
    from pipeline.recipe import builtin_recipes, load_recipe_file

    for path in builtin_recipes():
        try:
            recipe = load_recipe_file(path)
        except PackError:
            continue
        if recipe.source_sha256 == sha256:
            return recipe.name
    return None
