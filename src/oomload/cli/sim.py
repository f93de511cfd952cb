"""``oomload sim serve``: run the simulated vLLM (an OpenAI-compatible server on loopback by default)."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from oomload.cli.flags import non_negative, positive, positive_int
from oomload.errors import ConfigError


def register(subparsers: Any) -> None:
    """Add ``sim serve``."""
    sim = subparsers.add_parser("sim", help="the simulated vLLM server (memory-faithful, no GPU needed)")
    sim_sub = sim.add_subparsers(dest="sim_command", metavar="SUBCOMMAND")
    serve = sim_sub.add_parser(
        "serve",
        help="serve the OpenAI API + vLLM /metrics from the simulated engine",
        description="Serve an OpenAI-compatible API whose memory behaviour follows vLLM's V1 scheduler.",
    )
    add_engine_arguments(serve)
    net = serve.add_argument_group("server")
    net.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    net.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one (default 8000)")
    net.add_argument(
        "--port-file", type=Path, help="write the bound port here once the server accepts connections"
    )
    net.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --host")
    net.add_argument("--served-model-name", help="model id in the API (default: the model's name)")
    net.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="multiply modelled step times (0 = as fast as possible; default 1)",
    )
    net.add_argument(
        "--metrics-profile",
        choices=("current", "legacy"),
        default="current",
        help="vLLM metric names: current (V1, 0.32/0.33) or legacy (0.6, gpu_cache_usage_perc)",
    )
    net.add_argument("--max-num-queued-reqs", type=int, help="503 when this many requests already wait")
    net.add_argument(
        "--max-num-queued-tokens", type=int, help="503 when waiting prompt tokens would exceed this"
    )
    net.add_argument(
        "--context-overflow",
        choices=("clamp", "reject"),
        default="clamp",
        help="prompt+max_tokens > max_model_len: clamp max_tokens (vLLM >= 0.33) or 400 (0.20)",
    )
    net.add_argument(
        "--stream-reject-every",
        type=int,
        default=2,
        help="every Nth rejected stream gets HTTP 200 + an SSE error event (0 = never; default 2)",
    )
    net.add_argument(
        "--keepalive-timeout-s", type=float, default=5.0, help="close idle connections (default 5)"
    )
    net.add_argument(
        "--exit-delay-s", type=float, default=2.0, help="seconds from engine death to exit (default 2)"
    )
    net.add_argument("--vllm-version", help="version /version reports (default 0.32.0; 0.6.6 with legacy)")
    net.add_argument("--seed", type=int, default=0, help="seed for ids and generated text (default 0)")
    net.add_argument(
        "--parent-pid",
        type=int,
        help="exit when this process ends (set by `oomload replay`, so its simulator never outlives it)",
    )
    add_host_memory_arguments(serve)
    serve.set_defaults(func=run)
    sim.set_defaults(func=lambda args: _usage(sim))


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The engine-sizing flags shared by ``sim serve`` and ``plan`` (vLLM's names where they exist)."""
    g = parser.add_argument_group("engine (vLLM flags)")
    g.add_argument(
        "--model",
        default="llama-3.1-8b",
        help="preset (llama-3.1-8b, llama-3.1-70b, qwen2.5-7b, qwen2.5-72b, mistral-7b, tiny) "
        "or a Hugging Face config.json (default llama-3.1-8b)",
    )
    g.add_argument(
        "--gpu", help="a10g, l4, a100-40g, a100-80g, h100, h200 (default l4 unless blocks are given)"
    )
    g.add_argument("--gpu-memory-gib", type=float, help="GPU memory size (any size; overrides the preset's)")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.92, help="default 0.92")
    g.add_argument("--tensor-parallel-size", "--tp", dest="tensor_parallel_size", type=int, default=1)
    g.add_argument(
        "--num-gpu-blocks",
        "--num-gpu-blocks-override",
        dest="num_gpu_blocks",
        type=int,
        help="use exactly this many KV blocks (one is the null block)",
    )
    g.add_argument(
        "--kv-cache-memory-bytes", type=int, help="KV pool size in bytes (skips the memory budget)"
    )
    g.add_argument("--block-size", type=int, help="tokens per block (default 16 on a GPU, 128 without)")
    g.add_argument(
        "--max-num-seqs", type=int, help="default: vLLM's for the device (256 or 1024; 128 on CPU)"
    )
    g.add_argument("--max-num-batched-tokens", type=int, help="default: vLLM's for the device (2048 or 8192)")
    g.add_argument("--max-model-len", type=int, help="default: min(the model's window, 8192)")
    g.add_argument("--enforce-eager", action="store_true", help="no CUDA-graph memory reserve")
    g.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="model V1's automatic prefix caching (on by default, as in vLLM; "
        "--no-enable-prefix-caching turns it off)",
    )
    g.add_argument(
        "--oom",
        choices=("auto", "on", "off"),
        default="auto",
        help="modelled CUDA OOM: auto (only when memory really overflows), on, off",
    )
    g.add_argument(
        "--activation-scale",
        type=float,
        default=1.0,
        help="runtime activations / profiled activations (> 1 models an underestimate)",
    )
    g.add_argument(
        "--other-process-gib",
        type=float,
        default=0.0,
        help="device memory other processes already use (vLLM refuses to start when the free memory "
        "is below total x utilization; default 0)",
    )
    g.add_argument(
        "--cuda-graph-gib",
        type=float,
        help="memory CUDA-graph capture really takes after the KV pool (default: the 0.5 GiB reserve; "
        "more than is free fails the start with a CUDA OOM, unless --enforce-eager)",
    )


