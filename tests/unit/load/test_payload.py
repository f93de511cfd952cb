"""Request bodies carry exactly the trace's lengths; the request order follows the options."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomload.errors import ConfigError
from oomload.load.payload import (
    CHAT_SLACK_TOKENS,
    WORDS,
    Calibrator,
    ChatPayloads,
    CompletionPayloads,
    PayloadOptions,
    RequestOrder,
    conversation_units,
    parse_token_id_range,
)
from oomload.trace.model import TraceRecord


def _record(prompt: int, output: int, rid: str = "r0", hash_ids: tuple[int, ...] = ()) -> TraceRecord:
    return TraceRecord(id=rid, arrival_s=0.0, prompt_tokens=prompt, output_tokens=output, hash_ids=hash_ids)


@given(prompt=st.integers(0, 3000), output=st.integers(0, 500), seq=st.integers(0, 10_000))
def test_completion_body_has_exact_lengths(prompt: int, output: int, seq: int) -> None:
    payloads = CompletionPayloads(PayloadOptions(model="m", token_id_low=10, token_id_high=50))
    req = payloads.build(_record(prompt, output), seq)
    body = json.loads(req.body)
    assert len(body["prompt"]) == max(1, prompt) == req.prompt_tokens
    assert all(10 <= t < 50 for t in body["prompt"])
    assert body["max_tokens"] == body["min_tokens"] == max(1, output) == req.output_tokens
    assert body["ignore_eos"] is True and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert req.path == "/v1/completions" and body["model"] == "m"
    assert (req.usage_prompt_tokens, req.usage_slack_tokens) == (len(body["prompt"]), 0)  # held exactly


def test_prompts_are_distinct_and_reproducible() -> None:
    payloads = CompletionPayloads(PayloadOptions(model="m", seed=7))
    a, b = payloads.build(_record(64, 4), 0), payloads.build(_record(64, 4), 1)
    assert json.loads(a.body)["prompt"] != json.loads(b.body)["prompt"]
    again = CompletionPayloads(PayloadOptions(model="m", seed=7)).build(_record(64, 4), 0)
    assert again.body == a.body


def test_shared_prefixes_are_the_default_and_reuse_blocks_from_hash_ids() -> None:
    payloads = CompletionPayloads(PayloadOptions(model="m", prefix_block_tokens=16))
    a = json.loads(payloads.build(_record(40, 1, hash_ids=(5, 9, 11)), 0).body)["prompt"]
    b = json.loads(payloads.build(_record(40, 1, hash_ids=(5, 9, 12)), 1).body)["prompt"]
    assert len(a) == len(b) == 40
    assert a[:32] == b[:32]  # blocks 5 and 9 shared; the third block would overflow 40 tokens
    assert a[32:] != b[32:]


def test_distinct_prompts_share_nothing_even_with_hash_ids() -> None:
    payloads = CompletionPayloads(PayloadOptions(model="m", prefix_sharing=False, prefix_block_tokens=16))
    a = json.loads(payloads.build(_record(40, 1, hash_ids=(5, 9)), 0).body)["prompt"]
    b = json.loads(payloads.build(_record(40, 1, hash_ids=(5, 9)), 1).body)["prompt"]
    assert len(a) == len(b) == 40 and a[:16] != b[:16]


@given(
    prompt=st.integers(0, 200),
    block=st.integers(1, 48),
    ids=st.lists(st.integers(0, 5), max_size=8),
    seq=st.integers(0, 50),
)
def test_shared_prefix_prompts_keep_exact_lengths(prompt: int, block: int, ids: list[int], seq: int) -> None:
    payloads = CompletionPayloads(PayloadOptions(model="m", prefix_block_tokens=block), trace_requests=7)
    req = payloads.build(_record(prompt, 3, hash_ids=tuple(ids)), seq)
    assert len(json.loads(req.body)["prompt"]) == max(1, prompt) == req.prompt_tokens


def test_an_id_gives_the_same_tokens_in_every_process_and_step() -> None:
    """Workers share no state: two builders (two processes, offsets 0 and 1 of stride 2) map an id to
    the same tokens, whatever step or sequence number sends it; the suffix is fresh per send."""
    opts = PayloadOptions(model="m", prefix_block_tokens=8, seed=3)
    one, two = CompletionPayloads(opts, trace_requests=100), CompletionPayloads(opts, trace_requests=100)
    a = json.loads(one.build(_record(20, 1, hash_ids=(1, 2)), 0).body)["prompt"]
    b = json.loads(two.build(_record(20, 1, hash_ids=(1, 2)), 57).body)["prompt"]
    assert a[:16] == b[:16] and a[16:] != b[16:]
    other_seed = CompletionPayloads(PayloadOptions(model="m", prefix_block_tokens=8, seed=4))
    c = json.loads(other_seed.build(_record(20, 1, hash_ids=(1, 2)), 0).body)["prompt"]
    assert c[:8] != a[:8]


def test_another_runs_salt_gives_other_tokens_of_the_same_shape() -> None:
    """A rerun against a long-lived server must not find the last run's prompts cached: each run's salt
    changes every token (shared blocks and suffixes alike) but neither a length nor what is shared."""
    record = _record(40, 3, hash_ids=(5, 9))
    bodies = []
    for salt in (0, 1, 2**47):
        payloads = CompletionPayloads(
            PayloadOptions(model="m", prefix_block_tokens=16, seed=3, prompt_salt=salt)
        )
        first, second = (json.loads(payloads.build(record, n).body)["prompt"] for n in (0, 1))
        assert len(first) == len(second) == 40 and first[:32] == second[:32] and first[32:] != second[32:]
        bodies.append(first)
    assert bodies[0][:16] != bodies[1][:16] != bodies[2][:16] and bodies[0][32:] != bodies[1][32:]
    chat = [
        PayloadOptions(api="chat", model="m", seed=3, prompt_salt=salt).sequence_seed(0) for salt in (0, 1)
    ]
    assert chat[0] != chat[1]  # the chat API's shuffle of its calibrated words is the run's own too


def test_a_later_pass_through_the_trace_maps_ids_to_new_tokens() -> None:
    """Replaying the trace again must not hit blocks its own earlier copy left cached (vLLM #52884)."""
    payloads = CompletionPayloads(PayloadOptions(model="m", prefix_block_tokens=8), trace_requests=10)
    first = json.loads(payloads.build(_record(16, 1, hash_ids=(4,)), 3).body)["prompt"]
    same_pass = json.loads(payloads.build(_record(16, 1, hash_ids=(4,)), 9).body)["prompt"]
    next_pass = json.loads(payloads.build(_record(16, 1, hash_ids=(4,)), 13).body)["prompt"]
    assert first[:8] == same_pass[:8] != next_pass[:8]


def test_no_exact_output_and_no_stream() -> None:
    opts = PayloadOptions(model="m", exact_output=False, stream=False)
    body = json.loads(CompletionPayloads(opts).build(_record(5, 7), 0).body)
    assert body["max_tokens"] == 7 and "min_tokens" not in body and "ignore_eos" not in body
    assert body["stream"] is False and "stream_options" not in body


def test_chat_calibration_hits_the_exact_count() -> None:
    calls: list[str] = []

    def count(text: str) -> int:  # a fake tokenizer: 5 template tokens + one token per word
        calls.append(text)
        return 5 + len(text.split())

    payloads = ChatPayloads(PayloadOptions(api="chat", model="m"), count)
    req = payloads.build(_record(120, 3), 0)
    body = json.loads(req.body)
    content = body["messages"][0]["content"]
    assert 5 + len(content.split()) == 120
    assert req.path == "/v1/chat/completions"
    assert (req.usage_prompt_tokens, req.usage_slack_tokens) == (120, CHAT_SLACK_TOKENS)
    n = len(calls)
    other = json.loads(payloads.build(_record(120, 3), 1).body)["messages"][0]["content"]
    assert len(calls) == n  # cached per length
    assert other != content and sorted(other.split()) == sorted(content.split())


def test_calibrator_pads_when_words_cost_two_tokens() -> None:
    def count(text: str) -> int:  # each pool word 2 tokens, single letters 1
        return sum(1 if len(w) == 1 else 2 for w in text.split())

    words, counted = Calibrator(count).calibrated(11)
    assert count(" ".join(words)) == counted == 11


@given(
    template=st.integers(0, 40),
    word_cost=st.integers(1, 3),
    target=st.integers(0, 400),
    max_probes=st.integers(0, 24),
)
def test_the_calibrated_count_is_the_count_of_the_words_sent(
    template: int, word_cost: int, target: int, max_probes: int
) -> None:
    """The server's usage is held to ``calibrated``'s count: it must be what the words measure, also
    when the template alone exceeds the target or the probes run out."""

    def count(text: str) -> int:
        return template + sum(1 if len(w) == 1 else word_cost for w in text.split())

    words, counted = Calibrator(count, max_probes=max_probes).calibrated(target)
    assert counted == count(" ".join(words))


@given(
    template=st.integers(0, 30),
    costs=st.lists(st.integers(1, 5), min_size=len(WORDS), max_size=len(WORDS)),
    filler_cost=st.integers(1, 2),
    targets=st.lists(st.integers(0, 2000), min_size=1, max_size=40),
)
def test_calibration_finds_the_longest_fitting_words_whatever_it_already_knows(
    template: int, costs: list[int], filler_cost: int, targets: list[int]
) -> None:
    """One calibrator over many lengths, in any order (the counts it keeps steer the next search): each
    length gets the most pool words whose count fits, then fillers that do not overshoot."""
    cost = dict(zip(WORDS, costs, strict=True))

    def count(text: str) -> int:
        return template + sum(cost.get(w, filler_cost) for w in text.split())

    calibrator = Calibrator(count)
    for target in targets:
        words, counted = calibrator.calibrated(target)
        assert counted == count(" ".join(words))
        n = sum(1 for w in words if w in cost)
        if template > target:
            assert words == () and counted == template
            continue
        assert counted <= target
        assert count(" ".join(calibrator.pool_words(n + 1))) > target  # no more pool words fit
        if filler_cost == 1:
            assert counted == target or len(words) - n == len(Calibrator.FILLERS)


def test_counts_kept_while_another_user_waits_on_its_own_stay_in_order() -> None:
    """Users (greenlets) share a calibrator and each waits on /tokenize: here every count lets another
    length be calibrated meanwhile, as another user would. Before, the waiting one kept its count where
    it had looked before the wait, so the table went out of order and later lengths came out wrong."""
    calibrator: Calibrator
    pending = [3000, 40, 1700, 900, 2500, 10]

    def count(text: str) -> int:
        if pending:
            calibrator.calibrated(pending.pop())  # another user's calibration, during this wait
        return 7 + 2 * len(text.split())

    calibrator = Calibrator(count)
    targets = [1201, 333, 2999, 57, 1800, 1201]
    results = [calibrator.calibrated(t) for t in targets]
    assert calibrator._known_n == sorted(calibrator._known_n)
    assert calibrator._known_tokens == sorted(calibrator._known_tokens)
    for target, (words, counted) in zip(targets, results, strict=True):
        assert counted == count(" ".join(words)) <= target and target - counted <= 1


def test_a_warm_calibrator_needs_a_few_probes_a_length() -> None:
    """A bisection per length needs about log₂ 4000 = 12 probes; with the counts kept, a few (fillers
    included). The tiny Llama's tokenizer on the Azure code trace's lengths: 10.7 → 1.8."""
    rng = random.Random(7)
    cost = {w: rng.randint(1, 4) for w in WORDS}

    def count(text: str) -> int:
        return 12 + sum(cost.get(w, 1) for w in text.split())

    calibrator = Calibrator(count)
    targets = [rng.randint(20, 4000) for _ in range(400)]
    for target in targets:
        assert calibrator.calibrated(target)[1] == target
    assert calibrator.probes / len(set(targets)) < 4  # 2.9 here


def test_request_order_trace_sample_and_tail() -> None:
    records = [_record(p, 10, f"r{p}") for p in range(1, 101)]
    order = RequestOrder(records)
    assert [order.next()[0].id for _ in range(3)] == ["r1", "r2", "r3"]
    tail = RequestOrder(records, mode="sample", seed=3, tail_percentile=90)
    picks = [tail.next() for _ in range(50)]
    assert all(r.prompt_tokens >= 90 for r, _ in picks)
    assert [seq for _, seq in picks] == list(range(50))
    again = RequestOrder(records, mode="sample", seed=3, tail_percentile=90)
    assert [again.next()[0].id for _ in range(50)] == [r.id for r, _ in picks]


def test_bad_options_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        PayloadOptions(token_id_low=5, token_id_high=5)
    with pytest.raises(ConfigError):
        RequestOrder([])
    with pytest.raises(ConfigError):
        parse_token_id_range("100")
    assert parse_token_id_range("3:900") == (3, 900)


def test_a_prompt_over_max_model_len_is_sent_one_token_over_it_and_keeps_its_asked_length() -> None:
    """Issue #24: a 10⁹-token row made the replay build a billion-id list although max_model_len was known."""
    options = PayloadOptions(model="m", max_model_len=2048, prefix_sharing=True, prefix_block_tokens=16)
    payloads = CompletionPayloads(options)
    req = payloads.build(_record(10_000_000, 10_000_000, hash_ids=tuple(range(625_000))), 0)
    body = json.loads(req.body)
    assert len(body["prompt"]) == 2049  # still a context overflow for the server
    assert req.prompt_tokens == 10_000_000 and req.output_tokens == 10_000_000  # the row keeps the trace's
    assert len(req.body) < 20_000
    fits = payloads.build(_record(2048, 5), 1)
    assert len(json.loads(fits.body)["prompt"]) == 2048  # within the limit: exactly the trace's length
    unknown = CompletionPayloads(PayloadOptions(model="m")).build(_record(3000, 5), 0)
    assert len(json.loads(unknown.body)["prompt"]) == 3000  # no known limit: as the trace says


def test_a_chat_prompt_over_max_model_len_is_calibrated_to_one_token_over_it() -> None:
    asked: list[int] = []
    payloads = ChatPayloads(
        PayloadOptions(api="chat", model="m", max_model_len=100), lambda text: len(text.split())
    )
    original = payloads.calibrator.calibrated

    def spy(prompt_tokens: int) -> tuple[tuple[str, ...], int]:
        asked.append(prompt_tokens)
        return original(prompt_tokens)

    payloads.calibrator.calibrated = spy  # type: ignore[method-assign]
    req = payloads.build(_record(10_000_000, 5), 0)
    assert asked == [101] and req.prompt_tokens == 10_000_000 and req.usage_prompt_tokens == 101
    assert len(json.loads(req.body)["messages"][0]["content"].split()) == 101


@pytest.mark.parametrize("mode", ["trace", "sample"])
def test_conversations_are_whole_units_with_sequence_numbers_unique_across_workers(mode: str) -> None:
    records = [
        TraceRecord("a0", 0.0, 8, 1, session="A", turn=0),
        TraceRecord("b0", 0.0, 8, 1, session="B", turn=0),
        TraceRecord("a1", 0.0, 8, 1, session="A", turn=1),
        TraceRecord("c", 0.0, 8, 1),
    ]
    workers = [RequestOrder(records, mode=mode, offset=k, stride=2, seed=5) for k in range(2)]  # type: ignore[arg-type]
    sequences: list[int] = []
    for _ in range(7):
        for order in workers:
            unit = order.next_unit()
            assert [r.id for r, _ in unit] in (["a0", "a1"], ["b0"], ["c"])
            sequences += [seq for _, seq in unit]
            if mode == "trace":  # the pass through the trace, from the sequence number alone
                assert {seq // len(records) for _, seq in unit} == {
                    (order.offset + order._next_unit * 2 - 2) // 3
                }
    assert len(sequences) == len(set(sequences))
    assert workers[0].pass_length == (4 if mode == "trace" else 0)


def test_turns_found_from_the_chains_go_out_in_order_from_one_user() -> None:
    records = [
        TraceRecord("a", 0.0, 40, 1, hash_ids=(1, 2)),
        TraceRecord("b", 1.0, 70, 1, hash_ids=(1, 2, 3, 4)),  # a's history and more: a's next turn
        TraceRecord("c", 2.0, 50, 1, hash_ids=(1, 2, 5)),  # a's history again, but a went on with b
        TraceRecord("s", 3.0, 8, 1, session="S", turn=0),
        TraceRecord("d", 4.0, 90, 1, hash_ids=(1, 2, 3, 4, 6)),  # b's next turn
        TraceRecord("e", 5.0, 8, 1),  # no chain: alone
        TraceRecord("f", 6.0, 60, 1, hash_ids=(1, 2, 5, 7)),  # c's next turn
        TraceRecord("g", 7.0, 40, 1, hash_ids=(1, 2)),  # a's chain once more: a was continued (by b)
    ]
    assert conversation_units(records) == [(0, 1, 4), (2, 6), (3,), (5,), (7,)]
    order = RequestOrder(records)
    assert [[r.id for r, _ in order.next_unit()] for _ in range(5)] == [
        ["a", "b", "d"],
        ["c", "f"],
        ["s"],
        ["e"],
        ["g"],
    ]


def test_requests_with_one_chain_are_repeats_not_one_conversation() -> None:
    """2,000 requests that share only a system prompt's chain (the issue-32 traffic): each is a
    conversation of its own, sent at the level's concurrency — not one conversation of 2,000 turns sent
    one at a time. A request that goes on past an earlier chain is still its next turn."""
    from oomload.load.payload import conversation_units
    from oomload.trace.model import TraceRecord

    shared = tuple(range(1, 17))
    same = [TraceRecord(f"r{i}", 0.0, 600, 100, hash_ids=shared) for i in range(50)]
    assert all(len(u) == 1 for u in conversation_units(same, 32))
    turn = TraceRecord("t", 0.0, 700, 100, hash_ids=(*shared, 99, 100, 101))
    assert conversation_units([*same[:2], turn], 32) == [(0,), (1, 2)]  # the latest end is continued


def test_request_order_keeps_only_the_requests_that_fit() -> None:
    """``--only-fitting``: prompt + output within the window (each at least one token, as sent); the
    tail percentile is then taken over what fits. None fitting is a ``ConfigError`` naming the limit."""
    records = [_record(p, 100, f"r{p}") for p in (100, 900, 1948, 1949, 5000)]
    fitting = RequestOrder(records, fit_within=2048)
    assert [r.id for r in fitting.records] == ["r100", "r900", "r1948"]
    tail = RequestOrder(records, fit_within=2048, tail_percentile=60)
    assert [r.id for r in tail.records] == ["r900", "r1948"]
    assert [r.id for r in RequestOrder([_record(0, 0, "empty")], fit_within=2).records] == ["empty"]
    none_fit = "none of the trace's 5 requests fits the server's max_model_len 64"
    with pytest.raises(ConfigError, match=none_fit):
        RequestOrder(records, fit_within=64)
