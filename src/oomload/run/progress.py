"""The live view of a replay (rich): one line per step, and on a terminal a panel refreshed every
second.

When a step ends — with or without the panel (``--no-live``, logs, CI) — one plain line gives that
step's own results (``step_line``, from the step's ``steps.jsonl`` end line): step, phase, target and
achieved concurrency, the requests that ended in the step by outcome, req/s over the step, its
preemptions and the highest KV-cache usage of the ``/metrics`` scrapes the step owns by the report's rule
(``oomload.verdict.runview.owns_sample``: taken after its start, up to its end line's time; the boundary
scrape read as it began is the step before's) — and, when the step did not hold its level because
oomload itself could not get a CPU, that the load generator was starved (``oomload.verdict.loadgen``).
The report's per-step KV max also counts the drain after the step's end, so it can only be higher.

The panel shows the step, target and achieved concurrency, requests/s and tokens/s since the last
refresh, outcomes since the start of the run, and the server's side: KV-cache usage, preemptions since
the start, running/waiting requests, GPU memory.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from oomload.rundir.loadgenrecord import parse_loadgen
from oomload.verdict import kv_percent
from oomload.verdict.loadgen import live_held, starvation
from oomload.verdict.rates import per_second
from oomload.verdict.runview import owns_sample
from oomload.verdict.stepfacts import ACHIEVED_CONCURRENCY_MIN_SHARE


class ProgressView:
    """Reads the session's context, poller and GPU sampler; never blocks the load."""

    def __init__(self, session: Any, console: Console, *, live: bool = True) -> None:
        self.session = session
        self.console = console
        self.want_live = live
        self.live: Live | None = None
        self._last = (time.time(), 0, 0)
        self._started = time.time()
        self._step_start_s = math.inf  # the current step's start (none yet: no scrape is a step's)
        self._kv_peaks: list[tuple[float, float]] = []  # the step's running KV maximum: (time, usage)

    def start(self) -> None:
        if self.want_live and self.console.is_terminal:
            self.live = Live(self._render(), console=self.console, refresh_per_second=2, transient=True)
            self.live.start()

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    def step(self, step: Any) -> None:
        """A step starts (the driver has its start time): its KV maximum starts afresh."""
        del step
        driver = self.session.driver
        started = None if driver is None else driver.step_started_unix_s
        self._step_start_s = time.time() if started is None else started
        self._kv_peaks = []

    def sample(self) -> None:
        """Note the server's KV-cache usage (called by the monitor several times a second): the latest
        scrape, when taken after the step's start (the boundary scrape that opened it is not its own)."""
        latest = self.session.poller.latest if self.session.poller is not None else None
        kv = latest.get("kv_cache_usage") if latest else None
        t = latest.get("t_unix_s") if latest else None
        if not (isinstance(kv, int | float) and isinstance(t, int | float)):
            return
        if not owns_sample((self._step_start_s, math.inf), t):  # the step before's (or no step's)
            return
        if not self._kv_peaks or (t > self._kv_peaks[-1][0] and kv > self._kv_peaks[-1][1]):
            self._kv_peaks.append((float(t), float(kv)))

    def kv_max(self, end_unix_s: float) -> float | None:
        """The highest KV usage of the scrapes seen that the step owns when it ends at ``end_unix_s``
        (a scrape that came in after its end line's time is the next step's)."""
        window = (self._step_start_s, end_unix_s)
        return next((kv for t, kv in reversed(self._kv_peaks) if owns_sample(window, t)), None)

    def step_ended(self, line: Mapping[str, Any]) -> None:
        """Print the step's own results (its ``steps.jsonl`` end line) as one plain line."""
        self.sample()
        end = line.get("t_unix_s")
        kv = self.kv_max(float(end) if isinstance(end, int | float) else time.time())
        self.console.print(step_line(line, time.time() - self._started, kv), highlight=False, soft_wrap=True)

    def refresh(self) -> None:
        if self.live is not None:
            self.live.update(self._render())

    def _rates(self) -> tuple[float, float]:
        ctx = self.session.context
        now = time.time()
        done = sum(ctx.outcomes.values()) if ctx is not None else 0
        tokens = ctx.completion_tokens if ctx is not None else 0
        t0, d0, k0 = self._last
        self._last = (now, done, tokens)
        dt = max(1e-6, now - t0)
        return (done - d0) / dt, (tokens - k0) / dt

    def _summary(self) -> str:
        ctx = self.session.context
        if ctx is None:
            return ""
        outcomes = ", ".join(
            f"{o.value} {n}" for o, n in sorted(ctx.outcomes.items(), key=lambda kv: kv[0].value)
        )
        return outcomes or "no request finished yet"

    def _render(self) -> Table:
        s = self.session
        ctx = s.context
        driver = s.driver
        step = driver.current if driver is not None else None
        req_s, tok_s = self._rates()
        table = Table(
            title=f"oomload replay · {s.url}{' (SIMULATED)' if s.simulated else ''}", show_header=False
        )
        table.add_column("what", style="bold")
        table.add_column("value")
        if step is not None:
            achieved = ctx.achieved_concurrency() if ctx is not None else float("nan")
            draining = getattr(driver, "draining_to", None)
            after = "" if draining is None else f" · draining to concurrency {draining.concurrency}"
            table.add_row("step", f"{step.index} ({step.phase}){after}")
            table.add_row("concurrency", f"target {step.concurrency} · achieved {achieved:.1f}")
        table.add_row("throughput", f"{req_s:.1f} req/s · {tok_s:.0f} tokens/s")
        table.add_row("outcomes (run)", self._summary())
        latest = s.poller.latest if s.poller is not None else None
        if latest:
            kv = latest.get("kv_cache_usage")
            base = s.baseline_preemptions or 0
            pre = latest.get("num_preemptions_total")
            table.add_row(
                "server",
                f"KV {'?' if kv is None else kv_percent(kv)} · preemptions "
                f"{'?' if pre is None else pre - base} · running {latest.get('num_requests_running')} · "
                f"waiting {latest.get('num_requests_waiting')}",
            )
        gpu = s.gpu.latest() if s.gpu is not None else None
        if gpu and gpu.get("used_bytes") is not None and gpu.get("total_bytes"):
            table.add_row(
                "GPU memory", f"{gpu['used_bytes'] / 2**30:.1f} / {gpu['total_bytes'] / 2**30:.1f} GiB"
            )
        host = s.latest_server_memory()
        if host is not None and host.used_bytes is not None:
            limit = "" if host.cgroup_limit_bytes is None else f" / {host.cgroup_limit_bytes / 2**30:.1f}"
            kills = f" · OOM kills {host.cgroup_oom_kill}" if host.cgroup_oom_kill else ""
            table.add_row("server memory", f"{host.used_bytes / 2**30:.2f}{limit} GiB{kills}")
        if s.dead_evidence:
            table.add_row("server dead", s.dead_evidence)
        return table


