"""OpenAI-style log lines in the shapes ``docs/trace.md`` lists, written without oomload's reader in mind.

Each shape builds plain Python objects the way a gateway, a proxy or the Batch API writes them and
serializes them with the standard ``json`` module under varied options, so that the bench and the
tests exercise what real logs hold rather than what the fast path expects: the keys of every object
in a shuffled order, compact or spaced separators, ``\\uXXXX`` escapes or raw UTF-8, escaped quotes
and newlines in the text, extra fields (``object``, ``system_fingerprint``, ``*_details``), and a
few lines per hundred that a trace cannot use as they are (no ``usage``, a failed request) or that
carry an unusual value (a millisecond timestamp, a ``null`` model).

``SHAPES`` names each generator: ``gateway`` (chat, float ``timestamp``, ``status_code``),
``chat-iso`` (chat nested under ``request``/``response`` with an ISO ``created_at``),
``completions`` (``prompt`` and ``choices[].text`` with a float ``timestamp``), ``batch`` (OpenAI
Batch output: ``custom_id``, ``response.status_code``, ``response.body.usage``), ``responses``
(the Responses API: ``input``, ``max_output_tokens``, ``usage.input_tokens``/``output_tokens``) and
``flat`` (the request body itself with ``messages`` and ``usage`` beside it, times in ms); and two
shapes written the way other software writes them, not tuned for: ``litellm`` (a LiteLLM spend log:
``messages`` at the top, the response and its ``usage`` nested, cost, float ``startTime`` and nested
``metadata``) and ``access-log`` (an API gateway's access log: request and response bodies as escaped
JSON strings, times in ms as ``started_at``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

WORDS = ["alpha", "beta", "gamma", "delta", "kappa", "sigma", "théta", "ωmega", "naïve", "日本語", "emoji🙂"]
T0_S = 1_760_000_000.0
_CHAT = ("prompt_tokens", "completion_tokens")


def _text(rng: random.Random, words: int) -> str:
    picked = rng.choices(WORDS, k=words)
    if rng.random() < 0.3:
        picked.insert(rng.randrange(len(picked) + 1), 'say "hi"\nthen\\stop\t')
    return " ".join(picked)


def _shuffled(rng: random.Random, obj: dict[str, Any]) -> dict[str, Any]:
    keys = list(obj)
    rng.shuffle(keys)
    return {k: obj[k] for k in keys}


def _dump(rng: random.Random, obj: dict[str, Any]) -> str:
    separators = (",", ":") if rng.random() < 0.5 else (", ", ": ")
    return json.dumps(obj, ensure_ascii=rng.random() < 0.5, separators=separators)


def _messages(rng: random.Random) -> list[dict[str, Any]]:
    system = {"role": "system", "content": "You are a helpful assistant. " * rng.randint(1, 4)}
    turns = [
        _shuffled(
            rng, {"role": rng.choice(["user", "assistant"]), "content": _text(rng, rng.randint(5, 120))}
        )
        for _ in range(rng.randint(1, 3))
    ]
    if rng.random() < 0.2:
        turns[-1]["content"] = [{"type": "text", "text": _text(rng, 30)}]
    return [system, *turns]


def _tokens(rng: random.Random, value: Any) -> int:
    """About one token per 4 characters of ``value``'s JSON, give or take a fifth."""
    return max(1, round(len(json.dumps(value, ensure_ascii=False)) / 4 * rng.uniform(0.8, 1.2)))


def _usage(rng: random.Random, prompt: int, output: int, names: tuple[str, str]) -> dict[str, Any]:
    usage: dict[str, Any] = {names[0]: prompt, names[1]: output, "total_tokens": prompt + output}
    if rng.random() < 0.5:
        usage[f"{names[0].split('_')[0]}_tokens_details"] = {"cached_tokens": rng.randint(0, prompt)}
    return _shuffled(rng, usage)


