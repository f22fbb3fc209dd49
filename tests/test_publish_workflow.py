"""pack's GitHub Action (action.yml) passes only options and environment variables the CLI reads,
and the example release workflow uses it with its inputs and secrets from the CI's store."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from pipeline.cli import COMMANDS, load_command

REPO = Path(__file__).resolve().parent.parent
ACTION = REPO / "action.yml"
WORKFLOW = REPO / "docs" / "examples" / "release-workflow.yml"
# Read by pack itself, not by a command's options.
GLOBAL_ENV = {"PACK_CACHE_DIR"}


def _commands() -> dict[str, object]:
    return {name: load_command(name) for name in COMMANDS}


def _options(command) -> tuple[set[str], set[str]]:
    """The command's flags (--x and --no-x forms) and environment variables."""
    flags, envvars = set(), set()
    for param in command.params:
        flags.update(name for name in [*param.opts, *param.secondary_opts] if name.startswith("--"))
        envvar = getattr(param, "envvar", None)
        envvars.update([envvar] if isinstance(envvar, str) else envvar or [])
    return flags, envvars


def _invocations(script: str) -> list[tuple[str, str]]:
    """(command, rest of its line) for each `pack COMMAND ...` in a shell script."""
    joined = re.sub(r"\\\n\s*", " ", re.sub(r"(?m)^\s*#.*$", "", script))
    return [(m.group(1), m.group(2)) for m in re.finditer(r"(?:^\s*|[;&|]\s*|\$\(\s*)pack (\w+)([^\n]*)", joined, re.M)]


def test_action_passes_only_flags_and_envvars_the_cli_has():
    action = yaml.safe_load(ACTION.read_text())
    assert action["runs"]["using"] == "composite"
    commands = _commands()
    called = []
    for step in action["runs"]["steps"]:
        script = step.get("run", "")
        invocations = _invocations(script)
        env = step.get("env", {})
        for name, rest in invocations:
            assert name in commands, f"action.yml runs `pack {name}`, which is not a pack command"
            flags, envvars = _options(commands[name])
            used = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", rest))
            assert used <= flags, f"`pack {name}` has no {sorted(used - flags)}"
            # PACK_* variables the script does not read itself are for pack to read
            for_pack = {k for k in env if k.startswith("PACK_") and not re.search(rf"\$\{{?{k}\b", script)}
            assert for_pack <= envvars | GLOBAL_ENV, f"`pack {name}` reads no {sorted(for_pack - envvars - GLOBAL_ENV)}"
            called.append(name)
    assert called == ["build", "publish"]
    # every input reaches a step, and none is a credential (those come from the CI's secret store)
    text = ACTION.read_text()
    for name in action["inputs"]:
        assert f"inputs.{name}" in text, f"input {name} is never used"
        assert not re.search(r"secret|access.?key|token|password", name)
    assert {"recipe", "bucket", "endpoint-url"} <= set(action["inputs"]) and action["inputs"]["recipe"]["required"] is True


def test_action_caches_pack_cache_dir_keyed_by_the_recipe_and_its_lock():
    action = yaml.safe_load(ACTION.read_text())
    steps = action["runs"]["steps"]
    (cache,) = [step for step in steps if step.get("uses", "").startswith("actions/cache@")]
    assert "hashFiles(inputs.recipe, steps.cache-key.outputs.lock)" in cache["with"]["key"]
    key_step = next(step for step in steps if step.get("id") == "cache-key")
    assert f'PACK_CACHE_DIR={cache["with"]["path"].replace("${{ runner.temp }}", "$RUNNER_TEMP")}' in key_step["run"]
    # the lock pack reads and writes is the one hashed
    build = next(step for step in steps if step.get("id") == "build")
    assert build["env"]["PACK_LOCK"] == "${{ steps.cache-key.outputs.lock }}"
    assert steps.index(cache) < steps.index(build)


def test_example_workflow_uses_the_action_with_secrets_from_the_store():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads the key `on` as True
    assert triggers["push"]["tags"]
    (job,) = workflow["jobs"].values()
    (step,) = [step for step in job["steps"] if step.get("uses", "").endswith("/pack@v1")]
    inputs = yaml.safe_load(ACTION.read_text())["inputs"]
    assert set(step["with"]) <= set(inputs) and {"recipe", "bucket", "endpoint-url"} <= set(step["with"])
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert re.fullmatch(r"\$\{\{ secrets\.\w+ \}\}", step["env"][name])  # from the CI's store
    assert re.fullmatch(r"\$\{\{ secrets\.\w+ \}\}", step["with"]["endpoint-url"])
    later = "\n".join(str(s.get("env", "")) for s in job["steps"][job["steps"].index(step) + 1 :])
    assert "steps.pack.outputs.loader-url" in later
