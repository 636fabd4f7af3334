"""The import graph of ir, costmodel and solver: `ir` <- `costmodel` <-
`solver`, inside solver `plan` <- `search` <- `planning` <- `frontend`
(`iopddl` apart, used only by the front end), and no cycle, counting
imports inside functions too (a lazy import is still a dependency)."""

import ast
import collections

from conftest import ROOT

LAYERS = {"ir": 0, "costmodel": 1, "solver": 2}
SOLVER_LAYERS = {"solver": 0, "solver.plan": 0, "solver.iopddl": 0, "solver.search": 1, "solver.planning": 2,
                 "solver.frontend": 3}


def import_graph() -> dict[str, set[str]]:
    modules = {}
    for top in LAYERS:
        for path in (ROOT / top).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            modules[name] = path
    edges: dict[str, set[str]] = collections.defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            # A package importing its own submodules is how it registers them, not a dependency cycle.
            edges[name] |= {t for t in targets if t in modules and t != name and not t.startswith(name + ".")}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = [stack.pop()]
            while component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_cycle():
    assert cycles(import_graph()) == []


def test_lower_layers_never_import_higher_ones():
    upward = [(a, b) for a, targets in import_graph().items() for b in targets
              if LAYERS[b.split(".")[0]] > LAYERS[a.split(".")[0]]]
    assert upward == []


def _solver_layer(module: str) -> int:
    return SOLVER_LAYERS[".".join(module.split(".")[:2])]


def test_solver_layers_never_import_higher_ones():
    solver = {a: {b for b in targets if b.startswith("solver.")}
              for a, targets in import_graph().items() if a.startswith("solver.")}
    upward = [(a, b) for a, targets in solver.items() for b in targets if _solver_layer(b) > _solver_layer(a)]
    assert upward == []
    # iopddl is its own world: only the command line reaches into it, and it reaches nothing else of solver.
    crossing = [(a, b) for a, targets in solver.items() for b in targets
                if a.startswith("solver.iopddl") != b.startswith("solver.iopddl")]
    assert crossing and all(a.startswith("solver.frontend.") and b.startswith("solver.iopddl") for a, b in crossing)


def test_every_solver_module_belongs_to_a_layer():
    names = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
             for p in (ROOT / "solver").rglob("*.py")}
    assert all(".".join(n.split(".")[:2]) in SOLVER_LAYERS for n in names)


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
