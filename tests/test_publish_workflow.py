"""The example release workflow only uses settings `pack publish` actually reads."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import yaml

from pipeline.commands.publish import publish

WORKFLOW = Path(__file__).resolve().parent.parent / "docs" / "examples" / "release-workflow.yml"


def _envvars_of_publish() -> set[str]:
    names = set()
    for hint in typing.get_type_hints(publish, include_extras=True).values():
        for meta in getattr(hint, "__metadata__", ()):
            envvar = getattr(meta, "envvar", None)
            if envvar:
                names.add(envvar)
    return names


def test_example_workflow_runs_on_tags_and_uses_publish_settings():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads the key `on` as True
    assert triggers["push"]["tags"]
    (job,) = workflow["jobs"].values()
    pack_env = {name for name in job["env"] if name.startswith("PACK_") and name != "PACK_CACHE_DIR"}
    assert pack_env and pack_env <= _envvars_of_publish()
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(job["env"])
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "PACK_ENDPOINT_URL"):
        assert re.fullmatch(r"\$\{\{ secrets\.\w+ \}\}", job["env"][name])  # from the CI's store
    runs = "\n".join(step.get("run", "") for step in job["steps"])
    assert "pack build" in runs and "pack publish" in runs
    assert runs.index("pack build") < runs.index("pack publish")
