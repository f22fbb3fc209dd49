"""The browser layer's shape: imports run down the pipeline, one mount prefix, in-page code in .js files."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PIPELINE = Path(__file__).resolve().parent.parent / "pipeline"
LATER_THAN_GRAPH = ("pipeline.precision", "pipeline.verify", "pipeline.assets", "pipeline.report", "pipeline.loader", "pipeline.publish",
                    "pipeline.commands", "pipeline.build", "pipeline.cli")


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_graph_imports_nothing_from_later_stages() -> None:
    offending = {
        str(path.relative_to(PIPELINE)): sorted(name for name in _imports(path) if name.startswith(LATER_THAN_GRAPH))
        for path in (PIPELINE / "graph").rglob("*.py")
    }
    assert {path: names for path, names in offending.items() if names} == {}


def test_verify_imports_nothing_from_later_stages() -> None:
    # the manifest (pipeline/manifest.py) sits at the top of the package beside recipe.py: every stage reads it
    later = ("pipeline.assets", "pipeline.report", "pipeline.loader", "pipeline.publish", "pipeline.commands", "pipeline.build", "pipeline.cli")
    offending = {str(p.relative_to(PIPELINE)): sorted(n for n in _imports(p) if n.startswith(later))
                 for p in (PIPELINE / "verify").rglob("*.py")}
    assert {path: names for path, names in offending.items() if names} == {}


def test_report_imports_only_earlier_stages() -> None:
    # the report reads what assets wrote (the sample file) and what verify measured; nothing later
    later = ("pipeline.loader", "pipeline.publish", "pipeline.commands", "pipeline.build", "pipeline.cli")
    offending = {str(p.relative_to(PIPELINE)): sorted(n for n in _imports(p) if n.startswith(later))
                 for p in (PIPELINE / "report").rglob("*.py")}
    assert {path: names for path, names in offending.items() if names} == {}


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