def add_host_memory_arguments(parser: argparse.ArgumentParser) -> None:
    """The host-memory model's flags (``oomload.sim.hostmem``): real memory, a limit, a leak."""
    g = parser.add_argument_group("host memory (real bytes the simulator process holds)")
    g.add_argument(
        "--host-memory-limit-mib",
        type=float,
        help="a memory limit on the process's real RSS (default none); see --host-limit-kind",
    )
    g.add_argument(
        "--host-limit-kind",
        choices=("container", "process"),
        default="container",
        help="over the limit: container = SIGKILL like the kernel's OOM killer (exit -9, nothing logged); "
        "process = the allocation fails like under prlimit (the CPU allocator's error, engine death, "
        "exit 1) (default container)",
    )
    g.add_argument("--host-base-mib", type=float, default=0.0, help="memory held from start-up (default 0)")
    g.add_argument(
        "--host-bytes-per-token",
        type=int,
        default=0,
        help="memory held per prompt + output token of every request in flight (default 0)",
    )
    g.add_argument(
        "--host-leak-mib-per-min",
        type=float,
        default=0.0,
        help="memory that grows with wall-clock time, whatever --time-scale says (default 0)",
    )
    g.add_argument(
        "--host-leak-cap-mib",
        type=float,
        help="the leak stops growing here (default: none with a limit, 1024 without)",
    )


def host_memory_config(args: argparse.Namespace) -> Any:
    """``HostMemoryConfig`` from the flags; ``ConfigError`` for a negative or empty value."""
    from oomload.sim.hostmem import MIB, HostMemoryConfig

    limit = args.host_memory_limit_mib
    if limit is not None:
        positive("--host-memory-limit-mib", limit)
    _given(
        non_negative,
        (
            ("--host-base-mib", args.host_base_mib),
            ("--host-bytes-per-token", args.host_bytes_per_token),
            ("--host-leak-mib-per-min", args.host_leak_mib_per_min),
            ("--host-leak-cap-mib", args.host_leak_cap_mib),
        ),
    )
    return HostMemoryConfig(
        base_bytes=int(args.host_base_mib * MIB),
        bytes_per_token=args.host_bytes_per_token,
        leak_bytes_per_s=args.host_leak_mib_per_min * MIB / 60.0,
        leak_cap_bytes=None if args.host_leak_cap_mib is None else int(args.host_leak_cap_mib * MIB),
        limit_bytes=None if limit is None else int(limit * MIB),
        limit_kind=args.host_limit_kind,
    )


