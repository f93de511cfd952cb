"""report.html opens in a real headless Chromium and its plots decode (not just present as base64).

Needs the OS package ``chromium`` (Debian/Ubuntu: ``apt-get install -y chromium``). Its absence is a
test FAILURE with that instruction, never a silent skip.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from oomload.report import finalize_run
from runbuilder import CPU_CACHE, cpu_knee_steps, write_run

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.fail(
        "Chromium is not installed: the report.html browser test needs it. "
        "Install the OS package: `apt-get install -y chromium` (Debian/Ubuntu)."
    )


def test_report_html_plots_decode_in_headless_chromium(tmp_path: Path) -> None:
    browser = find_chromium()
    run = write_run(tmp_path / "run", cpu_knee_steps(), cache_config=CPU_CACHE)
    finalize_run(run, formats=("html",), terminal=False)
    page = run / "report.html"
    proc = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--window-size=1280,2000",
            "--virtual-time-budget=5000",
            "--dump-dom",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    dom = proc.stdout
    assert proc.returncode == 0, f"chromium exited {proc.returncode}: {proc.stderr[-2000:]}"
    assert 'data-plots-checked="1"' in dom, "the page's load handler never ran"
    widths = {
        m.group(1): int(m.group(2))
        for m in re.finditer(r'<img[^>]*id="plot-([a-z-]+)"[^>]*data-decoded-width="(\d+)"', dom)
    }
    if not widths:  # attribute order differs between browser versions
        widths = {
            m.group(2): int(m.group(1))
            for m in re.finditer(r'<img[^>]*data-decoded-width="(\d+)"[^>]*id="plot-([a-z-]+)"', dom)
        }
    assert set(widths) == {"timeline", "by-concurrency", "lengths"}
    # 11-inch figures at 96 dpi decode to 1056 px wide
    assert all(w == 1056 for w in widths.values()), widths
