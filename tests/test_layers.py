"""The import graph of the four packages, read with `ast` (imports inside functions and under TYPE_CHECKING count):
no cycle between modules, none between packages, and no import from a lower layer to a higher one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = ("hir_model", "hir_assets", "dagster_project", "data_contracts")

# Low to high: a package may import its own modules and those of the packages before it, never one after it.
LAYERS = (
    "hir_model",  # the package's own __init__ (a docstring)
    "hir_model.storage",
    "hir_model.files_cache",  # per-process loads of unchanged files: the MovieLens parse, the text encoder
    "data_contracts",
    "hir_model.data",
    "hir_model.config",
    "hir_model.protocol",  # split, metrics, Method: shared by the head, the adapter and the baselines
    "hir_model.content",
    "hir_model.graph",
    "hir_model.nn",
    "hir_model.train",
    "hir_model.embed",
    "hir_model.adapter",
    "hir_model.hierarchy",
    "hir_model.retrieval",
    "hir_model.rank",
    "hir_model.baselines",
    "hir_model.eval",
    "hir_model.cli",
    "hir_assets",
    "dagster_project",
)
NO_DAGSTER = ("hir_model", "data_contracts")  # pure libraries: no Dagster import, ever


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module under the four packages."""
    out = {}
    for top in TOP:
        for path in sorted((root / top).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported(name: str, path: Path, known: dict[str, Path]) -> tuple[set[str], set[str]]:
    """(the known modules that `name` imports, the top-level names of everything it imports)."""
    tree = ast.parse(path.read_text(), str(path))
    targets: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                package = package[:len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            targets += [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    found = set()
    for target in targets:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)
    return found, {t.split(".")[0] for t in targets}


def import_graph(root: Path = ROOT) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module -> modules it imports, module -> top-level names it imports)."""
    known = modules(root)
    graph, tops = {}, {}
    for name, path in known.items():
        graph[name], tops[name] = imported(name, path, known)
    return graph, tops


def package(module: str) -> str:
    """The layer unit of a module: `hir_model.<sub>` inside hir_model, else the top-level package."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "hir_model" else parts[0]


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for src, dsts in graph.items():
        out.setdefault(package(src), set()).update(package(d) for d in dsts if package(d) != package(src))
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def upward(graph: dict[str, set[str]], layers: tuple[str, ...] = LAYERS) -> list[str]:
    """`src -> dst` for every import whose target's package sits above the importer's in `layers`."""
    rank = {p: i for i, p in enumerate(layers)}
    return [f"{src} -> {dst}" for src in sorted(graph) for dst in sorted(graph[src])
            if rank[package(dst)] > rank[package(src)]]


@pytest.fixture(scope="module")
def graphs():
    return import_graph()


def test_every_package_has_a_layer(graphs):
    graph, _ = graphs
    assert sorted({package(m) for m in graph} - set(LAYERS)) == [], "add the new package to LAYERS, in its place"


def test_no_module_imports_a_module_that_imports_it_back(graphs):
    graph, _ = graphs
    assert cycles(graph) == []


def test_no_package_imports_a_package_that_imports_it_back(graphs):
    graph, _ = graphs
    assert cycles(package_graph(graph)) == []


def test_no_import_reaches_up_a_layer(graphs):
    graph, _ = graphs
    assert upward(graph) == []


def test_the_pure_libraries_never_import_dagster(graphs):
    _, tops = graphs
    bad = sorted(f"{m} -> {t}" for m, names in tops.items() if m.split(".")[0] in NO_DAGSTER
                 for t in names if t.startswith("dagster"))
    assert bad == []


def test_the_checks_find_what_they_look_for(tmp_path):
    """The finders on hand-made graphs, and the parser on a hand-made tree (a function-level import included)."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert cycles({"x": {"y"}, "y": {"x", "z"}, "z": {"w"}, "w": {"z"}}) == [["w", "z"], ["x", "y"]]
    assert upward({"hir_model.train.a": {"hir_model.eval.b"}, "hir_model.eval.b": {"hir_model.train.a"}}) == [
        "hir_model.train.a -> hir_model.eval.b"]
    (tmp_path / "hir_model" / "low").mkdir(parents=True)
    (tmp_path / "hir_model" / "high").mkdir()
    for d in ("hir_model", "hir_model/low", "hir_model/high"):
        (tmp_path / d / "__init__.py").write_text("")
    (tmp_path / "hir_model" / "low" / "a.py").write_text("def f():\n    from hir_model.high import b\n")
    (tmp_path / "hir_model" / "high" / "b.py").write_text("from ..low.a import f\nimport dagster\n")
    for top in TOP[1:]:
        (tmp_path / top).mkdir()
    graph, tops = import_graph(tmp_path)
    assert graph["hir_model.low.a"] == {"hir_model.high.b"} and graph["hir_model.high.b"] == {"hir_model.low.a"}
    assert cycles(graph) == [["hir_model.high.b", "hir_model.low.a"]]
    assert cycles(package_graph(graph)) == [["hir_model.high", "hir_model.low"]]
    assert upward(graph, ("hir_model", "hir_model.low", "hir_model.high")) == ["hir_model.low.a -> hir_model.high.b"]
    assert "dagster" in tops["hir_model.high.b"]
