"""``--tokenizer`` builds in the pool: the same trace, byte for byte, as one process; each worker loads once.

Text-only OpenAI-style logs (no ``usage``) are cut into many small spans; the token counts come from
a real ``tokenizers`` BPE trained here (sent to workers as its ``--tokenizer`` value and loaded once
per worker) or from a fake counter (sent pickled: a counter not loaded from a ``--tokenizer`` value).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from spreadrun import run_both

from bpetext import sentence, train_bpe
from oomload.ingest import load_token_counter
from oomload.ingest.workertasks import counter_recipe, worker_counter


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_bpe(tmp_path_factory.mktemp("tok"))


def _text_log(path: Path, count: int, start_s: float = 1_717_000_000.0) -> Path:
    rng = random.Random(count)
    lines = []
    for i in range(count):
        if i % 19 == 4:
            lines.append("{not json")
            continue
        line: dict[str, Any] = {
            "request": {"model": "m", "messages": [{"role": "user", "content": sentence(rng, 3 + i % 20)}]},
            "response": {"id": f"c-{i}", "choices": [{"message": {"content": sentence(rng, 1 + i % 7)}}]},
        }
        if i % 11:
            line["timestamp"] = start_s + i * 0.25
        lines.append(json.dumps(line))
    path.write_text("\n".join(lines) + "\n")
    return path


FAKE = '''
class SyllableCounter:
    """A fake tokenizer: one token per 2 characters of text."""
    name = "fake:pairs"
    def count(self, text):
        return (len(text) + 1) // 2
'''

RUNNER = r"""
import json, sys
sys.path.insert(0, sys.argv[2])  # the fake counter's module (workers get this path too)
from oomload.ingest import build_trace, count_trace, load_token_counter, parallel
pooled = []  # inputs read by the pool (in spans or whole), counted in this process
for name in ("_span_batches", "_file_batches"):
    def counted(*args, _real=getattr(parallel, name), **kwargs):
        pooled.append(1)
        return _real(*args, **kwargs)
    setattr(parallel, name, counted)
spec = json.loads(sys.argv[1])
if spec["tokenizer"] == "fake":
    from fake_tokens import SyllableCounter
    counter = SyllableCounter()
else:
    counter = load_token_counter(spec["tokenizer"])
results = []
for workers in (1, 2):
    del pooled[:]
    out = f"{spec['out']}.{workers}"
    sizes = {"parallel_min_bytes": 0, "span_bytes": 700}
    r = build_trace(spec["inputs"], out, workers=workers, counter=counter, **sizes)
    c = count_trace(spec["inputs"], workers=workers, counter=counter, **sizes)
    results.append({
        "bytes": open(out, encoding="utf-8").read(), "counts": r.skips.counts, "examples": r.skips.examples,
        "stats": [repr(c.arrivals), c.prompt_tokens.distinct()[0].tolist(),
                  c.output_tokens.distinct()[0].tolist()],
        "pooled": len(pooled),
    })
print(json.dumps(results))
"""


def _build_both(inputs: list[Path], tmp_path: Path, tokenizer: str) -> tuple[dict[str, Any], dict[str, Any]]:
    (tmp_path / "fake_tokens.py").write_text(FAKE)
    spec = {"inputs": [str(p) for p in inputs], "out": str(tmp_path / "t.jsonl"), "tokenizer": tokenizer}
    single, spread = run_both(RUNNER, json.dumps(spec), str(tmp_path))
    assert (single.pop("pooled"), spread.pop("pooled") > 0) == (0, True)  # read by the pool
    return single, spread


def test_a_tokenizer_build_in_spans_writes_the_same_bytes(tokenizer_dir: Path, tmp_path: Path) -> None:
    log = _text_log(tmp_path / "gw.jsonl", 300)
    single, spread = _build_both([log], tmp_path, f"hf:{tokenizer_dir}")
    assert spread == single
    assert '"tokenizer":"hf:' in single["bytes"].splitlines()[0]
    assert single["counts"] == {"not a JSON object": 16}
    assert len(single["stats"][1]) > 20  # many distinct prompt lengths, counted by the tokenizer


def test_a_fake_counter_reaches_the_workers_pickled(tmp_path: Path) -> None:
    first = _text_log(tmp_path / "a.jsonl", 200)
    second = _text_log(tmp_path / "b.jsonl", 120, start_s=1_717_000_010.0)  # several inputs: read whole
    single, spread = _build_both([first, second], tmp_path, "fake")
    assert spread == single
    assert '"tokenizer":"fake:pairs"' in single["bytes"].splitlines()[0]


def test_a_worker_loads_a_tokenizer_once(tokenizer_dir: Path) -> None:
    counter = load_token_counter(str(tokenizer_dir))
    recipe = counter_recipe(counter)
    assert recipe == ("spec", f"hf:{tokenizer_dir}")  # sent as its --tokenizer value, not pickled
    loaded = worker_counter(recipe)
    assert loaded is not None and worker_counter(recipe) is loaded
    assert loaded.count("kalo mi nu.") == counter.count("kalo mi nu.") > 0
