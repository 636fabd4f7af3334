"""The docs stay true: README commands and links, the reference pages in docs/
(op table, JSON fields, specs), the CI script, the markers the bench scripts write between."""

import json
import re

import pytest
from conftest import ROOT, shardplan

from ir import ops

README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
PAGES = ["cli.md", "json.md", "specs.md", "ir.md", "iopddl.md"]


def page(name: str) -> str:
    return (DOCS / name).read_text()


def section(text: str, heading: str) -> str:
    """The text under `heading` (a whole line, e.g. "## Op kinds") up to the next heading of its level or above."""
    level = heading.split(" ", 1)[0]
    body = text.split(f"\n{heading}\n", 1)[1]
    stops = [m.start() for m in re.finditer(r"^(#+) ", body, re.M) if len(m.group(1)) <= len(level)
             and not _in_code(body, m.start())]
    return body[:stops[0]] if stops else body


def _in_code(text: str, pos: int) -> bool:
    return text[:pos].count("\n```") % 2 == 1


def quick_start_commands() -> list[str]:
    return re.findall(r"```sh\n(.*?)\n```", section(README, "## Quick start"), re.S)


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


def test_op_table_lists_every_registered_kind():
    table = section(page("ir.md"), "## Op kinds")
    documented = set(re.findall(r"`([a-z_0-9]+)`", table))
    missing = sorted(set(ops.REGISTRY) - documented)
    assert not missing, f"docs/ir.md's op table lacks {missing}"


def test_complete_spec_example_is_the_bundled_mlp_spec():
    text = section(page("specs.md"), "## Named schedules and expectations")
    (example,) = re.findall(r"```yaml\n(.*?)```", text, re.S)
    assert example == (ROOT / "specs" / "mlp.yaml").read_text()


def test_bundled_spec_table_lists_every_spec():
    table = section(page("specs.md"), "## Bundled specs")
    listed = set(re.findall(r"`([a-z0-9_]+)\.yaml`", table))
    assert listed == {p.stem for p in (ROOT / "specs").glob("*.yaml")}


def _subcommands() -> set[str]:
    from solver.frontend.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.choices and a.dest == "command"]
    return set(sub.choices)


@pytest.mark.parametrize("where", ["README.md", "docs/cli.md"])
def test_command_tables_list_every_command(where):
    text = (ROOT / where).read_text()
    listed = set(re.findall(r"^\| `shardplan ([a-z]+)", text, re.M))
    assert listed == _subcommands(), where


def _json_table(intro: str) -> str:
    """The field table that follows the line starting with `intro` in docs/json.md."""
    after = page("json.md").split(intro, 1)[1]
    return re.search(r"\n(\|.*?)\n(?!\|)", after, re.S).group(1)


def _rows(table: str) -> dict[str, str]:
    """A field table's first column (as written) -> its meaning column."""
    return {row.split("|")[1].strip(): row.split("|")[3].strip() for row in table.splitlines()[2:]}


def _documented(table: str) -> set[str]:
    """The field names of a table's first column (`a`, `b` in one cell count as two)."""
    names = set()
    for row in table.splitlines()[2:]:
        names |= set(re.findall(r"`([^`]+)`", row.split("|")[1]))
    return names


def test_run_json_fields_are_documented(capsys):
    code, out, _ = shardplan(capsys, "run", ROOT / "examples" / "mlp.ir", "--json")
    assert code == 0
    data = json.loads(out)
    documented = _documented(_json_table("`shardplan run FILE --json`"))
    fields = set(data) | {f"outputs[].{k}" for k in data["outputs"][0]}
    assert fields == documented


def test_plan_json_fields_are_documented(capsys):
    code, out, _ = shardplan(capsys, "plan", ROOT / "specs" / "mlp.yaml", "--json")
    assert code == 0
    data = json.loads(out)
    documented = _documented(_json_table("`shardplan plan SPEC --json`"))
    tops = {name.split(".")[0].removesuffix("[]") for name in documented}
    assert set(data) == tops
    for group in ("cost", "plan"):
        listed = {name.split(".", 1)[1].removesuffix("[]") for name in documented if name.startswith(f"{group}.")}
        assert set(data[group]) == listed, group
    assert data["pipeline"] is None
    code, out, _ = shardplan(capsys, "plan", ROOT / "specs" / "transformer_pipeline.yaml", "--json")
    pipeline = json.loads(out)["pipeline"]
    rows = _rows(_json_table("`shardplan plan SPEC --json`"))
    for key in pipeline:
        assert f"`{key}`" in rows["`pipeline`"] or f"`pipeline.{key}[]`" in rows, key
    for part in ("transfers", "per_stage"):
        for key in pipeline[part][0]:
            assert f"`{key}`" in rows[f"`pipeline.{part}[]`"], (part, key)