def _choice(rng: random.Random, text: str, chat: bool) -> dict[str, Any]:
    if chat:
        message = {"role": "assistant", "content": text, "refusal": None}
        return _shuffled(rng, {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None})
    return _shuffled(rng, {"index": 0, "text": text, "finish_reason": "length", "logprobs": None})


def _odd(rng: random.Random, line: dict[str, Any], usage_holder: dict[str, Any]) -> None:
    """A few lines in a hundred that the trace reads differently: no usage, a failure."""
    roll = rng.random()
    if roll < 0.01:
        usage_holder.pop("usage", None)
    elif roll < 0.02:
        line["status_code"] = 429
        line["error"] = {"message": "rate limited", "type": "rate_limit"}


def gateway(rng: random.Random, i: int, time_s: float) -> dict[str, Any]:
    request = _shuffled(
        rng, {"model": "m", "max_tokens": rng.choice([256, 1024]), "messages": _messages(rng)}
    )
    choice = _choice(rng, _text(rng, rng.randint(1, 80)), True)
    response = {
        "id": f"chatcmpl-{i}",
        "object": "chat.completion",
        "created": int(time_s),
        "model": "m-2026",
        "choices": [choice],
        "usage": _usage(rng, _tokens(rng, request["messages"]), _tokens(rng, choice), _CHAT),
    }
    line = {"timestamp": round(time_s, 6), "request": request, "response": response, "status_code": 200}
    _odd(rng, line, response)
    return line


def chat_iso(rng: random.Random, i: int, time_s: float) -> dict[str, Any]:
    request = {"model": "gpt-4o", "messages": _messages(rng), "temperature": 0.7}
    if rng.random() < 0.7:
        request["max_completion_tokens"] = rng.randint(64, 2048)
    choice = _choice(rng, _text(rng, rng.randint(1, 80)), True)
    response = {
        "id": f"chatcmpl-{i:x}",
        "object": "chat.completion",
        "created": int(time_s),
        "model": "gpt-4o-2024-08-06",
        "system_fingerprint": "fp_abc",
        "choices": [choice],
        "usage": _usage(rng, _tokens(rng, request["messages"]), _tokens(rng, choice), _CHAT),
    }
    response = _shuffled(rng, response)
    stamp = datetime.fromtimestamp(time_s, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:23]
    line = {
        "created_at": stamp + rng.choice(["Z", "+00:00", ""]),
        "request": _shuffled(rng, request),
        "response": response,
    }
    _odd(rng, line, response)
    return line


def completions(rng: random.Random, i: int, time_s: float) -> dict[str, Any]:
    request = {
        "model": "davinci",
        "prompt": _text(rng, rng.randint(5, 200)),
        "max_tokens": rng.randint(16, 512),
    }
    choice = _choice(rng, _text(rng, rng.randint(1, 80)), False)
    response = {
        "id": f"cmpl-{i}",
        "object": "text_completion",
        "created": int(time_s),
        "model": "davinci-002",
        "choices": [choice],
        "usage": _usage(rng, _tokens(rng, request["prompt"]), _tokens(rng, choice), _CHAT),
    }
    response = _shuffled(rng, response)
    line = {"timestamp": time_s, "request": _shuffled(rng, request), "response": response}
    if rng.random() < 0.5:
        line["request_id"] = f"req-{i}"
    _odd(rng, line, response)
    return line


def batch(rng: random.Random, i: int, time_s: float) -> dict[str, Any]:
    choice = _choice(rng, _text(rng, rng.randint(1, 80)), True)
    body: dict[str, Any] = {
        "id": f"chatcmpl-{i}",
        "object": "chat.completion",
        "created": int(time_s),
        "model": "gpt-4o-mini",
        "choices": [choice],
        "usage": _usage(rng, rng.randint(20, 3000), _tokens(rng, choice), _CHAT),
        "system_fingerprint": None,
    }
    status_code = 200
    if rng.random() < 0.01:
        status_code = 400
        body = {"error": {"message": "bad request", "type": "invalid_request_error"}}
    response = {"status_code": status_code, "request_id": f"{i:032x}", "body": _shuffled(rng, body)}
    return {
        "id": f"batch_req_{i}",
        "custom_id": f"request-{i}",
        "response": _shuffled(rng, response),
        "error": None,
    }


