"""The CI templates under examples/ci/ parse, and every harness command in them is a valid
invocation of this command line (parsed by its own parser, with the CI's variables filled in)."""

import re
import shlex
from pathlib import Path

import pytest
import yaml

from harness import cli

ROOT = Path(__file__).resolve().parent.parent
GITHUB = ROOT / "examples" / "ci" / "github-actions.yml"
BUILDKITE = ROOT / "examples" / "ci" / "buildkite.yml"
# The CI systems' own variables, as a runner would fill them in.
FILLED = {
    r"\$\{\{ *matrix\.shard *\}\}": "2",
    r"\$\{\{ *env\.SHARDS *\}\}": "4",
    r"\{\{ *matrix\.shard *\}\}": "2",
    r"\{\{ *matrix\.flashinfer *\}\}": "0.7.2.post1",
    r"\{\{ *matrix *\}\}": "0.7.2.post1",
    r"\$\$SHARDS": "4",
    r'"\$\$?profile"|"\$PROFILE"': "gpu",
    r"\$\$?previous": "--previous last/results.json",
    r'"\$\$last"': "last.json",
    r"\$\$?pins": "--pins attn-harness-pins.json",
}


def harness_commands(script: str) -> list[list[str]]:
    """Each `attn-harness ...` command of a shell script, its variables filled in, as argv."""
    out = []
    for line in script.splitlines():
        match = re.search(r"(?:^|\s|/)attn-harness (.*)$", line)
        if not match:
            continue
        text = match.group(1)
        for pattern, value in FILLED.items():
            text = re.sub(pattern, value, text)
        assert "$" not in text and "{{" not in text, f"unfilled variable in: {line.strip()}"
        out.append(shlex.split(text))
    return out


def github_scripts() -> list[str]:
    data = yaml.safe_load(GITHUB.read_text())
    return [step["run"] for job in data["jobs"].values() for step in job["steps"] if "run" in step]


def buildkite_scripts() -> list[str]:
    return [step["command"] for step in yaml.safe_load(BUILDKITE.read_text())["steps"] if "command" in step]


@pytest.mark.parametrize("scripts", [github_scripts, buildkite_scripts], ids=["github", "buildkite"])
def test_every_harness_command_parses(scripts):
    commands = [argv for script in scripts() for argv in harness_commands(script)]
    assert {argv[0] for argv in commands} == {"check", "merge"}
    for argv in commands:
        args = cli.parser().parse_args(argv)
        if args.command == "check":
            assert args.shard == "2/4" and args.results
        else:
            assert args.out and args.shares


def test_a_broken_command_would_be_caught():
    with pytest.raises(cli.UsageError):
        cli.parser().parse_args(harness_commands("attn-harness check --shrad 2/4")[0])


def test_the_github_workflow_splits_caches_uploads_and_merges():
    data = yaml.safe_load(GITHUB.read_text())
    check, merge = data["jobs"]["check"], data["jobs"]["merge"]
    assert len(check["strategy"]["matrix"]["shard"]) == int(data["env"]["SHARDS"])
    assert check["strategy"]["fail-fast"] is False
    cache = next(s for s in check["steps"] if str(s.get("uses", "")).startswith("actions/cache"))
    for part in ("steps.gpu.outputs.kind", "matrix.flashinfer", "env.PROFILE"):
        assert part in cache["with"]["key"]
    assert any(str(s.get("uses", "")).startswith("actions/upload-artifact") for s in check["steps"])
    assert merge["needs"] == "check" and merge["if"] == "always()"
    assert "thorough" in data["env"]["PROFILE"] and "schedule" in str(data[True])


def test_the_buildkite_pipeline_waits_for_every_share_then_merges():
    steps = yaml.safe_load(BUILDKITE.read_text())["steps"]
    check, wait, merge = steps
    assert check["matrix"]["setup"]["shard"] == ["1", "2", "3", "4"]
    assert wait == {"wait": None, "continue_on_failure": True}
    assert "attn-harness merge" in merge["command"] and "artifact download" in merge["command"]


@pytest.mark.parametrize(
    "scripts,template",
    [(github_scripts, GITHUB), (buildkite_scripts, BUILDKITE)],
    ids=["github", "buildkite"],
)
def test_every_run_replays_the_pins_file_and_the_nightly_adds_its_failures_to_it(scripts, template):
    """docs/ci.md: every check replays the pins file first; the nightly is seeded (new draws, the
    same on every share) and keeps every failing case of its merged results in the pins file."""
    commands = [argv for script in scripts() for argv in harness_commands(script)]
    checks = [cli.parser().parse_args(argv) for argv in commands if argv[0] == "check"]
    assert checks and all(args.pins == "attn-harness-pins.json" for args in checks)
    lines = [line for script in scripts() for line in script.splitlines()]
    keeps = [line for line in lines if "-m harness.search.kept" in line]
    assert keeps and all("merged" in line and "results.json" in line for line in keeps)
    assert "ATTN_HARNESS_SEED" in template.read_text()