def test_grid_json_fields_are_documented(capsys):
    code, out, err = shardplan(capsys, "plan", ROOT / "specs" / "mesh_search" / "deep_mlp_8192x16.yaml",
                               "--solver", "cpsat", "--grid", "--stages", "1,2", "--microbatches", "1,2", "--json")
    assert code == 0, err
    data = json.loads(out)
    table = _json_table("`shardplan plan SPEC --solver cpsat --grid --json`")
    assert set(data) == {name.removesuffix("[]") for name in _documented(table)}
    for key in data["grid"][0]:
        assert f"`{key}`" in _rows(table)["`grid[]`"], key


def test_bench_scripts_find_their_markers_in_the_readme():
    source = (ROOT / "bench" / "iopddl.py").read_text()
    (begin, end) = re.search(r'^BEGIN, END = "([^"]+)", "([^"]+)"', source, re.M).groups()
    pairs = [("iopddl.py", README, begin, end)]
    # The others write through bench/readme_table.py: write_table("NAME", table[, path]).
    for script, page_text in (("compare.py", page("specs.md")), ("efficiency.py", README), ("distir_grid.py", README),
                              ("auto_vs_expert.py", README),
                              ("distir_trend.py", page("specs.md")), ("rerank.py", page("specs.md"))):
        names = re.findall(r'write_table\("([^"]+)"', (ROOT / "bench" / script).read_text())
        assert names, script
        pairs += [(script, page_text, f"<!-- {name}:begin -->", f"<!-- {name}:end -->") for name in names]
    for script, text, begin, end in pairs:
        assert text.count(begin) == 1 and text.count(end) == 1, script
        assert text.index(begin) < text.index(end), script


_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    headings = [m.group(1) for m in re.finditer(r"^#+ (.*)$", text, re.M) if not _in_code(text, m.start())]
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


MAP = "docs/ARCHITECTURE.md"
DEEP_DIVES = ["search.md", "costmodel.md", "pipelines.md", "import.md", "internals.md", "long_context.md"]


@pytest.mark.parametrize("where", ["README.md", "CONTRIBUTING.md", MAP]
                         + [f"docs/{p}" for p in PAGES + DEEP_DIVES])
def test_relative_links_reach_a_file_and_heading(where):
    path = ROOT / where
    text = path.read_text()
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # an absolute URL
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        assert linked.exists(), f"{where}: {target}"
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked.read_text()), f"{where}: {target}"


def test_the_architecture_map_is_short_and_links_its_deep_dives():
    text = (ROOT / MAP).read_text()
    assert len(text.splitlines()) <= 600
    for page_name in DEEP_DIVES[:5]:
        assert f"]({page_name})" in text, page_name
    assert not re.search(r"\bissues? \d+", text, re.I), "history (issue numbers) belongs in commits and issue notes"


_MODULE_PATH = re.compile(r"`((?:ir|costmodel|solver|tests|tools|bench)/[\w/]*?\w+(?:\.py|/))`")


@pytest.mark.parametrize("where", [MAP, "CONTRIBUTING.md"] + [f"docs/{p}" for p in DEEP_DIVES])
def test_each_module_the_docs_name_exists(where):
    """A path in backticks (`solver/search/space.py`, `ir/opset/`) names a file or folder that exists."""
    text = (ROOT / where).read_text()
    missing = sorted({m for m in _MODULE_PATH.findall(text) if not (ROOT / m).exists()})
    assert not missing, f"{where} names modules that do not exist: {missing}"


def test_the_map_names_every_package_and_module():
    """Each package under ir/, costmodel/ and solver/ and each module in them is named in the map
    (a module inside a package the map lists by its files, e.g. `ir/opset/`, by its file name)."""
    text = (ROOT / MAP).read_text()
    unnamed = []
    for top in ("ir", "costmodel", "solver"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if path.name == "__init__.py":
                if rel != f"{top}/__init__.py" and f"`{path.parent.relative_to(ROOT).as_posix()}/`" not in text:
                    unnamed.append(rel)
            elif f"`{rel}`" not in text and f"`{path.name}`" not in text:
                unnamed.append(rel)
    assert not unnamed, f"docs/ARCHITECTURE.md does not name {unnamed}"


def test_contributing_commands_name_scripts_and_flags_that_exist():
    """Each `python bench/...` command in CONTRIBUTING.md runs a script that exists and takes those flags."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    commands = re.findall(r"`python (bench/\w+\.py)((?: --[\w-]+(?: \d+)?)*)`", text)
    assert len(commands) >= 10
    for script, flags in commands:
        source = (ROOT / script).read_text()
        for flag in re.findall(r"--[\w-]+", flags):
            assert f'"{flag}"' in source, f"{script} has no {flag}"
    assert quick_start_commands()[1] in text  # the README's test command, as CI runs it