def responses(rng: random.Random, i: int, time_s: float) -> dict[str, Any]:
    request = {"model": "gpt-4.1", "input": _text(rng, rng.randint(5, 200)), "max_output_tokens": 1000}
    output = [{"type": "message", "content": [{"type": "output_text", "text": _text(rng, 80)}]}]
    response = {
        "id": f"resp_{i}",
        "object": "response",
        "created_at": int(time_s),
        "model": "gpt-4.1",
        "output": output,
        "usage": _usage(
            rng, _tokens(rng, request["input"]), _tokens(rng, output), ("input_tokens", "output_tokens")
        ),
    }
    response = _shuffled(rng, response)
    line = {"time": time_s, "request": _shuffled(rng, request), "response": response}
    _odd(rng, line, response)
    return line


def flat(rng: random.Random, i: int, time_s: float) -> dict[str, Any]:
    messages = _messages(rng)
    line = {
        "request_time": int(time_s * 1000),
        "request_id": f"r{i}",
        "model": rng.choice(["llama", None]),
        "messages": messages,
        "max_tokens": rng.choice([None, 512]),
        "usage": _usage(rng, _tokens(rng, messages), rng.randint(1, 900), _CHAT),
    }
    _odd(rng, line, line)
    return line


def litellm(rng: random.Random, i: int, time_s: float) -> dict[str, Any]:
    """A LiteLLM-style spend log (its ``StandardLoggingPayload``): ``messages`` at the top, the model's
    response nested with its ``usage``, token counts and cost beside them, nested ``metadata``."""
    messages = _messages(rng)
    choice = _choice(rng, _text(rng, rng.randint(1, 80)), True)
    prompt, output = _tokens(rng, messages), _tokens(rng, choice)
    response = {
        "id": f"chatcmpl-{i:x}",
        "object": "chat.completion",
        "created": int(time_s),
        "model": "gpt-4o-mini",
        "choices": [choice],
        "usage": _usage(rng, prompt, output, _CHAT),
    }
    metadata = {
        "user_api_key_hash": f"{rng.getrandbits(128):032x}",
        "user_api_key_alias": rng.choice(["team-a", None]),
        "user_api_key_team_id": f"team-{rng.randint(1, 9)}",
        "user_api_key_user_id": None,
        "spend_logs_metadata": rng.choice([None, {"env": "prod", "tags": ["chat", "beta"]}]),
        "requester_ip_address": "",
        "requester_metadata": {"headers": {"x-request-source": "sdk"}},
    }
    line = {
        "id": f"{rng.getrandbits(64):016x}",
        "trace_id": f"{rng.getrandbits(64):016x}",
        "call_type": "acompletion",
        "stream": rng.random() < 0.3,
        "response_cost": round(rng.uniform(0, 0.01), 8),
        "status": "success",
        "total_tokens": prompt + output,
        "prompt_tokens": prompt,
        "completion_tokens": output,
        "startTime": time_s,
        "endTime": time_s + rng.uniform(0.2, 9.0),
        "completionStartTime": time_s + rng.uniform(0.05, 0.5),
        "model": "gpt-4o-mini",
        "model_id": f"{rng.getrandbits(64):x}",
        "model_group": "gpt-4o-mini",
        "custom_llm_provider": "openai",
        "api_base": "https://api.openai.com/v1/",
        "metadata": _shuffled(rng, metadata),
        "cache_hit": None,
        "cache_key": None,
        "request_tags": rng.choice([[], ["prod"]]),
        "end_user": "",
        "messages": messages,
        "response": _shuffled(rng, response),
        "model_parameters": {"temperature": 0.2, "max_tokens": rng.choice([256, 1024])},
        "hidden_params": {"model_id": None, "cache_key": None, "api_base": None, "response_cost": None},
        "error_str": None,
    }
    _odd(rng, line, response)
    return line


