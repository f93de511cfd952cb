"""``make gpu-check``: on a machine with an NVIDIA GPU, prove the sampler sees a known allocation.

Steps (exit 0 = PASS, 1 = FAIL, 2 = cannot run here: no GPU, no driver, no PyTorch):

1. Create the CUDA context with PyTorch and warm up the fill kernel, so neither shows up later.
2. Start the real sampler path — ``GpuSamplerProcess`` → ``oomload sample`` child → ``gpu.jsonl`` —
   at 20 Hz on the NVML device that is PyTorch's device (matched by UUID).
3. Baseline: median ``used_bytes`` of the samples over ``--settle-s``.
4. Allocate ``--gib`` GiB with ``torch.empty(…, dtype=uint8).fill_(1)``; median of the samples taken
   after it must be baseline + that amount ± ``--tolerance-mib``. This process (by PID; in a
   container, NVML reports host PIDs, so the process whose memory rose by that amount) must be in
   the per-process list with at least the allocation — unless NVML cannot list processes here (MIG).
5. Free it (``del`` + ``torch.cuda.empty_cache()``); the median must be back at the baseline ± the
   tolerance.

Other processes allocating on the same GPU during the check make it fail: run it on an idle GPU.

Then, when vLLM (the GPU build) is installed and ``--tune-model`` names a small model that is on this
machine (a local folder or a cached Hugging Face id; nothing is downloaded), ``oomload tune`` tunes its
``gpu_memory_utilization`` on this device while this process holds ``--tune-hold-gib`` (default: 15 %
of the device) — memory "used by other processes", as vLLM sees it:

6. the ladder ``0.95, 0.9, 0.8, 0.7, 0.6`` starts at a utilization the free memory cannot give, so the
   first candidate must fail at start-up and be classified ``free_memory`` from vLLM's own log
   ("Free memory on device … is less than desired GPU memory utilization");
7. a later candidate must start, with its KV blocks read from ``/metrics`` and the free device memory
   (NVML) recorded before its start; ``tune.json`` must say ``finished`` (a winner or none: both are
   findings on an unknown model, printed);
8. no vLLM process may be left on the device afterwards (the tune stops each server's process group).

Without vLLM or ``--tune-model`` the tune check is skipped with one line saying why. It has never run
in this repository's CI (no GPU there): run it when a GPU is lent, and report what it printed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MIB = 1024 * 1024
GIB = 1024 * MIB


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def evaluate(
    baseline: Sequence[dict[str, Any]],
    allocated: Sequence[dict[str, Any]],
    freed: Sequence[dict[str, Any]],
    *,
    alloc_bytes: int,
    tolerance_bytes: int,
    pid: int,
) -> list[Check]:
    """The checks, from the ``gpu.jsonl`` lines of one device before, during and after the allocation."""
    if not baseline or not allocated or not freed:
        missing = [
            n for n, s in (("baseline", baseline), ("allocated", allocated), ("freed", freed)) if not s
        ]
        return [Check("samples", False, f"no samples in phase(s): {', '.join(missing)}")]
    base = _median_used(baseline)
    during = _median_used(allocated)
    after = _median_used(freed)
    rise = during - base
    checks = [
        Check(
            "rise",
            abs(rise - alloc_bytes) <= tolerance_bytes,
            f"used rose by {rise / MIB:.1f} MiB for a {alloc_bytes / MIB:.0f} MiB allocation "
            f"(baseline {base / MIB:.1f} MiB → {during / MIB:.1f} MiB, "
            f"tolerance ±{tolerance_bytes / MIB:.0f} MiB)",
        ),
        Check(
            "drop",
            abs(after - base) <= tolerance_bytes,
            f"after freeing, used is {after / MIB:.1f} MiB "
            f"({(after - base) / MIB:+.1f} MiB from the baseline)",
        ),
        _process_check(
            baseline[-1], allocated[-1], alloc_bytes=alloc_bytes, tolerance_bytes=tolerance_bytes, pid=pid
        ),
    ]
    return checks


def _median_used(lines: Sequence[dict[str, Any]]) -> int:
    return int(statistics.median(int(line["used_bytes"]) for line in lines))


def _process_check(
    before: dict[str, Any], during: dict[str, Any], *, alloc_bytes: int, tolerance_bytes: int, pid: int
) -> Check:
    processes = during.get("processes")
    if processes is None:
        return Check(
            "process", True, "NVML does not list processes on this device (MIG or container): not checked"
        )
    used_by_pid = {int(p["pid"]): p.get("used_bytes") for p in processes}
    need = alloc_bytes - tolerance_bytes
    if pid in used_by_pid:
        used = used_by_pid[pid]
        if used is None:
            return Check(
                "process", True, f"this process (PID {pid}) is listed; NVML cannot read its memory here"
            )
        detail = f"this process (PID {pid}) holds {used / MIB:.1f} MiB in the per-process list"
        return Check("process", used >= need, detail)
    before_by_pid = {int(p["pid"]): p.get("used_bytes") or 0 for p in before.get("processes") or []}
    for other, used in used_by_pid.items():
        growth = 0 if used is None else used - before_by_pid.get(other, 0)
        if growth >= need:
            return Check(
                "process",
                True,
                f"PID {pid} is not listed (PID namespace), but PID {other} grew by {growth / MIB:.1f} MiB: "
                "that is this process as the host sees it",
            )
    return Check("process", False, f"no process in the per-process list holds the allocation (PID {pid})")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpu_check", description="Check the sampler sees a known allocation."
    )
    parser.add_argument("--device", type=int, default=0, help="PyTorch CUDA device index (default 0)")
    parser.add_argument("--gib", type=float, default=2.0, help="GiB to allocate (default 2)")
    parser.add_argument("--tolerance-mib", type=float, default=64.0, help="allowed error (default 64 MiB)")
    parser.add_argument(
        "--settle-s", type=float, default=1.0, help="seconds of samples per phase (default 1)"
    )
    parser.add_argument(
        "--tune-model", help="a small local model to tune with vLLM (skip the tune without it)"
    )
    parser.add_argument("--tune-hold-gib", type=float, help="GiB this process holds during the tune (15 %%)")
    parser.add_argument("--tune-target", type=int, default=16, help="the tune's target concurrency (16)")
    parser.add_argument("--tune-max-s", type=float, default=900.0, help="the tune's wall-time bound (900)")
    args = parser.parse_args(argv)
    try:
        torch: Any = importlib.import_module("torch")  # optional: only this check needs it
    except ImportError:
        print("gpu-check: cannot run: PyTorch is not installed (it allocates the known amount of GPU memory)")
        return 2
    from oomload.errors import SamplerUnavailableError
    from oomload.telemetry.gpu import GpuSamplerProcess
    from oomload.telemetry.nvml import NvmlSampler

    probe = NvmlSampler()
    try:
        probe.open()
    except SamplerUnavailableError as err:
        print(f"gpu-check: cannot run: {err}")
        return 2
    uuids = dict(probe.uuids)
    probe.close()
    if not torch.cuda.is_available():
        print("gpu-check: cannot run: NVML sees a GPU but PyTorch has no CUDA device (CPU-only torch build?)")
        return 2
    if not 0 <= args.device < torch.cuda.device_count():
        visible = torch.cuda.device_count()
        print(f"gpu-check: cannot run: CUDA device {args.device} does not exist ({visible} visible)")
        return 2
    device = torch.device("cuda", args.device)
    nvml_index = _nvml_index(torch, args.device, uuids)
    alloc_bytes = int(args.gib * GIB)
    tolerance_bytes = int(args.tolerance_mib * MIB)

    # the CUDA context and the fill kernel come into memory now, before the baseline
    warm = torch.empty(1, dtype=torch.uint8, device=device)
    warm.fill_(1)
    torch.cuda.synchronize(device)
    with tempfile.TemporaryDirectory(prefix="oomload-gpu-check-") as tmp:
        out = Path(tmp) / "gpu.jsonl"
        sampler = GpuSamplerProcess(out, interval_s=0.05, devices=[nvml_index], required=True)
        try:
            sampler.start()
        except SamplerUnavailableError as err:
            print(f"gpu-check: cannot run: {err}")
            return 2
        try:
            time.sleep(0.3)
            baseline = _phase(out, nvml_index, args.settle_s)
            block = torch.empty(alloc_bytes, dtype=torch.uint8, device=device)
            block.fill_(1)
            torch.cuda.synchronize(device)
            time.sleep(0.2)
            allocated = _phase(out, nvml_index, args.settle_s)
            del block
            torch.cuda.empty_cache()
            torch.cuda.synchronize(device)
            time.sleep(0.2)
            freed = _phase(out, nvml_index, args.settle_s)
        finally:
            sampler.stop()
    checks = evaluate(
        baseline, allocated, freed, alloc_bytes=alloc_bytes, tolerance_bytes=tolerance_bytes, pid=os.getpid()
    )
    name = torch.cuda.get_device_name(device)
    counts = f"{len(baseline)}/{len(allocated)}/{len(freed)}"
    print(f"gpu-check: {name} (CUDA {args.device} = NVML {nvml_index}), {counts} samples per phase")
    for check in checks:
        print(f"  {'PASS' if check.ok else 'FAIL'} {check.name}: {check.detail}")
    passed = all(check.ok for check in checks)
    tuned = tune_check(args, torch, device)
    if tuned is not None:
        passed = passed and tuned
    print("gpu-check: PASS" if passed else "gpu-check: FAIL")
    return 0 if passed else 1


def tune_check(args: argparse.Namespace, torch: Any, device: Any) -> bool | None:
    """Steps 6-8 (module docstring); ``None`` when skipped."""
    import shutil
    import subprocess

    if not args.tune_model:
        print("  SKIP tune: no --tune-model (a small model on this machine, e.g. Qwen/Qwen2.5-0.5B-Instruct)")
        return None
    vllm = shutil.which("vllm")
    if vllm is None:
        print("  SKIP tune: vLLM is not installed here (no `vllm` on PATH)")
        return None
    from oomload.trace.model import TraceHeader, TraceRecord, write_trace

    total = int(torch.cuda.get_device_properties(device).total_memory)
    hold_bytes = int(args.tune_hold_gib * GIB) if args.tune_hold_gib else int(0.15 * total)
    held = torch.empty(hold_bytes, dtype=torch.uint8, device=device)
    held.fill_(1)
    torch.cuda.synchronize(device)
    try:
        with tempfile.TemporaryDirectory(prefix="oomload-gpu-tune-") as tmp:
            trace = Path(tmp) / "fixed.jsonl"
            records = [TraceRecord(f"r{i}", i * 0.05, 512, 256) for i in range(400)]
            write_trace(trace, records, TraceHeader(format="synth"))
            out = Path(tmp) / "tune"
            serve = f"{vllm} serve {args.tune_model} --max-model-len 2048"
            argv = [
                sys.executable, "-m", "oomload", "tune", str(trace), "--serve", serve,
                "--target-concurrency", str(args.tune_target), "--utilization", "0.95,0.9,0.8,0.7,0.6",
                "--max-starts", "5", "--max-duration-s", str(args.tune_max_s), "--startup-timeout-s", "240",
                "--replay-max-duration-s", "120", "--run-dir", str(out),
            ]  # fmt: skip
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(args.device)}
            print(f"  tune: holding {hold_bytes / GIB:.1f} GiB of {total / GIB:.1f} GiB; {serve}")
            result = subprocess.run(
                argv, capture_output=True, text=True, env=env, timeout=args.tune_max_s + 300, check=False
            )
            print("\n".join("    " + line for line in result.stdout.splitlines()[-30:]))
            if result.returncode not in (0, 1):
                print(f"  FAIL tune: exit {result.returncode}: {result.stderr.strip()[-500:]}")
                return False
            record = json.loads((out / "tune.json").read_text(encoding="utf-8"))
            cands = record["candidates"]
            first = cands[0] if cands else {}
            failed_free = (
                not first.get("started") and (first.get("failure") or {}).get("cause") == "free_memory"
            )
            started = [c for c in cands if c.get("started") and (c.get("proof") or {}).get("num_gpu_blocks")]
            checks = [
                Check("tune-failed-start", failed_free, f"first candidate: {first.get('failure')}"),
                Check(
                    "tune-started",
                    bool(started) and all(c.get("free_device_bytes") for c in started),
                    f"{len(started)} candidate(s) started with a KV pool and NVML free memory recorded",
                ),
                Check("tune-finished", record.get("status") == "finished", f"status {record.get('status')}"),
                Check("tune-no-server-left", not _vllm_left(), "no `vllm serve` process left"),
            ]
            for check in checks:
                print(f"  {'PASS' if check.ok else 'FAIL'} {check.name}: {check.detail}")
            print(f"  tune winner: {record.get('winner_line') or 'none'}")
            return all(c.ok for c in checks)
    finally:
        del held
        torch.cuda.empty_cache()


def _vllm_left() -> bool:
    import subprocess

    out = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True, check=False).stdout
    return any("vllm serve" in line for line in out.splitlines())


def _phase(out: Path, device: int, duration_s: float) -> list[dict[str, Any]]:
    """The samples of ``device`` stamped within the next ``duration_s`` seconds."""
    start = time.time()
    time.sleep(duration_s)
    end = time.time()
    lines = []
    for raw in out.read_text(encoding="utf-8").splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if line.get("device") == device and start <= float(line["t_unix_s"]) <= end:
            lines.append(line)
    return lines


def _nvml_index(torch: Any, cuda_index: int, nvml_uuids: dict[int, str]) -> int:
    """The NVML index of PyTorch's device: by UUID when PyTorch reports one, else the same index."""
    uuid = getattr(torch.cuda.get_device_properties(cuda_index), "uuid", None)
    if uuid is not None:
        wanted = str(uuid).lower().removeprefix("gpu-")
        for index, nvml_uuid in nvml_uuids.items():
            if nvml_uuid.lower().removeprefix("gpu-") == wanted:
                return index
    return cuda_index


if __name__ == "__main__":
    sys.exit(main())
