"""The docs stay true: README commands, op table, CI script."""

import re

from conftest import ROOT

from ir import ops

README = (ROOT / "README.md").read_text()


def quick_start_commands() -> list[str]:
    section = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)\n```", section, re.S)


def test_quick_start_has_exactly_two_commands():
    commands = quick_start_commands()
    assert len(commands) == 2
    assert commands[0].startswith("pip install -e . && shardplan ")
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command_verbatim():
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert quick_start_commands()[1] in ci_lines


def test_quick_start_input_exists():
    argument = quick_start_commands()[0].split("&& shardplan ", 1)[1].split()[1]
    assert (ROOT / argument).is_file()


def test_readme_op_table_lists_every_registered_kind():
    table = README.split("### Op kinds", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`([a-z_0-9]+)`", table))
    missing = sorted(set(ops.REGISTRY) - documented)
    assert not missing, f"README op table lacks {missing}"


def test_readme_complete_spec_example_is_the_bundled_mlp_spec():
    section = README.split("### Named schedules and expectations", 1)[1].split("\n### ", 1)[0]
    (example,) = re.findall(r"```yaml\n(.*?)```", section, re.S)
    assert example == (ROOT / "specs" / "mlp.yaml").read_text()


def test_readme_bundled_spec_table_lists_every_spec():
    table = README.split("### Bundled specs", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
    listed = set(re.findall(r"`([a-z0-9_]+)\.yaml`", table))
    assert listed == {p.stem for p in (ROOT / "specs").glob("*.yaml")}
