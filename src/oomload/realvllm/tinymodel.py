"""A tiny Llama for the real vLLM, built locally: random weights, a tokenizer trained here, no downloads.

Shape (reference ``vllm-cpu.md`` §2): 2 layers, hidden 128, intermediate 256, 4 attention heads and 4 KV
heads of head_dim 32 (a size the CPU attention backend accepts), vocabulary 2048, 4096 positions, tied
embeddings, bf16; about 590k parameters, a 1.2 MB ``model.safetensors``. Its KV cache costs
2 × 2 layers × 4 heads × 32 × 2 bytes = 1 KiB per token, so a few MiB of KV cache make vLLM preempt.

The tokenizer is a byte-level BPE trained with ``tokenizers`` on seeded, generated pseudo-words (any
text encodes, because the byte alphabet is seeded). Special tokens ``<unk> <s> </s> <pad> <|im_start|>
<|im_end|>``; a ChatML ``chat_template`` so ``/v1/chat/completions`` works. With random weights greedy
output repeats one token; oomload asks for ``ignore_eos`` and ``min_tokens == max_tokens``, so output
lengths are exact anyway.

The build runs *inside* the vLLM environment (it needs ``torch`` and ``transformers``): this file is
run there as a script (``ensure_tiny_model`` does that) and so imports only the standard library at
module level. The result is cached: a stamp file in the model folder names the spec and seed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SPEC: dict[str, Any] = {
    "architecture": "LlamaForCausalLM",
    "num_hidden_layers": 2,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "vocab_size": 2048,
    "max_position_embeddings": 4096,
    "dtype": "bfloat16",
}
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
STAMP_NAME = "oomload-tiny-model.json"
DEFAULT_SEED = 1234


def wanted_stamp(seed: int) -> dict[str, Any]:
    return {"spec": SPEC, "seed": seed}


def is_built(out_dir: Path, seed: int = DEFAULT_SEED) -> bool:
    stamp = out_dir / STAMP_NAME
    if not stamp.is_file() or not (out_dir / "model.safetensors").is_file():
        return False
    try:
        return bool(json.loads(stamp.read_text(encoding="utf-8")) == wanted_stamp(seed))
    except ValueError:
        return False


def ensure_tiny_model(
    python: Path, out_dir: Path, *, seed: int = DEFAULT_SEED, timeout_s: float = 300.0
) -> Path:
    """Build the tiny model into ``out_dir`` with the vLLM environment's ``python`` unless cached.

    Raises ``ConfigError`` (with the builder's output tail) when the build fails.
    """
    from oomload.errors import ConfigError

    out_dir = Path(out_dir)
    if is_built(out_dir, seed):
        return out_dir
    argv = [str(python), str(Path(__file__).resolve()), "--out", str(out_dir), "--seed", str(seed)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONNOUSERSITE": "1"}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ConfigError(f"cannot build the tiny model with {python}: {err}") from err
    if done.returncode != 0 or not is_built(out_dir, seed):
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise ConfigError(f"building the tiny model into {out_dir} failed (exit {done.returncode}):\n{tail}")
    return out_dir


def generate_corpus(seed: int, lines: int = 4000) -> list[str]:
    """Seeded pseudo-text: words from random syllables, digits and punctuation."""
    rng = random.Random(seed)
    onsets = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "st", "tr"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou", "ea"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "ng"]
    syllables = [o + v + c for o in onsets for v in vowels for c in codas]
    punctuation = [".", ",", "!", "?", ";", ":"]
    corpus = []
    for _ in range(lines):
        words = []
        for _ in range(rng.randint(4, 20)):
            word = "".join(rng.choice(syllables) for _ in range(rng.randint(1, 3)))
            if rng.random() < 0.1:
                word = word.capitalize()
            if rng.random() < 0.05:
                word = str(rng.randint(0, 9999))
            words.append(word)
        corpus.append(" ".join(words) + rng.choice(punctuation))
    return corpus


def build(out_dir: Path, seed: int) -> None:
    """Train the tokenizer, create the random-weight model and save both to ``out_dir`` (atomically)."""
    tokenizers = importlib.import_module("tokenizers")
    transformers = importlib.import_module("transformers")
    torch = importlib.import_module("torch")

    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=SPEC["vocab_size"],
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(generate_corpus(seed), trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=SPEC["max_position_embeddings"],
    )
    fast.chat_template = CHATML_TEMPLATE

    config = transformers.LlamaConfig(
        vocab_size=SPEC["vocab_size"],
        hidden_size=SPEC["hidden_size"],
        intermediate_size=SPEC["intermediate_size"],
        num_hidden_layers=SPEC["num_hidden_layers"],
        num_attention_heads=SPEC["num_attention_heads"],
        num_key_value_heads=SPEC["num_key_value_heads"],
        head_dim=SPEC["head_dim"],
        max_position_embeddings=SPEC["max_position_embeddings"],
        tie_word_embeddings=True,
        bos_token_id=fast.convert_tokens_to_ids("<s>"),
        eos_token_id=fast.convert_tokens_to_ids("</s>"),
        pad_token_id=fast.convert_tokens_to_ids("<pad>"),
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)

    tmp = out_dir.with_name(out_dir.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    fast.save_pretrained(tmp)
    if not (tmp / "chat_template.jinja").exists():
        (tmp / "chat_template.jinja").write_text(CHATML_TEMPLATE, encoding="utf-8")
    (tmp / STAMP_NAME).write_text(json.dumps(wanted_stamp(seed)) + "\n", encoding="utf-8")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the tiny random-weight Llama (inside the vLLM venv).")
    parser.add_argument("--out", type=Path, required=True, help="model folder to create")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = parser.parse_args(argv)
    if is_built(args.out, args.seed):
        print(f"{args.out}: already built")
        return 0
    build(args.out, args.seed)
    print(f"{args.out}: built")
    return 0


if __name__ == "__main__":
    sys.exit(main())
