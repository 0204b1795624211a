"""The generation engine on a real exported decoder (a tiny random Llama's step graph): the batched,
left-padded cache against each sequence alone, chunked prefill, and the loop's continuous
batching, stopping, cancelling, deadlines, admission by the cache and seeded sampling.

Greedy continuations are deterministic, so every path (one sequence alone, prefilled in chunks,
decoded beside others that join and leave) must give the same tokens, exactly."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ortpack.kernel.contracts.text_generation import TextGenerationSettings
from ortpack.kernel.errors import InputError, InputTooLargeError
from ortpack.kernel.generation.cache import DecodeBatch, Joining
from ortpack.kernel.generation.decoder import Decoder
from ortpack.kernel.generation.engine import Event, GenerationRequest, Generator
from ortpack.kernel.generation.sampling import SamplingParams
from ortpack.kernel.generation.scheduler import CacheFullError, Limits, Scheduler

PROMPTS = [[5, 17, 200, 31], [400, 2, 9, 77, 123, 88, 15, 61, 300], [42], [7, 7, 7, 7, 7, 7, 9, 500, 12, 13, 14, 15]]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ortpack.components.core.export import export_model
    from ortpack.components.core.specs import ExportSpec
    from tests.causal_lms import make_tiny_causal_lm

    root = tmp_path_factory.mktemp("llm")
    checkpoint = make_tiny_causal_lm("llama", root / "tiny-llama")
    out = root / "export"
    export_model(ExportSpec(source=str(checkpoint), task="text-generation", name="tiny-llama"), out)
    return out


@pytest.fixture(scope="module")
def settings(exported: Path) -> TextGenerationSettings:
    from ortpack.components.core.artifacts import ExportResult

    settings = ExportResult.load(exported).settings()
    assert isinstance(settings, TextGenerationSettings)
    return settings


@pytest.fixture(scope="module")
def decoder(exported: Path, settings: TextGenerationSettings) -> Decoder:
    import onnxruntime as ort

    session = ort.InferenceSession(str(exported / "model.onnx"), providers=["CPUExecutionProvider"])
    return Decoder(session, settings.decoder)


@pytest.fixture(scope="module")
def tokenizer(exported: Path) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(exported / "tokenizer.json"))


# ---------------------------------------------------------------- the cache and the decoder


def test_a_left_padded_batch_decodes_each_row_as_it_would_alone(decoder: Decoder) -> None:
    alone = [decoder.greedy(p, 24) for p in PROMPTS]
    batch = DecodeBatch(decoder)
    joining, tokens = [], []
    for key, prompt in enumerate(PROMPTS):
        out = decoder.prefill(prompt)
        joining.append(Joining(key=key, cache=out.present, position=len(prompt)))
        tokens.append([int(np.argmax(out.logits[0, -1]))])
    batch.rebuild([], joining)
    assert batch.length == max(len(p) for p in PROMPTS)
    for _ in range(23):
        logits = batch.step(np.array([t[-1] for t in tokens]))
        for row, token in zip(tokens, logits.argmax(axis=1), strict=True):
            row.append(int(token))
    for got, expected in zip(tokens, alone, strict=True):
        assert got == expected.tolist()


def test_rows_leave_and_join_between_steps_without_changing_the_others(decoder: Decoder) -> None:
    """Row 0 decodes throughout; row 1 leaves after 5 steps; row 2 joins after 8 (its cache much
    shorter than the batch's, padded on the left); the columns nobody needs are dropped."""
    alone = {key: decoder.greedy(PROMPTS[key], 20).tolist() for key in (0, 1, 3)}
    batch = DecodeBatch(decoder)
    made: dict[int, list[int]] = {}

    def join(key: int) -> Joining:
        out = decoder.prefill(PROMPTS[key])
        made[key] = [int(np.argmax(out.logits[0, -1]))]
        return Joining(key=key, cache=out.present, position=len(PROMPTS[key]))

    batch.rebuild([], [join(0), join(1)])
    for step in range(19):
        if step == 5:
            batch.rebuild([0])
        if step == 8:
            batch.rebuild(batch.keys, [join(3)])
        logits = batch.step(np.array([made[k][-1] for k in batch.keys]))
        for key, token in zip(batch.keys, logits.argmax(axis=1), strict=True):
            made[key].append(int(token))
    assert made[0] == alone[0][:20]
    assert made[1] == alone[1][:6]
    assert made[3] == alone[3][: len(made[3])]
    assert batch.length == len(PROMPTS[0]) + 19  # row 0's, the longest
    assert batch.real_tokens() == int(batch.mask.sum())


def test_chunked_prefill_gives_the_same_continuation(decoder: Decoder) -> None:
    prompt = PROMPTS[3]
    whole = decoder.greedy(prompt, 16)
    for chunk in (1, 3, 5):
        assert decoder.greedy(prompt, 16, chunk=chunk).tolist() == whole.tolist()


# ---------------------------------------------------------------- the scheduler's arithmetic


def test_admission_holds_prompt_plus_max_tokens_and_refuses_beyond_capacity() -> None:
    scheduler = Scheduler(Limits(capacity=100, context=80, max_waiting=3))
    scheduler.admit(60)
    with pytest.raises(CacheFullError, match="60 of 100 tokens; this one needs 50"):
        scheduler.admit(50)
    with pytest.raises(InputTooLargeError, match="context is 80"):
        scheduler.admit(81)
    scheduler.admit(40)
    scheduler.started()
    scheduler.release(60, waiting=True)
    assert (scheduler.reserved, scheduler.waiting) == (40, 0)
    with pytest.raises(InputError, match="holds at most 50"):
        Scheduler(Limits(capacity=50, context=80)).admit(60)


def test_the_waiting_queue_is_bounded() -> None:
    scheduler = Scheduler(Limits(capacity=1000, context=100, max_waiting=2))
    scheduler.admit(10)
    scheduler.admit(10)
    with pytest.raises(CacheFullError, match="2 requests are waiting"):
        scheduler.admit(10)


def test_a_row_joins_only_while_the_padded_batch_fits() -> None:
    scheduler = Scheduler(Limits(capacity=1000, context=500, max_running=4))
    assert scheduler.can_join(0, 0, 900)  # alone it always fits (admission checked its need)
    assert scheduler.can_join(1, 400, 100)  # 2 x 400
    assert not scheduler.can_join(2, 400, 100)  # 3 x 400 > 1000: it waits for a row to leave
    assert not scheduler.can_join(4, 10, 10)  # max_running


def test_prefill_chunks_keep_within_a_decode_steps_time() -> None:
    scheduler = Scheduler(Limits(capacity=10_000, context=4000, max_chunk=512, min_chunk=16, prefill_share=1.0))
    assert scheduler.chunk(2000, decoding=False) == 512  # nothing else waits: the largest chunk
    assert scheduler.chunk(100, decoding=True) == 100  # no times measured yet
    scheduler.decode_s.observe(0.040)
    for tokens in (16, 64, 128):  # 10 ms whatever the size, and 0.5 ms a token
        scheduler.prefill.observe(tokens, 0.010 + 0.0005 * tokens)
    fixed, per_token, per_past = scheduler.prefill.fit() or (0, 0, 0)
    assert (round(fixed, 6), round(per_token, 6), per_past) == (0.01, 0.0005, 0.0)
    assert scheduler.chunk(2000, decoding=True) == 60  # (40 ms - 10 ms) / 0.5 ms beside a 40 ms decode step
    assert scheduler.chunk(2000, decoding=False) == 512
    assert scheduler.chunk(85, decoding=True) == 85  # at most half a chunk more: all of it at once
    assert scheduler.chunk(95, decoding=True) == 60
    for past in (0, 1000, 2000):  # a chunk's cache before it costs too: 5 us a token of it
        scheduler.prefill.observe(64, 0.010 + 0.0005 * 64 + 0.000005 * past, past)
    assert scheduler.chunk(2000, decoding=True, past=0) == 60
    assert scheduler.chunk(2000, decoding=True, past=2000) == 40  # (40 - 10 - 10) ms / 0.5 ms
    for _ in range(64):
        scheduler.prefill.observe(16, 0.5)  # slow calls: never below the least chunk
    assert scheduler.chunk(2000, decoding=True) == 16


# ---------------------------------------------------------------- the loop


class Collected:
    """A request's events, collected on the loop's thread."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.done = threading.Event()

    def __call__(self, event: Event) -> None:
        self.events.append(event)
        if event.finish_reason is not None:
            self.done.set()

    def wait(self, timeout: float = 60) -> Event:
        assert self.done.wait(timeout), "the sequence did not finish"
        return self.events[-1]

    @property
    def tokens(self) -> list[int]:
        return [t for e in self.events for t in e.tokens]

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events)


@pytest.fixture
def loop(decoder: Decoder, tokenizer: Any, settings: TextGenerationSettings) -> Iterator[Generator]:
    generator = Generator(
        decoder, tokenizer, settings.generation.eos_token_ids, Limits(capacity=4000, context=512, max_running=8)
    )
    generator.warm_up()
    generator.start()
    yield generator
    generator.stop(timeout_s=10)


def greedy(prompt: list[int], max_tokens: int, **kw: Any) -> GenerationRequest:
    return GenerationRequest(
        prompt=prompt, max_tokens=max_tokens, sampling=SamplingParams(temperature=0), ignore_eos=True, **kw
    )


def test_sequences_that_join_and_leave_get_each_alone_continuation(loop: Generator, decoder: Decoder) -> None:
    lengths = [30, 7, 22, 3]
    sinks = []
    for i, (prompt, length) in enumerate(zip(PROMPTS, lengths, strict=True)):
        sink = Collected()
        loop.submit(greedy(prompt, length), sink)
        sinks.append(sink)
        time.sleep(0.01 * i)  # they arrive while others decode
    for sink, prompt, length in zip(sinks, PROMPTS, lengths, strict=True):
        last = sink.wait()
        assert last.finish_reason == "length"
        assert (last.prompt_tokens, last.completion_tokens) == (len(prompt), length)
        assert sink.tokens == decoder.greedy(prompt, length).tolist()
    assert loop.scheduler.reserved == 0 and loop.running == 0


def test_the_text_is_the_tokens_decoded_and_a_stop_string_ends_it(loop: Generator, tokenizer: Any) -> None:
    whole = Collected()
    loop.submit(greedy(PROMPTS[1], 40), whole)
    whole.wait()
    assert whole.text == tokenizer.decode(whole.tokens)
    stop = whole.text[len(whole.text) // 2 : len(whole.text) // 2 + 3]
    assert stop.strip(), whole.text
    cut = Collected()
    loop.submit(greedy(PROMPTS[1], 40, stop=(stop,)), cut)
    assert cut.wait().finish_reason == "stop"
    assert cut.text == whole.text[: whole.text.index(stop)]


def test_an_end_of_sequence_id_stops_unless_ignored(
    loop: Generator, decoder: Decoder, settings: TextGenerationSettings
) -> None:
    continuation = decoder.greedy(PROMPTS[2], 30).tolist()
    stop_id = continuation[10]
    first = continuation.index(stop_id)
    sink = Collected()
    request = GenerationRequest(
        prompt=PROMPTS[2], max_tokens=30, sampling=SamplingParams(temperature=0), stop_token_ids=(stop_id,)
    )
    loop.submit(request, sink)
    last = sink.wait()
    assert last.finish_reason == "stop" and sink.tokens == continuation[: first + 1]


def test_a_cancelled_sequence_frees_its_place_at_the_next_step(loop: Generator) -> None:
    sink = Collected()
    handle = loop.submit(greedy(PROMPTS[0], 400), sink)
    deadline = time.monotonic() + 30
    while not sink.events and time.monotonic() < deadline:
        time.sleep(0.005)
    handle.cancel()
    last = sink.wait()
    assert last.finish_reason == "cancelled" and last.completion_tokens < 400
    assert loop.scheduler.reserved == 0 and loop.running == 0


def test_a_request_past_its_deadline_before_its_first_token_ends_so(loop: Generator) -> None:
    sink = Collected()
    loop.submit(greedy(PROMPTS[0], 10, deadline=time.perf_counter() - 1), sink)
    last = sink.wait()
    assert last.finish_reason == "deadline" and last.completion_tokens == 0 and not sink.tokens


def test_the_cache_budget_refuses_what_does_not_fit_and_frees_it_after(
    decoder: Decoder, tokenizer: Any, settings: TextGenerationSettings
) -> None:
    generator = Generator(decoder, tokenizer, settings.generation.eos_token_ids, Limits(capacity=100, context=90))
    generator.start()
    try:
        first = Collected()
        generator.submit(greedy(PROMPTS[0], 60), first)
        with pytest.raises(CacheFullError):
            generator.submit(greedy(PROMPTS[0], 60), Collected())
        with pytest.raises(InputTooLargeError):
            generator.submit(greedy(PROMPTS[0], 95), Collected())
        first.wait()
        again = Collected()
        generator.submit(greedy(PROMPTS[0], 60), again)
        assert again.wait().finish_reason == "length"
    finally:
        generator.stop(timeout_s=10)


def test_a_seed_reproduces_a_sampled_continuation(loop: Generator) -> None:
    def sample(seed: int) -> list[int]:
        sink = Collected()
        params = SamplingParams(temperature=1.0, top_p=0.95, seed=seed)
        loop.submit(GenerationRequest(prompt=PROMPTS[1], max_tokens=20, sampling=params, ignore_eos=True), sink)
        sink.wait()
        return sink.tokens

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)


def test_logprobs_come_with_each_token(loop: Generator) -> None:
    sink = Collected()
    params = SamplingParams(temperature=0, logprobs=3)
    loop.submit(GenerationRequest(prompt=PROMPTS[0], max_tokens=5, sampling=params, ignore_eos=True), sink)
    sink.wait()
    picks = [p for e in sink.events for p in e.logprobs]
    assert [p.token for p in picks] == sink.tokens
    for pick in picks:
        assert pick.logprob is not None and pick.logprob <= 0 and len(pick.top) == 3
        assert pick.top[0][0] == pick.token  # greedy: the best is the one taken


class StepsRecorded:
    """A loop observer that keeps each step's kind and token count (the others are not needed)."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, int]] = []

    def first_token(self, seconds: float) -> None: ...

    def token_gap(self, seconds: float) -> None: ...

    def finished(self, reason: str, prompt: int, completion: int) -> None: ...

    def step(self, kind: str, seconds: float, tokens: int) -> None:
        self.steps.append((kind, tokens))


def test_a_long_prompt_is_prefilled_in_chunks_while_others_decode(
    decoder: Decoder, tokenizer: Any, settings: TextGenerationSettings
) -> None:
    recorded = StepsRecorded()
    steps = recorded.steps

    limits = Limits(capacity=4000, context=512, max_chunk=64, min_chunk=16, prefill_share=0.5)
    generator = Generator(decoder, tokenizer, settings.generation.eos_token_ids, limits, observer=recorded)
    generator.warm_up()
    generator.start()
    try:
        running = Collected()
        generator.submit(greedy(PROMPTS[0], 200), running)
        while not running.events:
            time.sleep(0.005)
        long_prompt = [int(i) for i in np.random.default_rng(0).integers(3, 1000, 300)]
        late = Collected()
        generator.submit(greedy(long_prompt, 4), late)
        late.wait()
        running.wait()
        assert late.tokens == decoder.greedy(long_prompt, 4).tolist()
        prefills = [n for kind, n in steps if kind == "prefill"]
        assert sum(prefills[1:]) == len(long_prompt)  # the first was the short prompt's
        assert len(prefills) >= 1 + len(long_prompt) // 64 and max(prefills[1:]) <= 64
    finally:
        generator.stop(timeout_s=10)


def test_short_prompts_waiting_together_are_prefilled_in_one_call(
    decoder: Decoder, tokenizer: Any, settings: TextGenerationSettings
) -> None:
    recorded = StepsRecorded()
    steps = recorded.steps

    generator = Generator(
        decoder, tokenizer, settings.generation.eos_token_ids, Limits(capacity=4000, context=512), observer=recorded
    )
    sinks = [Collected() for _ in PROMPTS]
    for prompt, sink in zip(PROMPTS, sinks, strict=True):
        generator.submit(greedy(prompt, 12), sink)  # all waiting before the loop's first step
    generator.start()
    try:
        for prompt, sink in zip(PROMPTS, sinks, strict=True):
            sink.wait()
            assert sink.tokens == decoder.greedy(prompt, 12).tolist()  # left-padded together, each as alone
    finally:
        generator.stop(timeout_s=10)
    assert [n for kind, n in steps if kind == "prefill"] == [sum(len(p) for p in PROMPTS)]


def test_a_stopped_loop_refuses_and_ends_what_was_left(
    decoder: Decoder, tokenizer: Any, settings: TextGenerationSettings
) -> None:
    from ortpack.kernel.generation.engine import LoopStoppedError

    generator = Generator(decoder, tokenizer, settings.generation.eos_token_ids, Limits(capacity=4000, context=512))
    generator.start()
    sink = Collected()
    generator.submit(greedy(PROMPTS[0], 400), sink)
    generator.stop(timeout_s=0.05)
    assert sink.wait().finish_reason == "cancelled"
    with pytest.raises(LoopStoppedError):
        generator.submit(greedy(PROMPTS[0], 4), Collected())
