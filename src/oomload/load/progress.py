"""The live view of a replay (rich): one panel refreshed every second on a terminal, one line per
step otherwise (logs, CI).

Shows the step (index, phase), target and achieved concurrency, requests/s and tokens/s since the
last refresh, outcomes so far, and the server's side: KV-cache usage, preemptions since the start,
running/waiting requests, GPU memory.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table


class ProgressView:
    """Reads the session's context, poller and GPU sampler; never blocks the load."""

    def __init__(self, session: Any, console: Console) -> None:
        self.session = session
        self.console = console
        self.live: Live | None = None
        self._last = (time.time(), 0, 0)
        self._started = time.time()

    def start(self) -> None:
        if self.console.is_terminal:
            self.live = Live(self._render(), console=self.console, refresh_per_second=2, transient=True)
            self.live.start()

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    def step(self, step: Any) -> None:
        if self.live is None:
            self.console.print(
                f"[dim]{time.time() - self._started:6.1f}s[/] step {step.index} {step.phase:<6} "
                f"concurrency {step.concurrency:>4}  {self._summary()}"
            )

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
            table.add_row("step", f"{step.index} ({step.phase})")
            table.add_row("concurrency", f"target {step.concurrency} · achieved {achieved:.1f}")
        table.add_row("throughput", f"{req_s:.1f} req/s · {tok_s:.0f} tokens/s")
        table.add_row("outcomes", self._summary())
        latest = s.poller.latest if s.poller is not None else None
        if latest:
            kv = latest.get("kv_cache_usage")
            base = s._baseline_preemptions or 0
            pre = latest.get("num_preemptions_total")
            table.add_row(
                "server",
                f"KV {'?' if kv is None else f'{kv * 100:.0f}%'} · preemptions "
                f"{'?' if pre is None else pre - base} · running {latest.get('num_requests_running')} · "
                f"waiting {latest.get('num_requests_waiting')}",
            )
        gpu = s.gpu.latest() if s.gpu is not None else None
        if gpu and gpu.get("used_bytes") is not None and gpu.get("total_bytes"):
            table.add_row(
                "GPU memory", f"{gpu['used_bytes'] / 2**30:.1f} / {gpu['total_bytes'] / 2**30:.1f} GiB"
            )
        if s.dead_evidence:
            table.add_row("server dead", s.dead_evidence)
        return table
