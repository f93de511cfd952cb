"""Imports point one way: pure core → I/O adapters → runner → CLI (see ``oomload/__init__.py``).

Every module under ``src/oomload`` is named in exactly one layer below, so a new module must be
placed, and a renamed or removed one fails the test until the list follows. Imports are read with
``ast`` from the source (module-level, function-level and ``TYPE_CHECKING`` imports alike: a lazy
import is still a dependency). The rules:

- a core module imports core modules only;
- an adapter never imports the runner or the CLI;
- the runner never imports the CLI;
- nothing but ``oomload.__main__`` (and the CLI's own modules) imports the CLI.

``ALLOWED`` lists the edges that break a rule today, each with why; an entry that no longer breaks
a rule fails the test too, so the list only shrinks.

Separately, the core and the CLI's entry module are imported in a subprocess, which must not load
Locust, gevent or NVML (Locust monkey-patches the whole process with gevent).

Two more rules of the house, each checked by a function that a test also runs on a made-up package
(so the check is shown to fail):

- no import circle: the module-level imports (those that run when the module is imported, a
  ``TYPE_CHECKING`` block included; a function-level import is the way to break a circle) form no
  cycle anywhere in ``src/oomload``;
- no module over ``MAX_LINES`` lines (one sitting's reading, one job); ``OVERSIZE_ALLOWED`` names the
  exceptions, each with why, and an entry that is no longer over the limit fails too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# Pure: no network, no Locust/gevent/NVML, deterministic given their inputs.
CORE = {
    "oomload",
    "oomload.errors",
    "oomload.outcome",
    "oomload.trace",
    "oomload.prefix",
    "oomload.blockhash",
    "oomload.stats",
    "oomload.synth",
    "oomload.capacity",
    "oomload.odds",
    "oomload.schedule",
    "oomload.serverside",
    "oomload.credentials",
    "oomload.tune",
    "oomload.tune.startup",
    "oomload.tune.search",
    "oomload.tune.record",
    "oomload.tune.servecmd",
    "oomload.tune.rate",
    "oomload.tune.context",
    "oomload.rundir.records",
    "oomload.rundir.loadgenrecord",
    "oomload.verdict",
    "oomload.verdict.runview",
    "oomload.verdict.gauges",
    "oomload.verdict.stepfacts",
    "oomload.verdict.loadgen",
    "oomload.verdict.death",
    "oomload.verdict.deathcause",
    "oomload.verdict.deathlog",
    "oomload.verdict.confidence",
    "oomload.verdict.prediction",
    "oomload.verdict.prefixrate",
    "oomload.verdict.levels",
    "oomload.verdict.runinfo",
    "oomload.verdict.verdict",
    "oomload.verdict.servermem",
    "oomload.verdict.recommend",
    "oomload.verdict.gate",
    "oomload.verdict.gatesignals",
    "oomload.verdict.trend",
    "oomload.ingest.clocks",
    "oomload.load.classify",
    "oomload.load.payload",
    "oomload.load.sse",
    "oomload.sim.build",
    "oomload.sim.geometry",
    "oomload.sim.model",
    "oomload.sim.openai_request",
    "oomload.sim.planner",
    "oomload.sim.scheduler",
    "oomload.sim.tokenizer",
    "oomload.sim.vllmlog",
    "oomload.telemetry.gpu_sample",
    "oomload.telemetry.procfs",
    "oomload.telemetry.vllm_metrics",
}
# I/O: log readers, the HTTP/SSE client and Locust pieces, samplers, the simulated and the real vLLM,
# the run directory, report renderers.
ADAPTERS = {
    "oomload.ingest",
    "oomload.ingest.arrays",
    "oomload.ingest.build",
    "oomload.ingest.columns",
    "oomload.ingest.detect",
    "oomload.ingest.heap",
    "oomload.ingest.inputs",
    "oomload.ingest.mapping",
    "oomload.ingest.mooncake",
    "oomload.ingest.openai_fast",
    "oomload.ingest.openai_log",
    "oomload.ingest.openai_parts",
    "oomload.ingest.openai_schema",
    "oomload.ingest.parallel",
    "oomload.ingest.prefixes",
    "oomload.ingest.skips",
    "oomload.ingest.source",
    "oomload.ingest.tabular",
    "oomload.ingest.tokens",
    "oomload.ingest.vllm_log",
    "oomload.ingest.workertasks",
    "oomload.ingest.writer",
    "oomload.load",
    "oomload.load.context",
    "oomload.load.http",
    "oomload.load.resultstream",
    "oomload.load.selfcheck",
    "oomload.load.shape",
    "oomload.load.user",
    "oomload.load.wire",
    "oomload.realvllm",
    "oomload.realvllm.install",
    "oomload.realvllm.launcher",
    "oomload.realvllm.server",
    "oomload.realvllm.serveline",
    "oomload.realvllm.tinymodel",
    "oomload.report",
    "oomload.report.findings",
    "oomload.report.html",
    "oomload.report.junit",
    "oomload.report.markdown",
    "oomload.report.metadata",
    "oomload.report.plots",
    "oomload.report.summary",
    "oomload.report.terminal",
    "oomload.report.tune",
    "oomload.rundir",
    "oomload.rundir.io",
    "oomload.sim",
    "oomload.sim.engine",
    "oomload.sim.hostmem",
    "oomload.sim.metrics",
    "oomload.sim.process",
    "oomload.sim.server",
    "oomload.telemetry",
    "oomload.telemetry.dcgm",
    "oomload.telemetry.fake_nvml",
    "oomload.telemetry.gpu",
    "oomload.telemetry.hostmem",
    "oomload.telemetry.hostsampler",
    "oomload.telemetry.nvml",
    "oomload.telemetry.poller",
    "oomload.telemetry.sampler",
    "oomload.telemetry.scrape",
    "oomload.telemetry.serverlog",
    "oomload.tracereport",
    "oomload.outfile",
}
# Wires one run (``oomload.run``): its configuration, preflight, the Locust scenario and session, the
# death watch, the live view and web UI, the reproduction, worker processes.
RUNNER = {
    "oomload.run",
    "oomload.run.deathwatch",
    "oomload.run.livefeed",
    "oomload.run.preflight",
    "oomload.run.progress",
    "oomload.run.repro",
    "oomload.run.webui",
    "oomload.run.snapshot",
    "oomload.run.config",
    "oomload.run.locustfile",
    "oomload.run.oddsfeed",
    "oomload.run.runner",
    "oomload.run.scenario",
    "oomload.run.session",
    "oomload.run.served",
    "oomload.run.serverwatch",
    "oomload.run.master_gate",
    "oomload.run.master_meter",
    "oomload.run.worker_node",
    "oomload.run.worker_pool",
    "oomload.tune.run",
    "oomload.tune.prove",
}
CLI = {
    "oomload.cli",
    "oomload.cli.crash",
    "oomload.cli.flags",
    "oomload.cli.plan",
    "oomload.cli.replay",
    "oomload.cli.report",
    "oomload.cli.sample",
    "oomload.cli.sim",
    "oomload.cli.worker",
    "oomload.cli.trace",
    "oomload.cli.tune",
}
ENTRY = {"oomload.__main__"}
LAYERS = {"core": CORE, "adapter": ADAPTERS, "runner": RUNNER, "cli": CLI, "entry": ENTRY}
# What each layer may import (its own layer included).
MAY_IMPORT = {
    "core": {"core"},
    "adapter": {"core", "adapter"},
    "runner": {"core", "adapter", "runner"},
    "cli": {"core", "adapter", "runner", "cli"},
    "entry": {"cli"},
}
# Edges that break a rule today: (importer, imported) → why it is tolerated for now.
ALLOWED = {
    # ``runview.load_run`` reads a run directory through ``RunReader``; the rest of runview (and every
    # core module that uses it) only sees the parsed records. Moving the reading next to ``rundir``
    # belongs to the typed run-directory records (#13 item 1).
    ("oomload.verdict.runview", "oomload.rundir"): "load_run reads the run directory",
}
FORBIDDEN = ["locust", "gevent", "pynvml", "geventhttpclient"]
MAX_LINES = 600
# Modules over MAX_LINES today: module → why it is tolerated for now.
OVERSIZE_ALLOWED: dict[str, str] = {}


def test_every_module_is_in_exactly_one_layer() -> None:
    found = set(_modules())
    listed = [m for layer in LAYERS.values() for m in layer]
    assert len(listed) == len(set(listed)), "a module is listed in two layers"
    assert sorted(found - set(listed)) == [], "new modules: place them in a layer"
    assert sorted(set(listed) - found) == [], "listed modules that no longer exist: update the layers"


def test_imports_point_down_the_layers() -> None:
    layer_of = {m: name for name, layer in LAYERS.items() for m in layer}
    broken = set()
    for module, path in _modules().items():
        for imported in _imports(module, path):
            target = _owner(imported, layer_of)
            if target is None or target == module:
                continue
            if layer_of[target] not in MAY_IMPORT[layer_of[module]]:
                broken.add((module, target))
    unexplained = sorted(broken - set(ALLOWED))
    assert unexplained == [], "imports against the layers: " + ", ".join(f"{a} → {b}" for a, b in unexplained)
    stale = sorted(set(ALLOWED) - broken)
    assert stale == [], f"ALLOWED entries that no longer break a rule (remove them): {stale}"


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


def test_core_does_not_import_locust_gevent_or_nvml() -> None:
    light = sorted(CORE | {"oomload.cli"})
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in light)
        + f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]\n"
        + "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"core modules pulled in: {out.stdout.strip()}"


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


def _owner(name: str, layer_of: dict[str, str]) -> str | None:
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
