"""``trace build --tokenizer hf:DIR`` with a real ``tokenizers`` BPE trained here on generated text."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from bpetext import sentence, train_bpe
from oomload.cli import main
from oomload.errors import ConfigError
from oomload.ingest import load_token_counter
from oomload.trace.model import read_trace, read_trace_header


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_bpe(tmp_path_factory.mktemp("tok"))


def test_build_counts_text_exactly_as_the_tokenizer_does(
    tokenizer_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))

    def tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    rng = random.Random(11)
    lines: list[str] = []
    expected: list[tuple[int, int]] = []
    texts: list[str] = []
    request: dict[str, Any]
    response: dict[str, Any]
    for i in range(6):
        system, user, answer = sentence(rng, 5), sentence(rng, 8 + 3 * i), sentence(rng, 4 + i)
        if i % 2:  # chat: messages in, message out
            request = {
                "model": "m",
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            }
            response = {"choices": [{"message": {"role": "assistant", "content": answer}}]}
            expected.append((tokens(system) + tokens(user), tokens(answer)))
        else:  # completion: prompt in, text out
            request = {"model": "m", "prompt": user, "max_tokens": 64}
            response = {"choices": [{"text": answer}]}
            expected.append((tokens(user), tokens(answer)))
        texts += [system, user, answer]
        lines.append(json.dumps({"timestamp": 1_700_000_000 + i, "request": request, "response": response}))
    log = tmp_path / "gateway.jsonl"
    log.write_text("\n".join(lines) + "\n")
    out = tmp_path / "trace.jsonl"

    assert main(["trace", "build", str(log), "-o", str(out), "--tokenizer", f"hf:{tokenizer_dir}"]) == 0
    stdout = capsys.readouterr().out
    assert f"tokens counted with hf:{tokenizer_dir}" in stdout and "skipped 0 lines" in stdout
    assert [(r.prompt_tokens, r.output_tokens) for r in read_trace(out)] == expected
    # the BPE really splits words, so counting words (or characters) would not pass
    assert sum(p + o for p, o in expected) > sum(len(text.split()) for text in texts)
    assert read_trace_header(out).tokenizer == f"hf:{tokenizer_dir}"
    written = out.read_text()
    assert not any(text in written for text in texts)  # lengths only, never text


def test_a_plain_directory_is_an_hf_tokenizer_and_a_directory_without_one_is_refused(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    assert load_token_counter(str(tokenizer_dir)).name == f"hf:{tokenizer_dir}"
    assert load_token_counter(f"hf:{tokenizer_dir}").count("kaloka mi.") >= 3
    with pytest.raises(ConfigError, match=r"has no tokenizer\.json"):
        load_token_counter(f"hf:{tmp_path}")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot load"):
        load_token_counter(f"hf:{tmp_path}")