def engine_options(args: argparse.Namespace) -> Any:
    """``EngineOptions`` from the flags; ``ConfigError`` for a size or scale that is negative, zero
    where it must not be, NaN or infinite (the counts and the utilization: ``build_engine``)."""
    from oomload.sim.build import EngineOptions

    _given(
        positive,
        (
            ("--gpu-memory-gib", args.gpu_memory_gib),
            ("--activation-scale", args.activation_scale),
        ),
    )
    _given(
        non_negative,
        (
            ("--other-process-gib", getattr(args, "other_process_gib", 0.0)),
            ("--cuda-graph-gib", getattr(args, "cuda_graph_gib", None)),
        ),
    )
    return EngineOptions(
        model=args.model,
        gpu=args.gpu,
        gpu_memory_gib=args.gpu_memory_gib,
        gpu_memory_utilization=args.gpu_memory_utilization,
        tensor_parallel_size=args.tensor_parallel_size,
        num_gpu_blocks=args.num_gpu_blocks,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        enforce_eager=args.enforce_eager,
        enable_prefix_caching=args.enable_prefix_caching,
        oom=args.oom,
        activation_scale=args.activation_scale,
        other_process_gib=getattr(args, "other_process_gib", 0.0),
        cuda_graph_gib=getattr(args, "cuda_graph_gib", None),
    )


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def check_bind_host(host: str, allow_remote: bool) -> None:
    """Refuse a non-loopback bind unless explicitly allowed (the simulator has no authentication)."""
    if allow_remote:
        return
    if host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError as err:
        raise ConfigError(f"--host {host!r} is not an IP address; use 127.0.0.1 (or --allow-remote)") from err
    if not loopback:
        raise ConfigError(
            f"--host {host} is not a loopback address: the simulated server has no authentication. "
            "Pass --allow-remote to bind it anyway."
        )


def _given(check: Callable[[str, float], None], flags: Iterable[tuple[str, float | None]]) -> None:
    """``check`` each flag's value that was given (``None``: not given, the default applies)."""
    for flag, value in flags:
        if value is not None:
            check(flag, value)


def check_serve_numbers(args: argparse.Namespace) -> None:
    """``sim serve``'s own numbers: ``ConfigError`` for a negative, NaN or infinite one (``--port`` is
    checked apart: 0 picks a free one)."""
    if args.parent_pid is not None:
        positive_int("--parent-pid", args.parent_pid)
    _given(
        non_negative,
        (
            ("--max-num-queued-reqs", args.max_num_queued_reqs),
            ("--max-num-queued-tokens", args.max_num_queued_tokens),
            ("--stream-reject-every", args.stream_reject_every),
            ("--seed", args.seed),
            ("--time-scale", args.time_scale),
            ("--keepalive-timeout-s", args.keepalive_timeout_s),
            ("--exit-delay-s", args.exit_delay_s),
        ),
    )


def run(args: argparse.Namespace) -> int:
    from oomload.sim.build import build_engine
    from oomload.sim.process import exit_with_parent
    from oomload.sim.server import ServerOptions, SimService, check_port_file, serve

    check_serve_numbers(args)  # --parent-pid first: a pid that is not the parent's ends this at once
    if args.parent_pid is not None:
        exit_with_parent(args.parent_pid)
    check_bind_host(args.host, args.allow_remote)
    if args.port_file is not None:
        check_port_file(args.port_file)
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in 0..65535, got {args.port}")
    host_memory = host_memory_config(args)
    opts = engine_options(args)
    built = build_engine(opts)
    version = args.vllm_version or ("0.6.6" if args.metrics_profile == "legacy" else "0.32.0")
    options = ServerOptions(
        served_model_name=args.served_model_name or built.model.name,
        model_root=built.model.name,
        time_scale=args.time_scale,
        metrics_profile=args.metrics_profile,
        max_num_queued_reqs=args.max_num_queued_reqs,
        max_num_queued_tokens=args.max_num_queued_tokens,
        context_overflow=args.context_overflow,
        stream_reject_every=args.stream_reject_every,
        keepalive_timeout_s=args.keepalive_timeout_s,
        exit_delay_s=args.exit_delay_s,
        vllm_version=version,
        seed=args.seed,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        num_gpu_blocks_override=args.num_gpu_blocks,
        user_block_size=args.block_size is not None,
        gpu_name=built.gpu.name if built.gpu else "oomload simulated device",
        num_gpus=args.tensor_parallel_size,
        host_memory=host_memory,
    )

    async def main() -> int:
        service = SimService(built.engine(opts), options)
        return await serve(service, args.host, args.port, args.port_file)

    return asyncio.run(main())
