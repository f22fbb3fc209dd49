"""The browser layer's shape: imports run down the pipeline, one mount prefix, in-page code in .js files."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PIPELINE = Path(__file__).resolve().parent.parent / "pipeline"
# The pipeline's order; shared modules at the top of pipeline/ (manifest, recipe, dtypes, cache, ...)
# come before every stage, and stages/ (the build's stage table), commands/, cli.py and build.py after every stage.
STAGES = ("source", "graph", "precision", "verify", "assets", "report", "web", "publish")
WIRING = ("stages", "commands", "cli", "build")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PIPELINE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in PIPELINE.rglob("*.py")}


def _imports(path: Path) -> set[str]:
    """The pipeline modules `path` imports, at any indentation (late imports count too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name in MODULES}


def _rank(module: str) -> int:
    part = module.split(".")[1] if "." in module else ""
    if part in WIRING:
        return len(STAGES)
    return STAGES.index(part) if part in STAGES else -1


def _reachable(module: str, graph: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        for name in graph[todo.pop()] - seen:
            seen.add(name)
            todo.append(name)
    return seen


def test_every_module_reaches_only_its_own_stage_earlier_stages_and_shared_modules() -> None:
    # Transitively: a shared module that imports a stage would let an earlier stage reach it.
    graph = {name: _imports(path) for name, path in MODULES.items()}
    offending = {}
    for name in MODULES:
        rank = _rank(name)
        if rank == len(STAGES):
            continue
        later = sorted(target for target in _reachable(name, graph) if _rank(target) > rank or (rank == -1 and _rank(target) != -1))
        if later:
            offending[name] = later
    assert offending == {}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: modules that reach themselves, each circle once (a package naming
    itself in `from package import submodule` is no circle)."""
    graph = {name: targets - {name} for name, targets in graph.items()}
    return sorted({tuple(sorted(name for name in _reachable(start, graph) if start in _reachable(name, graph))) for start in graph if start in _reachable(start, graph)})


def test_no_module_reaches_itself_through_its_imports() -> None:
    # late imports count: a circle hidden in a function still makes two modules one concern
    assert _circles({name: _imports(path) for name, path in MODULES.items()}) == []
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [("a", "b", "c")]  # the check itself


def test_the_layout_check_sees_a_late_import_through_a_shared_module(tmp_path) -> None:
    # The check itself: a shared module importing verify/ inside a function is an arrow up the pipeline.
    graph = {"pipeline.recipe": {"pipeline.verify.judgement.metrics"}, "pipeline.verify.judgement.metrics": set(), "pipeline.graph.x": {"pipeline.recipe"}}
    assert "pipeline.verify.judgement.metrics" in _reachable("pipeline.graph.x", graph)
    assert _rank("pipeline.recipe") == -1 and _rank("pipeline.verify.judgement.metrics") > _rank("pipeline.graph.x")


def test_one_mount_prefix_and_no_page_code_in_python_strings() -> None:
    prefixes = set()
    for path in PIPELINE.rglob("*.py"):
        text = path.read_text()
        prefixes.update(re.findall(r"[\"'](/__[a-z_]+__/)", text))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) > 200:
                # a long string with arrow functions or awaits is page code: it belongs in page/*.js
                assert not re.search(r"=>\s*\{|\bawait\b", node.value), f"{path.relative_to(PIPELINE)}: page code in a Python string"
    assert prefixes == {"/__pack__/"}


def test_check_records_are_made_in_one_module() -> None:
    # a report.json check entry is built by pipeline/verify/judgement/checks.py `check()` only: no other
    # module writes one as a dict literal
    owner = PIPELINE / "verify" / "judgement" / "checks.py"
    found = []
    for path in PIPELINE.rglob("*.py"):
        if path == owner:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            keys = set()
            if isinstance(node, ast.Dict):
                keys = {key.value for key in node.keys if isinstance(key, ast.Constant)}
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dict":
                keys = {keyword.arg for keyword in node.keywords}
            # a verdict with its figures and bounds, or a verdict on a (stage, ep, variant) with its why
            # (a manifest run has no detail in its literal; a report.html row no ep or figures)
            if "status" in keys and (keys & {"metrics", "threshold"} or {"stage", "ep", "variant", "detail"} <= keys):
                found.append(f"{path.relative_to(PIPELINE)}:{node.lineno}")
    assert found == [], found


def test_the_runner_page_uses_the_loaders_tensor_code() -> None:
    # page/runner.js imports web_template/loader/tensors.js (mounted at /__pack__/loader/), no copy of it
    page = (PIPELINE / "verify" / "engines" / "browser" / "page" / "runner.js").read_text()
    assert "from '../loader/tensors.js'" in page
    assert "Float32Array" not in page and "function decodeTensors" not in page


def _environment_reads(source: str, setting: str) -> list[int]:
    """Lines of `source` that read the environment variable `setting`: os.environ[...] /
    .get / .pop / `in os.environ`, os.getenv, named as a string or by a module constant."""
    tree = ast.parse(source)
    names = {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value == setting
             for target in node.targets if isinstance(target, ast.Name)}

    def is_setting(node: ast.AST) -> bool:
        return (isinstance(node, ast.Constant) and node.value == setting) or (isinstance(node, ast.Name) and node.id in names)

    def is_environ(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ" or isinstance(node, ast.Name) and node.id == "environ"

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_environ(node.value) and is_setting(node.slice):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and node.args and is_setting(node.args[0]) and isinstance(node.func, ast.Attribute) and (
                is_environ(node.func.value) or node.func.attr == "getenv"):
            lines.append(node.lineno)
        elif isinstance(node, ast.Compare) and is_setting(node.left) and any(is_environ(c) for c in node.comparators):
            lines.append(node.lineno)
    return lines


def test_only_the_command_line_reads_the_shared_store_setting() -> None:
    """The shared store is an object the command line opens from --cache-url (PACK_CACHE_URL is
    that option's variable) and hands down; no module below pipeline/commands/ reads the variable."""
    readers = {f"{path.relative_to(PIPELINE.parent)}:{line}" for path in PIPELINE.rglob("*.py") if "commands" not in path.relative_to(PIPELINE).parts
               for line in _environment_reads(path.read_text(encoding="utf-8"), "PACK_CACHE_URL")}
    assert not readers
    # the check sees each way of reading it
    for source in ('import os\nos.environ.get("PACK_CACHE_URL")', 'import os\nURL = "PACK_CACHE_URL"\nos.environ[URL]',
                   'import os\nos.getenv("PACK_CACHE_URL", "")', 'import os\nif "PACK_CACHE_URL" in os.environ: pass'):
        assert _environment_reads(source, "PACK_CACHE_URL") == [len(source.splitlines())], source
    assert _environment_reads('MESSAGE = "set PACK_CACHE_URL"\nprint(MESSAGE)', "PACK_CACHE_URL") == []
