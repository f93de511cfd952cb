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
    "oomload.stats",
    "oomload.synth",
    "oomload.capacity",
    "oomload.odds",
    "oomload.schedule",
    "oomload.serverside",
    "oomload.credentials",
    "oomload.startup",
    "oomload.tunesearch",
    "oomload.tunerecord",
    "oomload.servecmd",
    "oomload.rundir.records",
    "oomload.verdict",
    "oomload.verdict.runview",
    "oomload.verdict.gauges",
    "oomload.verdict.stepfacts",
    "oomload.verdict.death",
    "oomload.verdict.confidence",
    "oomload.verdict.prediction",
    "oomload.verdict.prefixrate",
    "oomload.verdict.verdict",
    "oomload.verdict.recommend",
    "oomload.verdict.gate",
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
    "oomload.telemetry.gpu_sample",
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
    "oomload.load.shape",
    "oomload.load.user",
    "oomload.load.wire",
    "oomload.realvllm",
    "oomload.realvllm.install",
    "oomload.realvllm.launcher",
    "oomload.realvllm.server",
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
    "oomload.sim.metrics",
    "oomload.sim.process",
    "oomload.sim.server",
    "oomload.telemetry",
    "oomload.telemetry.dcgm",
    "oomload.telemetry.fake_nvml",
    "oomload.telemetry.gpu",
    "oomload.telemetry.nvml",
    "oomload.telemetry.poller",
    "oomload.telemetry.sampler",
    "oomload.telemetry.scrape",
    "oomload.tracereport",
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
    "oomload.run.config",
    "oomload.run.locustfile",
    "oomload.run.oddsfeed",
    "oomload.run.runner",
    "oomload.run.scenario",
    "oomload.run.session",
    "oomload.run.worker",
    "oomload.run.workers",
    "oomload.tunerun",
}
CLI = {
    "oomload.cli",
    "oomload.cli.crash",
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


def _modules() -> dict[str, Path]:
    """Every module under ``src/oomload``: dotted name → file."""
    modules = {}
    for path in sorted((SRC / "oomload").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
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
