"""The package's imports run one way, top to bottom (docs/pipeline.md, "Layers").

Every module of ``inductor_gqa/``, ``patterns/`` (shipped as ``inductor_gqa.patterns``) and the
perf tools is parsed with ``ast``, nothing imported; each import between two of them, at the
module top or inside a function, is an edge. A module may import its own layer or one below it,
never one above, and no files may import each other in a circle.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# top to bottom; a module belongs to the layer of the longest name that is it or a package above it
LAYERS = (
    ("perf tools", ("perf",)),
    ("entry points", ("inductor_gqa", "inductor_gqa.__main__", "inductor_gqa.backend")),
    ("ways in", ("inductor_gqa.install", "inductor_gqa.explain")),
    ("orchestration", ("inductor_gqa.before_autograd", "inductor_gqa.graph_pass",
                       "inductor_gqa.tune", "inductor_gqa.fused")),
    ("lower", ("inductor_gqa.lower",)),
    ("find", ("inductor_gqa.find",)),
    ("op", ("inductor_gqa.op",)),
    ("plan", ("inductor_gqa.plan",)),
    ("patterns", ("inductor_gqa.patterns",)),
    ("spec types", ("inductor_gqa.plan.spec",)),     # what the recognizers may name of the plan
    ("kernels, options", ("inductor_gqa.kernels", "inductor_gqa.options",
                          "inductor_gqa.workloads")),
)
# names that are only themselves (the package's __init__), not every module below them
EXACT = {"inductor_gqa"}


def modules() -> dict:
    """Module name -> (path relative to the repository, is a package's __init__)."""
    out = {}
    for folder, prefix in (("inductor_gqa", ["inductor_gqa"]),
                           ("patterns", ["inductor_gqa", "patterns"]), ("perf", ["perf"])):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder)
            if rel.parts[0] in ("results", "baselines"):
                continue
            parts = prefix + list(rel.with_suffix("").parts)
            init = parts[-1] == "__init__"
            if init:
                parts = parts[:-1]
            out[".".join(parts)] = (str(path.relative_to(ROOT)), init)
    return out


def layer_of(module: str):
    """(index, name) of the module's layer, or None where the table has no entry for it."""
    best = None
    for i, (name, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            hit = module == p or (p not in EXACT and module.startswith(p + "."))
            if hit and (best is None or len(p) > best[0]):
                best = (len(p), i, name)
    return None if best is None else best[1:]


def imports(module: str, path: str, init: bool, known) -> list:
    """(imported module, line) for each import of one of ``known`` in the file."""
    package = module if init else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse((ROOT / path).read_text(), path)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            # ``from a import b``: the module a.b where there is one, else a itself
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:     # ``import a.b.c`` of a name below a module
                t = t.rpartition(".")[0]
            if t and t != module and (t, node.lineno) not in out:
                out.append((t, node.lineno))
    return out


def edges() -> dict:
    """Module -> [(imported module, line)]."""
    known = modules()
    return {m: imports(m, path, init, known) for m, (path, init) in known.items()}


def upward(graph: dict, files: dict) -> list:
    """A line per import that runs to a layer above the importer's."""
    out = []
    for m, targets in graph.items():
        lm = layer_of(m)
        for t, line in targets:
            lt = layer_of(t)
            if lm and lt and lt[0] < lm[0]:
                out.append(f"{files[m]}:{line} ({lm[1]}) imports {files[t]} ({lt[1]}), a layer "
                           f"above it")
    return out


def cycles(graph: dict, files: dict) -> list:
    """A line per circle of imports between files (one circle of each strongly connected
    group), as ``a.py -> b.py -> a.py``."""
    index, low, stack, on, groups = {}, {}, [], set(), []

    def visit(v):               # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w, _ in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    out = []
    for group in groups:
        start = min(group)
        path, seen = [start], {start}
        while True:             # walk inside the group until the walk closes on itself
            nxt = min(w for w, _ in graph[path[-1]] if w in group)
            if nxt in seen:
                path = path[path.index(nxt):] + [nxt]
                break
            path.append(nxt)
            seen.add(nxt)
        out.append(" -> ".join(files[m] for m in path))
    return out


@pytest.fixture(scope="module")
def graph():
    return edges()


@pytest.fixture(scope="module")
def files():
    return {m: path for m, (path, _) in modules().items()}


def test_every_module_has_a_layer(files):
    missing = [path for m, path in files.items() if layer_of(m) is None]
    assert not missing, f"add these to tests/test_layers.py's LAYERS: {missing}"


def test_no_import_runs_upward(graph, files):
    bad = upward(graph, files)
    assert not bad, "imports that run upward (docs/pipeline.md, Layers):\n" + "\n".join(bad)


def test_no_import_cycle(graph, files):
    bad = cycles(graph, files)
    assert not bad, "import cycles between files:\n" + "\n".join(bad)


def test_the_checks_see_what_they_must():
    """An upward import and a circle planted in a small graph are both reported, by name."""
    files = {m: m.replace(".", "/") + ".py" for m in
             ("inductor_gqa.kernels.flash", "inductor_gqa.graph_pass", "perf.models",
              "perf.train")}
    graph = {"inductor_gqa.kernels.flash": [("inductor_gqa.graph_pass", 3)],
             "inductor_gqa.graph_pass": [], "perf.models": [("perf.train", 5)],
             "perf.train": [("perf.models", 7)]}
    assert upward(graph, files) == [
        "inductor_gqa/kernels/flash.py:3 (kernels, options) imports inductor_gqa/graph_pass.py "
        "(orchestration), a layer above it"]
    assert cycles(graph, files) == ["perf/models.py -> perf/train.py -> perf/models.py"]
