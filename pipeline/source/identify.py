"""What a model file seems to be, for the error when it is not the file a recipe names."""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import PackError


def describe_file(path: Path, sha256: str) -> str:
    """'N bytes, opset K, inputs a, b' (or why it is not an ONNX model), read without its weights."""
    import onnx

    size = path.stat().st_size
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
