"""Run every ``bench/bench_*.py`` (or those whose name contains one of the arguments)."""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    here = Path(__file__).resolve().parent
    sys.path.insert(0, str(here.parent))
    names = sorted(p.stem for p in here.glob("bench_*.py"))
    chosen = [n for n in names if not argv or any(a in n for a in argv)]
    for name in chosen:
        print(f"\n=== {name} ===", flush=True)
        start = time.perf_counter()
        module = importlib.import_module(f"bench.{name}")
        module.main()
        print(f"({name}: {time.perf_counter() - start:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