def access_log(rng: random.Random, i: int, time_s: float) -> dict[str, Any]:
    """An API gateway's access log (Kong's or APISIX's http-logger): method, headers, latencies, and the
    request and response bodies as escaped JSON strings (a reader must decode them a second time)."""
    request = {"model": "m", "max_tokens": rng.choice([256, 1024]), "messages": _messages(rng)}
    choice = _choice(rng, _text(rng, rng.randint(1, 80)), True)
    body = {
        "id": f"chatcmpl-{i}",
        "object": "chat.completion",
        "created": int(time_s),
        "model": "m",
        "choices": [choice],
        "usage": _usage(rng, _tokens(rng, request["messages"]), _tokens(rng, choice), _CHAT),
    }
    request_body = _dump(rng, _shuffled(rng, request))
    response_body = _dump(rng, _shuffled(rng, body))
    stamp = datetime.fromtimestamp(time_s, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:23] + "Z"
    return {
        "@timestamp": stamp,
        "client_ip": f"10.0.{rng.randint(0, 255)}.{rng.randint(1, 254)}",
        "service": {"name": "llm", "host": "vllm.internal", "port": 8000},
        "route": {"paths": ["/v1/chat/completions"]},
        "request": {
            "method": "POST",
            "uri": "/v1/chat/completions",
            "size": len(request_body),
            "headers": {"content-type": "application/json", "user-agent": "openai-python/1.54"},
            "body": request_body,
        },
        "response": {
            "status": 200,
            "size": len(response_body),
            "headers": {"content-type": "application/json"},
            "body": response_body,
        },
        "latencies": {"request": rng.randint(200, 9000), "proxy": rng.randint(200, 9000), "kong": 1},
        "started_at": int(time_s * 1000),
    }


Shape = Callable[[random.Random, int, float], dict[str, Any]]
SHAPES: dict[str, Shape] = {
    "gateway": gateway,
    "chat-iso": chat_iso,
    "completions": completions,
    "batch": batch,
    "responses": responses,
    "flat": flat,
    "litellm": litellm,
    "access-log": access_log,
}
# Shapes ``trace build`` does not read yet (none: the access log's bodies, JSON inside a JSON string, are
# decoded a second time).
UNREAD: frozenset[str] = frozenset()


def lines(shape: str, count: int, seed: int = 0) -> Iterator[str]:
    """``count`` JSON lines of ``shape`` (no newline), arriving ~10 ms apart, the keys of each shuffled."""
    rng = random.Random(f"{shape}:{seed}")
    make = SHAPES[shape]
    time_s = T0_S
    for i in range(count):
        time_s += rng.expovariate(100.0)
        yield _dump(rng, _shuffled(rng, make(rng, i, time_s)))


def mixed_lines(shapes: tuple[str, ...], count: int, seed: int = 0) -> Iterator[str]:
    """``count`` lines on one clock, in time order, each of a shape of ``shapes`` drawn at random
    (one log where several clients or endpoints write their own shape)."""
    rng = random.Random(f"{'+'.join(shapes)}:{seed}")
    time_s = T0_S
    for i in range(count):
        time_s += rng.expovariate(100.0)
        yield _dump(rng, _shuffled(rng, SHAPES[rng.choice(shapes)](rng, i, time_s)))


def write_log(path: Path, shape: str, size_bytes: int, seed: int = 0) -> int:
    """Write lines of ``shape`` (several joined by ``+``: ``mixed_lines``) to ``path`` until it holds
    about ``size_bytes``; returns the line count."""
    written = 0
    count = 0
    stream = (
        mixed_lines(tuple(shape.split("+")), 1 << 40, seed) if "+" in shape else lines(shape, 1 << 40, seed)
    )
    with open(path, "w", encoding="utf-8") as fh:
        for line in stream:
            fh.write(line + "\n")
            written += len(line) + 1
            count += 1
            if written >= size_bytes:
                break
    return count