def step_line(line: Mapping[str, Any], elapsed_s: float, kv_max: float | None) -> str:
    """``  12.0s step 3 ramp   concurrency 8 (achieved 7.9) · ok 12, context_overflow 1 · 3.00 req/s ·
    preemptions 0 · KV max 81% · hold_done``: one step's own results."""
    outcomes = line.get("ended_outcomes") or {}
    ended = ", ".join(f"{name} {n}" for name, n in sorted(outcomes.items())) or "none ended"
    per_s = per_second(int(line.get("ended") or 0), float(line.get("duration_s") or 0.0))
    rate = "? req/s" if per_s is None else f"{per_s:.2f} req/s"
    achieved = line.get("achieved_concurrency_mean")
    held = "" if achieved is None else f" (achieved {float(achieved):.1f})"
    preemptions = line.get("preemptions")
    kv = "?" if kv_max is None else kv_percent(kv_max)
    started = line.get("started")
    sent = "" if started is None else f" · sent {started}"
    return (
        f"{elapsed_s:7.1f}s step {line.get('step')} {line.get('phase', ''):<6} concurrency "
        f"{line.get('concurrency')}{held}{sent} · ended: {ended} · {rate} · preemptions "
        f"{'?' if preemptions is None else preemptions} · KV max {kv} · {line.get('reason')}"
        f"{_starved(line)}"
    )


def _starved(line: Mapping[str, Any]) -> str:
    """`` · the load generator was starved (waited 93 % of the step for a CPU; …)`` or nothing; the
    live line reads the client's own in-flight mean (vLLM's raw mean over one step reads low from edge
    effects: the demo's held steps showed it, docs/report.md, "load delivered")."""
    achieved = line.get("achieved_concurrency_mean")
    held = live_held(
        int(line.get("concurrency") or 0),
        float(achieved) if isinstance(achieved, int | float) else None,
        min_share=ACHIEVED_CONCURRENCY_MIN_SHARE,
    )
    found = starvation(held, parse_loadgen(line.get("loadgen")))
    return "" if found is None else f" · the load generator was starved ({found.text}): {found.advice}"
