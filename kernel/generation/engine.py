"""The generation loop: sequences in, tokens out as they are made, on a thread of its own.

`Generator.submit` admits a request (or refuses it: the scheduler's rules) and returns a
`Handle`; from then on the loop calls the request's sink with an `Event` per step that produced
text, and a last one with the finish reason. Each step of the loop:

1. decodes one token for every running sequence, in one batch (cache.py);
2. prefills a chunk of the next waiting prompt, sized by the scheduler (or, when it fits in one
   chunk, it and the short prompts behind it in one call); a prompt whose prefill ends gets its
   first token at once (time to first token) and joins the batch;
3. ends the sequences that stopped (an end-of-sequence or stop id, a stop string, max_tokens, the
   context), were cancelled (their client went away) or passed their deadline, and rebuilds the
   batch once for every change.

Sinks are called on the loop's thread and must not block (the server's puts the event on its
request's asyncio queue). ONNX Runtime releases the GIL while a step runs, so the event loop
answers other requests meanwhile.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ortpack.kernel.errors import InputError
from ortpack.kernel.generation.cache import DecodeBatch, Joining
from ortpack.kernel.generation.decoder import Cache, Decoder, LogitsRule, as_array, cache_nbytes
from ortpack.kernel.generation.sampling import Pick, Sampler, SamplingParams, pick_greedy_batch
from ortpack.kernel.generation.scheduler import Limits, Scheduler
from ortpack.kernel.generation.text import TextStream

log = logging.getLogger("ortpack.generation")

PREFIX_IDS = 8  # prompt ids decoded as context before the first generated token (a leading space)


class LoopStoppedError(RuntimeError):
    """The loop is shutting down and takes no new requests (a server answers 503)."""


@dataclass(frozen=True, kw_only=True)
class GenerationRequest:
    """One sequence to generate: its prompt ids, how many tokens at most, how to pick them, and
    what stops it besides the model's end-of-sequence ids (`ignore_eos`: those do not)."""

    prompt: Sequence[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    deadline: float | None = None  # for the first token, on the generator's clock
    # the sequence's context, fed beside its cache at every step (the decoder's `context_names`:
    # Whisper's cross-attention keys and values of its audio window), batch 1 each
    context: Sequence[Any] = ()
    # rules over each next token's logits, in order, before it is picked (Whisper's suppressed tokens)
    rules: tuple[LogitsRule, ...] = ()

    def __post_init__(self) -> None:
        if not self.prompt:
            raise InputError("the prompt is empty")
        if self.max_tokens < 1:
            raise InputError(f"max_tokens must be at least 1, got {self.max_tokens}")

    def pick(self, sampler: Sampler, generated: Sequence[int], row: np.ndarray) -> Pick:
        """The next token from one row of logits (changed in place by the rules)."""
        for rule in self.rules:
            rule(generated, row)
        return sampler.pick(row)


@dataclass(frozen=True, slots=True)
class Event:
    """What one step made for one sequence: new text and its token ids (with their logprobs when
    asked); the last event has `finish_reason` ("stop", "length", "cancelled", "deadline",
    "error") and the counts."""

    text: str = ""
    tokens: tuple[int, ...] = ()
    logprobs: tuple[Pick, ...] = ()
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str = ""


class Observer(Protocol):
    """What the loop reports as it runs (a server's metrics)."""

    def first_token(self, seconds: float) -> None: ...

    def token_gap(self, seconds: float) -> None: ...

    def finished(self, reason: str, prompt_tokens: int, completion_tokens: int) -> None: ...

    def step(self, kind: str, seconds: float, tokens: int) -> None: ...


class Handle:
    """A submitted request: `cancel()` ends it at the loop's next step (its sink gets a last event
    with finish reason "cancelled")."""

    def __init__(self, generator: Generator) -> None:
        self._generator = generator
        self.cancelled = False

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self._generator.wake()


class _Sequence:
    """One request in the loop: its state, cache (while prefilling), sampler and text."""

    __slots__ = (
        "arrival",
        "cache",
        "generated",
        "handle",
        "key",
        "last_token_at",
        "need",
        "prefilled",
        "request",
        "sampler",
        "sink",
        "stops",
        "text",
    )

    def __init__(
        self, key: int, request: GenerationRequest, sink: Callable[[Event], None], handle: Handle, **kw: Any
    ) -> None:
        self.key, self.request, self.sink, self.handle = key, request, sink, handle
        self.need = len(request.prompt) + request.max_tokens
        self.arrival: float = kw["arrival"]
        self.sampler = Sampler(request.sampling)
        self.text = TextStream(kw["tokenizer"], stop=request.stop, prefix_ids=list(request.prompt[-PREFIX_IDS:]))
        self.stops: frozenset[int] = kw["stops"]
        self.cache: Cache | None = None
        self.prefilled = 0
        self.generated: list[int] = []
        self.last_token_at: float | None = None


class Generator:
    """The loop over one decoder session. `submit` is thread-safe; `start` runs the loop on a
    daemon thread, `stop` ends it."""

    def __init__(
        self,
        decoder: Decoder,
        tokenizer: Any,
        eos_token_ids: Iterable[int],
        limits: Limits,
        *,
        observer: Observer | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.scheduler = Scheduler(limits)
        self.observer = observer
        self.clock = clock
        self.eos = frozenset(eos_token_ids)
        self._cond = threading.Condition()
        self._incoming: deque[_Sequence] = deque()
        self._waiting: deque[_Sequence] = deque()
        self._prefilling: _Sequence | None = None
        self._running: dict[int, _Sequence] = {}
        self._batch = DecodeBatch(decoder)
        self._keys = itertools.count()
        self._thread: threading.Thread | None = None
        self._accepting = True
        self._stopping = False

    # -- what callers see

    @property
    def limits(self) -> Limits:
        return self.scheduler.limits

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return self.scheduler.waiting + (1 if self._prefilling is not None else 0)

    def cache_bytes(self) -> int:
        """The key/value cache held now: the running batch's and the prefilling sequence's."""
        own = self._prefilling.cache if self._prefilling is not None else None
        return self._batch.nbytes + (cache_nbytes(own) if own else 0)

    def check_context(self, request: GenerationRequest) -> None:
        """A request's context must be what the decoder takes (none for a decoder-only model)."""
        names = self.decoder.context_names
        if len(request.context) != len(names):
            raise InputError(f"the decoder takes {len(names)} context tensors, the request has {len(request.context)}")

    def submit(self, request: GenerationRequest, sink: Callable[[Event], None]) -> Handle:
        """Admit `request` (InputError: it can never fit; CacheFullError: not now) and start
        streaming its events to `sink`."""
        self.check_context(request)
        handle = Handle(self)
        with self._cond:
            if not self._accepting:
                raise LoopStoppedError("the server is shutting down")
            self.scheduler.admit(len(request.prompt) + request.max_tokens)
            stops = frozenset(request.stop_token_ids) | (frozenset() if request.ignore_eos else self.eos)
            seq = _Sequence(
                next(self._keys), request, sink, handle, arrival=self.clock(), tokenizer=self.tokenizer, stops=stops
            )
            self._incoming.append(seq)
            self._cond.notify()
        return handle

    def retry_after(self) -> int:
        return self.scheduler.retry_after()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify()

    # -- lifecycle

    def warm_up(self) -> float:
        """Run the shapes the loop runs first (a short and a full-chunk prefill, decode steps of one
        and two rows) and seed the scheduler's step times; returns the seconds it took."""
        started = self.clock()
        vocab = self.decoder.vocab_size
        short = [i % vocab for i in range(1, 17)]
        chunk = min(self.limits.max_chunk, max(self.limits.context // 2, 1))
        context = self.decoder.empty_context(1)
        timed = self.clock()
        first = self.decoder.prefill([i % vocab for i in range(chunk)], context=context)
        self.scheduler.prefill.observe(chunk, self.clock() - timed)
        timed = self.clock()
        second = self.decoder.prefill(short, context=context)
        self.scheduler.prefill.observe(len(short), self.clock() - timed)
        batch = DecodeBatch(self.decoder)
        batch.rebuild([], [Joining(key=0, cache=second.present, position=len(short), context=context)])
        for rows in (1, 2):
            if rows == 2:
                batch.rebuild([0], [Joining(key=1, cache=first.present, position=chunk, context=context)])
            for _ in range(2):
                timed = self.clock()
                batch.step(np.ones(rows, np.int64))
                self.scheduler.decode_s.observe(self.clock() - timed)
        return self.clock() - started

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ortpack-generation", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Take no new requests, let those in progress finish for up to `timeout_s`, then cancel
        what is left and end the loop."""
        with self._cond:
            self._accepting = False
            self._cond.notify()
        deadline = time.monotonic() + timeout_s
        while self._busy() and time.monotonic() < deadline and self._thread is not None and self._thread.is_alive():
            time.sleep(0.02)
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _busy(self) -> bool:
        return bool(self._incoming or self._waiting or self._prefilling or self._running)

    # -- the loop

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._incoming and not self._has_work():
                    self._cond.wait()
                if self._stopping:
                    break
                self._waiting.extend(self._incoming)
                self._incoming.clear()
            try:
                self._step()
            except Exception as exc:
                log.exception("generation step failed")
                self._fail_all(f"the model failed: {type(exc).__name__}")
        for seq in [*self._incoming, *self._waiting]:
            self._end(seq, "cancelled", waiting=True)
        for seq in [*([self._prefilling] if self._prefilling else []), *self._running.values()]:
            self._end(seq, "cancelled")
        self._incoming.clear()
        self._waiting.clear()
        self._prefilling = None
        self._running.clear()

    def _has_work(self) -> bool:
        return bool(self._waiting or self._prefilling or self._running)

    def _step(self) -> None:
        self._drop_unstarted(self.clock())
        ended: set[int] = set()
        joining: list[Joining] = []
        if self._running:
            ended |= self._decode()
        seq = self._next_prefill()
        if seq is not None:
            together = self._short_prompts(seq)
            if together:
                joining += self._prefill_together([seq, *together])
            else:
                joined = self._prefill_chunk(seq)
                if joined is not None:
                    joining.append(joined)
        for key, running in self._running.items():
            if key not in ended and running.handle.cancelled:
                self._end(running, "cancelled")
                ended.add(key)
        if ended or joining:
            for key in ended:
                self._running.pop(key, None)
            keep = [key for key in self._batch.keys if key not in ended]
            self._batch.rebuild(keep, joining)

    def _drop_unstarted(self, now: float) -> None:
        """End the sequences without a token yet whose client went away or whose deadline passed."""
        current = self._prefilling
        if current is not None and (current.handle.cancelled or self._expired(current, now)):
            self._end(current, "cancelled" if current.handle.cancelled else "deadline")
        for queued in list(self._waiting):
            if queued.handle.cancelled or self._expired(queued, now):
                self._waiting.remove(queued)
                self._end(queued, "cancelled" if queued.handle.cancelled else "deadline", waiting=True)

    def _decode(self) -> set[int]:
        """One token for every running row; the keys of the rows that ended."""
        rows = [self._running[key] for key in self._batch.keys]  # type: ignore[index]
        tokens = np.array([seq.generated[-1] for seq in rows], np.int64)
        started = self.clock()
        logits = self._batch.step(tokens)
        seconds = self.clock() - started
        self.scheduler.decode_s.observe(seconds)
        if self.observer is not None:
            self.observer.step("decode", seconds, len(rows))
        if all(seq.request.sampling.greedy and seq.request.sampling.logprobs is None for seq in rows):
            for seq, row in zip(rows, logits, strict=True):
                for rule in seq.request.rules:
                    rule(seq.generated, row)
            picks = [Pick(token=int(t), logprob=None) for t in pick_greedy_batch(logits)]
        else:
            picks = [seq.request.pick(seq.sampler, seq.generated, row) for seq, row in zip(rows, logits, strict=True)]
        now = self.clock()
        ended = set()
        for seq, pick in zip(rows, picks, strict=True):
            if self._advance(seq, pick, now):
                ended.add(seq.key)
        return ended

    def _next_prefill(self) -> _Sequence | None:
        """The sequence whose prompt is being prefilled: the one in progress, else the first waiting
        one that may join the batch."""
        if self._prefilling is not None:
            return self._prefilling
        if not self._waiting:
            return None
        head = self._waiting[0]
        reach = max((s.need for s in self._running.values()), default=0)
        if not self.scheduler.can_join(len(self._running), reach, head.need):
            return None
        self._waiting.popleft()
        self.scheduler.started()
        self._prefilling = head
        return head

    def _short_prompts(self, head: _Sequence) -> list[_Sequence]:
        """Waiting sequences to prefill in one call with `head`, which starts its prefill now and
        fits in one chunk: those behind it that may join too while every prompt, padded to the
        longest, fits the chunk (a call pays a fixed part whatever its tokens: 14 ms of a 16-token
        prompt's 60 ms on the Qwen2-0.5B shape, so short prompts arriving together go in one)."""
        if head.prefilled or not self._waiting:
            return []
        budget = self.scheduler.chunk(self.limits.max_chunk, decoding=bool(self._running))
        longest = len(head.request.prompt)
        if longest > budget:
            return []
        together: list[_Sequence] = []
        rows, reach = len(self._running) + 1, max([head.need, *(s.need for s in self._running.values())])
        while self._waiting:
            nxt = self._waiting[0]
            width = max(longest, len(nxt.request.prompt))
            if width * (len(together) + 2) > budget or not self.scheduler.can_join(rows, reach, nxt.need):
                break
            self._waiting.popleft()
            self.scheduler.started()
            together.append(nxt)
            longest, rows, reach = width, rows + 1, max(reach, nxt.need)
        return together

    def _prefill_together(self, seqs: list[_Sequence]) -> list[Joining]:
        """Prefill whole prompts in one call, left-padded to the longest (the batch's own layout:
        each row's real tokens contiguous at the right, its positions its own); each row's first
        token, and the joining of those that did not end at it."""
        width = max(len(s.request.prompt) for s in seqs)
        ids = np.zeros((len(seqs), width), np.int64)
        mask = np.zeros((len(seqs), width), np.int64)
        positions = np.zeros((len(seqs), width), np.int64)
        for row, seq in enumerate(seqs):
            n = len(seq.request.prompt)
            ids[row, width - n :] = seq.request.prompt
            mask[row, width - n :] = 1
            positions[row, width - n :] = np.arange(n)
        context = [np.concatenate(parts) for parts in zip(*(s.request.context for s in seqs), strict=True)]
        started = self.clock()
        out = self.decoder.step(ids, positions, mask, self.decoder.empty_cache(len(seqs)), context=context)
        seconds = self.clock() - started
        self.scheduler.prefill.observe(ids.size, seconds)
        if self.observer is not None:
            self.observer.step("prefill", seconds, int(mask.sum()))
        self._prefilling = None
        now, joining = self.clock(), []
        for row, seq in enumerate(seqs):
            n = len(seq.request.prompt)
            seq.prefilled = n
            if self._advance(seq, seq.request.pick(seq.sampler, seq.generated, out.logits[row, -1]), now):
                continue
            self._running[seq.key] = seq
            # copies: a view would outlive the step's OrtValues
            cache = [np.ascontiguousarray(as_array(p)[row : row + 1, :, width - n :]) for p in out.present]
            joining.append(Joining(key=seq.key, cache=cache, position=n, context=seq.request.context))
        return joining

    def _prefill_chunk(self, seq: _Sequence) -> Joining | None:
        """Prefill the next chunk of `seq`'s prompt; at its end, its first token and its joining."""
        prompt = seq.request.prompt
        size = self.scheduler.chunk(len(prompt) - seq.prefilled, bool(self._running), seq.prefilled)
        started = self.clock()
        out = self.decoder.prefill(prompt[seq.prefilled : seq.prefilled + size], seq.cache, context=seq.request.context)
        seconds = self.clock() - started
        self.scheduler.prefill.observe(size, seconds, seq.prefilled)
        if self.observer is not None:
            self.observer.step("prefill", seconds, size)
        seq.cache, seq.prefilled = out.present, seq.prefilled + size
        if seq.prefilled < len(prompt):
            return None
        self._prefilling = None
        cache, seq.cache = seq.cache, None
        if self._advance(seq, seq.request.pick(seq.sampler, seq.generated, out.logits[0, -1]), self.clock()):
            return None
        self._running[seq.key] = seq
        return Joining(key=seq.key, cache=cache, position=len(prompt), context=seq.request.context)

    def _advance(self, seq: _Sequence, pick: Pick, now: float) -> bool:
        """Take one picked token: emit its text, or end the sequence; True when it ended."""
        token = pick.token
        seq.generated.append(token)
        if self.observer is not None:
            if seq.last_token_at is None:
                self.observer.first_token(now - seq.arrival)
            else:
                self.observer.token_gap(now - seq.last_token_at)
        seq.last_token_at = now
        logprobs = (pick,) if pick.logprob is not None else ()
        if token in seq.stops:
            self._end(seq, "stop", tokens=(token,), logprobs=logprobs, text=seq.text.flush())
            return True
        delta = seq.text.push(token)
        if delta.stopped:
            self._end(seq, "stop", tokens=(token,), logprobs=logprobs, text=delta.text)
            return True
        length = len(seq.request.prompt) + len(seq.generated)
        if len(seq.generated) >= seq.request.max_tokens or length >= self.limits.context:
            self._end(seq, "length", tokens=(token,), logprobs=logprobs, text=delta.text + seq.text.flush())
            return True
        self._emit(seq, Event(text=delta.text, tokens=(token,), logprobs=logprobs))
        return False

    def _expired(self, seq: _Sequence, now: float) -> bool:
        """Past its deadline before its first token: the deadline bounds the wait, not the
        generation (max_tokens bounds that; a client that stops reading cancels it)."""
        return not seq.generated and seq.request.deadline is not None and now > seq.request.deadline

    def _emit(self, seq: _Sequence, event: Event) -> None:
        try:
            seq.sink(event)
        except Exception:
            log.exception("a generation sink failed; cancelling its sequence")
            seq.handle.cancelled = True

    def _end(
        self,
        seq: _Sequence,
        reason: str,
        *,
        waiting: bool = False,
        tokens: tuple[int, ...] = (),
        logprobs: tuple[Pick, ...] = (),
        text: str = "",
        error: str = "",
    ) -> None:
        self.scheduler.release(seq.need, waiting=waiting)
        if self._prefilling is seq:
            self._prefilling = None
        prompt, completion = len(seq.request.prompt), len(seq.generated)
        if self.observer is not None:
            self.observer.finished(reason, prompt, completion)
        event = Event(
            text=text,
            tokens=tokens,
            logprobs=logprobs,
            finish_reason=reason,
            prompt_tokens=prompt,
            completion_tokens=completion,
            error=error,
        )
        self._emit(seq, event)

    def _fail_all(self, error: str) -> None:
        """A step failed: every sequence in flight ends with the error, the batch starts empty."""
        if self._prefilling is not None:
            self._end(self._prefilling, "error", error=error)
        for seq in self._running.values():
            self._end(seq, "error", error=error)
        self._running.clear()
        self._batch = DecodeBatch(self.decoder)
