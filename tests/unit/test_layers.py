"""Imports point one way, folder by folder: the stages of the pipeline stand on what is below them.

Each folder (package) of ``src/oomload`` is one floor of the house, and a module may import its own
folder and the folders on lower floors, never a higher one:

====  ==========================================  =================================================
 0    ``oomload`` (top-level modules)             what every stage uses: errors, outcomes, writes
 1    ``trace``                                   the trace: model, chains, stats, synthesis
 2    ``capacity``                                the KV pool's arithmetic, the shared scheduler model,
                                                  the odds, the step schedule
 3    ``ingest``, ``telemetry``, ``rundir``,       I/O adapters: logs in, samples, the run directory,
      ``sim``, ``realvllm``, ``load``             the simulated and the real vLLM, the HTTP client
 4    ``verdict``                                 what a run directory means (pure)
 5    ``tune``                                    the tuner's search and proofs
 6    ``report``                                  what is shown: terminal, Markdown, HTML, JSON, plots
 7    ``run``                                     one run wired: Locust, samplers, the live view
 8    ``cli``                                     the commands
 9    ``oomload.__main__``                        the entry point
====  ==========================================  =================================================

A new folder must be given a floor (the test fails until it is). Folders on one floor may import
each other, but no two folders may import each other in a loop (``_package_loops``). Imports are
read with ``ast`` from the source (module-level, function-level and ``TYPE_CHECKING`` imports alike:
a lazy import is still a dependency).

Three more rules of the house, each checked by a function that a test also runs on a made-up
package (so the check is shown to fail):

- no import circle: the module-level imports (those that run when the module is imported, a
  ``TYPE_CHECKING`` block included; a function-level import is the way to break a circle) form no
  cycle anywhere in ``src/oomload``;
- no module over ``MAX_LINES`` lines (one sitting's reading, one job); ``OVERSIZE_ALLOWED`` names the
  exceptions, each with why, and an entry that is no longer over the limit fails too;
- at most ``MAX_TOP_LEVEL`` modules at the top level besides ``__init__`` and ``__main__``.

Separately, the pure floors (``PURE``) and the CLI's entry module are imported in a subprocess,
which must not load Locust, gevent or NVML (Locust monkey-patches the whole process with gevent).
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

FLOORS = {
    "oomload": 0,
    "oomload.trace": 1,
    "oomload.capacity": 2,
    "oomload.ingest": 3,
    "oomload.telemetry": 3,
    "oomload.rundir": 3,
    "oomload.sim": 3,
    "oomload.realvllm": 3,
    "oomload.load": 3,
    "oomload.verdict": 4,
    "oomload.tune": 5,
    "oomload.report": 6,
    "oomload.run": 7,
    "oomload.cli": 8,
}
ENTRY = "oomload.__main__"
ENTRY_FLOOR = 9
# Folders that must stay light: importing every module of them loads no Locust, gevent or NVML.
PURE = ("oomload", "oomload.trace", "oomload.capacity", "oomload.verdict", "oomload.tune")
FORBIDDEN = ["locust", "gevent", "pynvml", "geventhttpclient"]
MAX_LINES = 600
MAX_TOP_LEVEL = 5
# Modules over MAX_LINES today: module → why it is tolerated for now.
OVERSIZE_ALLOWED: dict[str, str] = {}


def test_every_folder_has_a_floor() -> None:
    folders = {_folder(m) for m in _modules()} - {ENTRY}
    assert sorted(folders - set(FLOORS)) == [], "new folders: give them a floor in FLOORS"
    assert sorted(set(FLOORS) - folders) == [], "FLOORS names folders that no longer exist"


def test_imports_point_down_the_floors() -> None:
    up = _imports_up(SRC)
    assert up == [], "imports that run back up: " + ", ".join(f"{a} → {b}" for a, b in up)


def test_no_loop_of_folders() -> None:
    loops = _package_loops(SRC)
    assert loops == [], "folders that import each other: " + "; ".join(" ↔ ".join(c) for c in loops)


def test_the_floor_checks_see_an_arrow_back_up_and_a_loop(tmp_path: Path) -> None:
    pkg = tmp_path / "oomload"
    for folder in ("trace", "run", "sim", "load"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "trace" / "a.py").write_text("def f():\n    from oomload.run import b\n")  # lazy, still up
    (pkg / "run" / "b.py").write_text("from oomload.trace import a\n")  # down: fine
    (pkg / "sim" / "c.py").write_text("from oomload.load import d\n")
    (pkg / "load" / "d.py").write_text("from oomload.sim.c import X\n")
    assert _imports_up(tmp_path) == [("oomload.trace.a", "oomload.run"), ("oomload.trace.a", "oomload.run.b")]
    assert _package_loops(tmp_path) == [["oomload.load", "oomload.sim"], ["oomload.run", "oomload.trace"]]


def test_top_level_keeps_only_what_every_stage_uses() -> None:
    top = sorted(m for m in _modules() if _folder(m) == "oomload" and m not in ("oomload", ENTRY))
    assert len(top) <= MAX_TOP_LEVEL, f"{len(top)} top-level modules (at most {MAX_TOP_LEVEL}): {top}"


def test_the_layer_check_sees_function_level_and_relative_imports() -> None:
    source = "import os\ndef f():\n    from oomload.run import runner\n    from . import sibling\n"
    tree = ast.parse(source)
    assert _imports_of(tree, "oomload.x.mod", is_package=False) == {
        "oomload.run",
        "oomload.run.runner",
        "oomload.x",
        "oomload.x.sibling",
    }


def test_no_import_circle() -> None:
    circles = _circles(_module_level_graph(SRC))
    assert circles == [], "import circles (module-level imports): " + "; ".join(
        " → ".join(c) for c in circles
    )


def test_no_module_over_the_size_limit() -> None:
    over = _oversized(SRC)
    unexplained = sorted(set(over) - set(OVERSIZE_ALLOWED))
    assert unexplained == [], "modules over {} lines (split them): {}".format(
        MAX_LINES, ", ".join(f"{m} ({over[m]})" for m in unexplained)
    )
    stale = sorted(set(OVERSIZE_ALLOWED) - set(over))
    assert stale == [], f"OVERSIZE_ALLOWED entries no longer over {MAX_LINES} lines (remove them): {stale}"


def test_the_checks_see_a_circle_and_an_oversized_module(tmp_path: Path) -> None:
    pkg = tmp_path / "oomload"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from oomload.sub import b\n")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import X\n"
    )
    (pkg / "sub" / "c.py").write_text("import oomload.a\n" + "x = 1\n" * MAX_LINES)
    (pkg / "d.py").write_text("def f():\n    from oomload import a\n")  # function level: no edge
    (pkg / "e.py").write_text("from oomload import d\n")
    assert _circles(_module_level_graph(tmp_path)) == [["oomload.a", "oomload.sub.b", "oomload.sub.c"]]
    assert _oversized(tmp_path) == {"oomload.sub.c": MAX_LINES + 1}


def test_pure_floors_do_not_import_locust_gevent_or_nvml() -> None:
    light = [*sorted(m for m in _modules() if _folder(m) in PURE and m != ENTRY), "oomload.cli"]
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in light)
        + f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]\n"
        + "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"pure modules pulled in: {out.stdout.strip()}"


@functools.cache
def _modules(src: Path = SRC) -> dict[str, Path]:
    """Every module under ``src/oomload``: dotted name → file."""
    modules = {}
    for path in sorted((src / "oomload").rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _imports(module: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return _imports_of(tree, module, is_package=path.name == "__init__.py")


def _imports_of(tree: ast.AST, module: str, *, is_package: bool) -> set[str]:
    """The ``oomload`` modules a module's source names in ``import`` statements, at any depth.

    ``from package import name`` yields both ``package`` and ``package.name`` (the name may be a
    submodule); ``_owner`` later drops what is not a module.
    """
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names)
    return {n for n in names if n == "oomload" or n.startswith("oomload.")}


def _owner(name: str, layer_of: Mapping[str, object]) -> str | None:
    """The module ``name`` refers to: itself, or for ``package.attribute`` the package."""
    if name in layer_of:
        return name
    parent = name.rpartition(".")[0]
    return parent if parent in layer_of else None


def _module_level_graph(src: Path) -> dict[str, set[str]]:
    """module → the ``oomload`` modules its module-level imports load (statements at the top, in
    ``if``/``try`` blocks included; not those inside functions or classes)."""
    modules = _modules(src)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: set[str] = set()
        for node in _top_level_imports(tree.body):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name in modules)
                continue
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:  # ``from package import sub`` loads sub; a name loads package
                name = f"{source}.{alias.name}"
                targets.add(name if name in modules else source)
        graph[module] = {t for t in targets if t in modules and t != module}
    return graph


def _top_level_imports(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If):
            found += _top_level_imports(node.body) + _top_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            found += _top_level_imports(node.body + node.orelse + node.finalbody)
            for handler in node.handlers:
                found += _top_level_imports(handler.body)
    return found


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: each strongly connected set of two or more modules, sorted (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _oversized(src: Path) -> dict[str, int]:
    """module → its line count, for the modules over ``MAX_LINES``."""
    counts = {m: len(p.read_text(encoding="utf-8").splitlines()) for m, p in _modules(src).items()}
    return {m: n for m, n in counts.items() if n > MAX_LINES}


def _folder(module: str, src: Path = SRC) -> str:
    """The folder (package) a module lives in: ``oomload.trace.model`` → ``oomload.trace``; a
    package's own ``__init__`` is in itself; a top-level module is in ``oomload``; the entry point
    stands alone."""
    if module == ENTRY or _modules(src)[module].name == "__init__.py":
        return module
    return module.rpartition(".")[0] or module


def _floor(module: str, src: Path) -> int:
    return {**FLOORS, ENTRY: ENTRY_FLOOR}.get(_folder(module, src), -1)


def _edges(src: Path) -> set[tuple[str, str]]:
    """(importer, imported module) for every ``oomload`` import in the tree, at any depth."""
    modules = _modules(src)
    edges = set()
    for module, path in modules.items():
        for imported in _imports(module, path):
            target = _owner(imported, modules)
            if target is not None and target != module:
                edges.add((module, target))
    return edges


def _imports_up(src: Path) -> list[tuple[str, str]]:
    """Imports from a module to one on a higher floor, sorted."""
    return sorted((a, b) for a, b in _edges(src) if _floor(a, src) < _floor(b, src))


def _package_loops(src: Path) -> list[list[str]]:
    """Folders that import each other, directly or around a loop (the circles of the folder graph;
    the top level and its subfolders are one folder each)."""
    graph: dict[str, set[str]] = {}
    for a, b in _edges(src):
        fa, fb = _folder(a, src), _folder(b, src)
        graph.setdefault(fa, set())
        graph.setdefault(fb, set())
        if fa != fb:
            graph[fa].add(fb)
    return _circles(graph)


def test_every_package_docstring_names_its_modules() -> None:
    missing = _unnamed_modules(SRC)
    assert missing == [], "package docstrings that do not name a module of theirs: " + ", ".join(missing)


def test_the_docstring_check_sees_an_unnamed_module(tmp_path: Path) -> None:
    pkg = tmp_path / "oomload" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "oomload" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text('"""The sub: ``a`` does one thing."""\n')
    (pkg / "a.py").write_text("")
    (pkg / "b.py").write_text("")
    assert _unnamed_modules(tmp_path) == ["oomload.sub.b"]


def _unnamed_modules(src: Path) -> list[str]:
    """Modules of a subpackage that its ``__init__`` docstring does not name (as ````name```` or by
    its dotted path), sorted."""
    missing = []
    for init in sorted((src / "oomload").glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        package = "oomload." + init.parent.name
        for path in sorted(init.parent.glob("*.py")):
            name = path.stem
            if name != "__init__" and f"``{name}``" not in doc and f"{package}.{name}" not in doc:
                missing.append(f"{package}.{name}")
    return missing
