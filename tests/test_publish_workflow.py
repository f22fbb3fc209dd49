"""pack's GitHub Action (action.yml) passes only options and environment variables the CLI reads,
and the example workflows use it with its inputs and secrets from the CI's store: the release
workflow, and the catalog workflow (a matrix from `pack recipes --matrix`, builds with the shared
cache, one publish after them all)."""

from __future__ import annotations

import json
import re
from fnmatch import fnmatch
from pathlib import Path

import yaml
from typer.testing import CliRunner

from pipeline.cli import COMMANDS, app, load_command

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


CATALOG = REPO / "docs" / "examples" / "catalog-workflow.yml"


def _uses(job: dict, action: str) -> list[dict]:
    return [step for step in job["steps"] if step.get("uses", "").split("@")[0].endswith(action)]


def _needs(job: dict) -> list[str]:
    needs = job.get("needs", [])
    return [needs] if isinstance(needs, str) else needs


def test_catalog_workflow_builds_the_recipes_matrix_with_the_shared_cache_and_publishes_once():
    workflow = yaml.safe_load(CATALOG.read_text())
    jobs = workflow["jobs"]
    commands = _commands()
    ran: dict[str, list[str]] = {}
    for job_name, job in jobs.items():
        for step in job["steps"]:
            for name, rest in _invocations(step.get("run", "")):
                flags, _ = _options(commands[name])
                used = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", rest))
                assert used <= flags, f"`pack {name}` has no {sorted(used - flags)}"
                ran.setdefault(name, []).append(job_name)
    # the matrix: what `pack recipes --matrix` prints, passed on as the job's output
    (matrix_name,) = ran["recipes"]
    (recipes_step,) = [step for step in jobs[matrix_name]["steps"] if "pack recipes" in step.get("run", "")]
    assert re.search(r'echo "matrix=\$\(pack recipes [^)]*--matrix[^)]*\)" >> "\$GITHUB_OUTPUT"', recipes_step["run"])
    assert jobs[matrix_name]["outputs"]["matrix"] == f"${{{{ steps.{recipes_step['id']}.outputs.matrix }}}}"
    printed = json.loads(CliRunner().invoke(app, ["recipes", "--matrix", "--public"]).stdout)
    assert printed["include"] and all(set(entry) == {"recipe"} for entry in printed["include"])
    # one build job per recipe: pack's Action with the shared cache, the package uploaded
    (build_name,) = [name for name, job in jobs.items() if _uses(job, "/pack")]
    build = jobs[build_name]
    assert _needs(build) == [matrix_name]
    assert build["strategy"]["matrix"] == f"${{{{ fromJSON(needs.{matrix_name}.outputs.matrix) }}}}"
    (step,) = _uses(build, "/pack")
    action = yaml.safe_load(ACTION.read_text())
    assert set(step["with"]) <= set(action["inputs"]) and "bucket" not in step["with"]  # builds only; publishing is once, at the end
    assert step["with"]["recipe"] == "${{ matrix.recipe }}" and step["with"]["cache-url"].startswith("s3://")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        assert re.fullmatch(r"\$\{\{ secrets\.\w+ \}\}", step["env"][name])  # from the CI's store
    # the Action hands cache-url to `pack build` as the variable its --cache-url reads
    action_build = next(s for s in action["runs"]["steps"] if s.get("id") == "build")
    assert action_build["env"]["PACK_CACHE_URL"] == "${{ inputs.cache-url }}"
    assert "PACK_CACHE_URL" in _options(commands["build"])[1]
    (upload,) = _uses(build, "actions/upload-artifact")
    assert upload["with"]["path"].rstrip("/") == step["with"]["out"] and build["steps"].index(upload) > build["steps"].index(step)
    # publish: after every build job, all the packages downloaded into one folder, `pack publish` once
    (publish_name,) = ran["publish"]
    assert publish_name not in (build_name, matrix_name)
    publish = jobs[publish_name]
    assert build_name in _needs(publish)
    (download,) = _uses(publish, "actions/download-artifact")
    assert fnmatch(upload["with"]["name"].replace("${{ matrix.recipe }}", "gtcrn"), download["with"]["pattern"]) and download["with"]["merge-multiple"] is True
    (publish_step,) = [s for s in publish["steps"] if "pack publish" in s.get("run", "")]
    assert publish_step["run"].split()[2].rstrip("/") == download["with"]["path"]
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert re.fullmatch(r"\$\{\{ secrets\.\w+ \}\}", publish_step["env"][name])
    _, publish_env = _options(commands["publish"])
    assert {k for k in publish_step["env"] if k.startswith("PACK_")} <= publish_env
