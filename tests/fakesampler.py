"""``oomload sample`` with a fake NVML: in this process (``run_sample``) or as a program.

The shipped CLI has no test hook; tests go through ``oomload.cli.sample.run``'s ``nvml`` argument
with ``oomload.telemetry.fake_nvml.FakeNvml``, parsing the flags with the real parser and turning
errors into exit codes the way ``oomload`` does (``oomload.cli.run_command``).

As a program, for child processes (``GpuSamplerProcess(program=fake_sample_program(SPEC))``)::

    python tests/fakesampler.py SPEC [oomload sample flags]

SPEC is ``fake_nvml``'s JSON (or a JSON file's path).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from pathlib import Path

from oomload.cli import build_parser, run_command, sample
from oomload.telemetry.fake_nvml import FakeNvml, load_fake_spec


def run_sample(spec: str, argv: Sequence[str]) -> int:
    """``oomload sample ARGV`` in this process, NVML replaced by the fake that ``spec`` describes."""
    args = build_parser().parse_args(["sample", *argv])
    args.func = functools.partial(sample.run, nvml=FakeNvml(load_fake_spec(spec)))
    return run_command(args)


def fake_sample_program(spec: str) -> list[str]:
    """The command line of ``oomload sample`` over the fake NVML, to which sample's flags are added."""
    return [sys.executable, str(Path(__file__).resolve()), spec]


if __name__ == "__main__":
    sys.exit(run_sample(sys.argv[1], sys.argv[2:]))
