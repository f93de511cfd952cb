"""The reference client: a minimal asyncio + aiohttp closed loop, the yardstick for delivered load.

``concurrency`` workers each send one streaming ``/v1/completions`` request at a time, on a fresh
connection per request (``force_close``, like oomload), with a prompt of random token ids in
oomload's default range and ``max_tokens = min_tokens = O`` plus ``ignore_eos`` (oomload's exact
lengths), and read the SSE stream to its end. No statistics beyond a time-weighted in-flight mean:
its job is to put the load on the server with as little client machinery as possible.

``python -m bench.refclient URL --concurrency C --duration-s S --prompt P --output O`` prints one
JSON line: ``{"held": mean in flight, "completed": n, "errors": n}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time

import aiohttp


async def run(
    url: str, model: str, concurrency: int, duration_s: float, prompt: int, output: int, seed: int = 7
) -> dict[str, float]:
    rng = random.Random(seed)
    in_flight = 0
    area = 0.0
    last = time.monotonic()
    start = last
    end = start + duration_s
    completed = errors = 0

    def mark(delta: int) -> None:
        nonlocal in_flight, area, last
        now = time.monotonic()
        area += in_flight * (now - last)
        last, in_flight = now, in_flight + delta

    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            nonlocal completed, errors
            while time.monotonic() < end:
                body = {
                    "model": model,
                    "prompt": [rng.randrange(100, 2000) for _ in range(prompt)],
                    "max_tokens": output,
                    "min_tokens": output,
                    "ignore_eos": True,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                mark(+1)
                try:
                    async with session.post(f"{url}/v1/completions", json=body) as resp:
                        async for _ in resp.content:
                            pass
                        ok = resp.status == 200
                except aiohttp.ClientError:
                    ok = False
                mark(-1)
                completed += ok
                errors += not ok

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    mark(0)
    return {"held": round(area / (last - start), 3), "completed": completed, "errors": errors}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.refclient")
    p.add_argument("url")
    p.add_argument("--model", default="tiny-model")
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--duration-s", type=float, required=True)
    p.add_argument("--prompt", type=int, default=200)
    p.add_argument("--output", type=int, default=200)
    a = p.parse_args(argv)
    result = asyncio.run(run(a.url.rstrip("/"), a.model, a.concurrency, a.duration_s, a.prompt, a.output))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
