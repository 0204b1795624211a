"""Next-token choice for one sequence: greedy, or a seeded draw after temperature, top-k and top-p,
with OpenAI-style logprobs, on the float32 [vocab] logits row ONNX Runtime returns.

The draw follows Hugging Face transformers' `generate(do_sample=True)`: TemperatureLogitsWarper,
then TopKLogitsWarper, then TopPLogitsWarper, then a categorical draw, so a bundle samples from the
distribution its PyTorch model would (not the same tokens: numpy's random stream is not torch's).
Logprobs are OpenAI's: the log-softmax of the raw logits, before any of that.

The server picks for up to 32 sequences per decode step over vocabularies up to 152k wide, so
nothing here sorts the whole row. Top-k bounds its k-th value by block maxima and partitions only
the values above the bound (np.partition over the row for k above vocab / 512). Top-p decides on
the best 64 tokens when the rest hold at most 1 - top_p (exact: no token outside can then be
kept), else buckets the whole row by value and sorts one bucket. The draw walks block sums, then
one block. The softmax is float64, over the row once.

Measured per pick on a 151936-wide float32 row with 30 strong tokens (median of 100, one core of a
shared 2-core machine): greedy 0.02 ms, top_k=50 0.17 ms, top_p=0.9 0.5 ms (0.25 of it the float64
exp over the row), temperature alone 0.4 ms, top_k=50 with top_p=0.9 0.2 ms; logprobs=5 adds
0.47 ms (a second softmax, of the raw row); top_p=0.9 on a nearly flat row (a nucleus of 134k
tokens) 2.7 ms, where a full sort would take 12-20 ms.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from ortpack.kernel.errors import InputError

# OpenAI's bound on top_logprobs
MAX_LOGPROBS = 20
# Top-p first looks at this many best tokens, then at the whole row: a trained model's top_p=0.9
# nucleus is rarely more than a few dozen tokens.
NUCLEUS_CANDIDATES = 64
# Top-p over a whole row buckets the values by this many tokens per bucket on average (see _rise_above)
BUCKET_TOKENS = 64
# Block width for the row's maxima (top-k) and sums (the draw): a row reduces fastest in blocks of
# 128-256 float values (a 151936-wide row: 0.05-0.1 ms, against 0.5 ms for blocks of 16).
BLOCK = 128


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How one sequence picks its tokens (OpenAI's request fields of the same names)."""

    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0  # (0, 1]; 1: off
    top_k: int = 0  # 0: off
    seed: int | None = None  # a seed reproduces the same tokens for the same logits
    logprobs: int | None = None  # None: none; 0..20: the chosen token's logprob and this many top alternatives

    def __post_init__(self) -> None:
        if not _is_real(self.temperature) or not 0.0 <= self.temperature <= 2.0:
            raise InputError(f"temperature must be in [0, 2], not {self.temperature!r}")
        if not _is_real(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise InputError(f"top_p must be in (0, 1], not {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise InputError(f"top_k must be an integer >= 0 (0: off), not {self.top_k!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise InputError(f"seed must be an integer, not {self.seed!r}")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise InputError(f"logprobs must be an integer in 0..{MAX_LOGPROBS}, not {self.logprobs!r}")

    @property
    def greedy(self) -> bool:
        """The pick is the argmax: no randomness (top_k=1 leaves one token, bar exact ties)."""
        return self.temperature == 0 or self.top_k == 1


@dataclass(frozen=True, slots=True)
class Pick:
    token: int
    logprob: float | None  # None unless params.logprobs is not None
    top: tuple[tuple[int, float], ...] = ()  # (token, logprob), best first, len == params.logprobs


class Sampler:
    """Picks one sequence's tokens, step after step, with its own random stream: the same seed and
    the same logits give the same tokens in any Sampler."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        # OpenAI takes any integer as a seed; numpy takes non-negative ones (None: OS entropy)
        self._rng = np.random.default_rng(None if params.seed is None else params.seed % 2**64)
        # float64 room for one row, reused: a fresh 1.2 MB array per pick costs its page faults
        # (1.5 ms instead of 0.3 ms per temperature pick on a 151936-wide row, measured here)
        self._scratch = np.empty(0)

    def pick(self, logits: np.ndarray) -> Pick:
        """The next token for this `logits` row (float32 [vocab])."""
        row = np.asarray(logits)
        if row.ndim != 1 or not row.size:
            raise ValueError(f"pick takes one logits row, not an array of shape {row.shape}")
        if self.params.greedy:
            token = int(np.argmax(row))
        else:
            ids, weights = _warp(row, self.params, self._room(len(row)))
            index = _inverse_cdf(weights, self._rng.random())
            token = index if ids is None else int(ids[index])
        if self.params.logprobs is None:
            return Pick(token=token, logprob=None)
        return _with_logprobs(row, token, self.params.logprobs, self._room(len(row)))

    def _room(self, size: int) -> np.ndarray:
        if len(self._scratch) < size:
            self._scratch = np.empty(size)
        return self._scratch


def pick_greedy_batch(logits: np.ndarray) -> np.ndarray:
    """Each row's argmax (the lowest index wins a tie), int64: the step where every sequence is greedy."""
    return np.argmax(logits, axis=-1).astype(np.int64, copy=False)


def distribution(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """The tokens a draw with `params` may pick and their probabilities (float64, summing to 1):
    the softmax of what transformers' temperature, top-k and top-p warpers leave of `logits`."""
    row = np.asarray(logits)
    ids, weights = _warp(row, params, np.empty(len(row)))
    return (np.arange(len(row)) if ids is None else ids), weights / weights.sum()


def _at_least_kth(row: np.ndarray, k: int) -> np.ndarray:
    """Indices of every value >= the k-th largest, ascending: k of them, more on a tie at the k-th."""
    blocks = len(row) // BLOCK
    if blocks >= 4 * k:
        # The k largest block maxima are k values >= the k-th largest of them, so that bounds the
        # row's k-th largest from below; only the few values above the bound are partitioned
        # (0.2 ms instead of 1.5 ms for np.partition over a 151936-wide row).
        maxima = row[: blocks * BLOCK].reshape(blocks, BLOCK).max(axis=1)
        candidates = np.flatnonzero(row >= np.partition(maxima, blocks - k)[blocks - k])
        values = row[candidates]
        return candidates[values >= np.partition(values, len(values) - k)[len(values) - k]]
    return np.flatnonzero(row >= np.partition(row, len(row) - k)[len(row) - k])


def _warp(row: np.ndarray, params: SamplingParams, scratch: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """(token ids, or None for the whole row; their unnormalized float64 probabilities, in `scratch`
    or a copy of part of it)."""
    ids: np.ndarray | None = None
    values = row
    if 0 < params.top_k < len(row):
        # TopKLogitsWarper removes only values below the k-th largest, so it keeps ties with it
        ids = _at_least_kth(row, params.top_k)
        values = row[ids]
    best = float(values.max())
    if not np.isfinite(best):
        raise InputError(f"the logits row has no finite maximum ({best})")
    weights = _scaled(values, best, params.temperature, scratch[: len(values)])
    if params.top_p < 1.0:
        keep = _nucleus(values, weights, params.top_p, best, params.temperature)
        ids = keep if ids is None else ids[keep]
        weights = weights[keep]
    return ids, weights


def _scaled(values: np.ndarray, best: float, temperature: float, out: np.ndarray | None = None) -> np.ndarray:
    """exp((values - best) / temperature) in float64: softmax(values / temperature) unnormalized."""
    weights = np.subtract(values, best, out=out, dtype=np.float64)
    if temperature != 1.0:
        weights /= temperature
    return np.exp(weights, out=weights)


def _nucleus(values: np.ndarray, weights: np.ndarray, top_p: float, best: float, temperature: float) -> np.ndarray:
    """Indices into `values` that TopPLogitsWarper keeps (in no order): it sorts ascending and removes
    each token whose cumulative probability (its own and all below it) is <= 1 - top_p, bar the
    best token; that is the smallest set of best tokens whose mass reaches top_p."""
    total = float(weights.sum())
    limit = (1.0 - top_p) * total
    if len(values) > NUCLEUS_CANDIDATES:
        candidates = _at_least_kth(values, NUCLEUS_CANDIDATES)
        outside = max(total - float(weights[candidates].sum()), 0.0)
        # Every token outside has a cumulative probability <= the mass outside, so when that mass is
        # <= 1 - top_p all of them are removed and the candidates decide exactly.
        if outside <= limit:
            kept = _rise_above(values[candidates], weights[candidates], limit - outside, best, temperature)
            return candidates[kept]
    return _rise_above(values, weights, limit, best, temperature)


def _rise_above(values: np.ndarray, weights: np.ndarray, limit: float, best: float, temperature: float) -> np.ndarray:
    """Indices of the tokens whose weight summed from the lowest value up to their own exceeds
    `limit` (the best token at least). A sort of a whole row costs 6-9 ms, so a long row goes into
    value buckets first (a pass of np.bincount) and only the bucket the limit falls in is sorted:
    1.5 ms on a 151936-wide row."""
    buckets = len(values) // BUCKET_TOKENS
    if buckets < 2:
        inside, above, under = np.arange(len(values)), np.empty(0, dtype=np.intp), 0.0
    else:
        low = float(values.min())
        if not np.isfinite(low):  # -inf logits (masked tokens) have no weight: bucket the rest
            low = float(np.min(values, where=np.isfinite(values), initial=best))
        # (value - low) * scale rounds monotonically, so the buckets are in value order
        position = np.subtract(values, low, dtype=np.float32)
        position *= (buckets - 1) / (best - low) if best > low else 0.0
        bucket = np.clip(position, 0, buckets - 1, out=position).astype(np.intp)
        cumulative = np.cumsum(np.bincount(bucket, weights=weights, minlength=buckets))
        edge = min(int(np.searchsorted(cumulative, limit, side="right")), buckets - 1)
        under = float(cumulative[edge - 1]) if edge else 0.0
        inside, above = np.flatnonzero(bucket == edge), np.flatnonzero(bucket > edge)
    near = values[inside]
    # The bucket's values sorted, and their weights computed as `weights` were (bit for bit)
    ranked = np.sort(near)
    summed = np.cumsum(_scaled(ranked, best, temperature))
    summed += under
    removed = min(int(np.searchsorted(summed, limit, side="right")), len(ranked) - 1)
    floor = ranked[removed]  # the lowest value kept
    # Of the tokens tied at the floor, a stable ascending sort puts the lower indices first, so they
    # are the ones removed (torch's CPU sort is stable up to 16 values; beyond, which is arbitrary).
    tied = inside[near == floor]
    ahead = removed - int(np.searchsorted(ranked, floor, side="left"))
    return np.concatenate((above, inside[near > floor], tied[ahead:]))


def _with_logprobs(row: np.ndarray, token: int, count: int, scratch: np.ndarray) -> Pick:
    """OpenAI's logprobs: log-softmax of the raw row in float64, the chosen token and the `count` best
    (best first, the lower index first on a tie)."""
    best = float(row.max())
    shifted = np.subtract(row, best, out=scratch[: len(row)], dtype=np.float64)
    log_total = best + float(np.log(np.exp(shifted, out=shifted).sum()))
    chosen = float(row[token]) - log_total
    if count == 0:
        return Pick(token=token, logprob=chosen)
    leaders = _at_least_kth(row, min(count, len(row)))
    leaders = leaders[np.lexsort((leaders, -row[leaders]))][:count]
    return Pick(token=token, logprob=chosen, top=tuple((int(t), float(row[t]) - log_total) for t in leaders))


def _inverse_cdf(weights: np.ndarray, u: float) -> int:
    """The index where the cumulative weight first exceeds u * total (u in [0, 1)): a categorical
    draw. Over a whole row it goes by block sums, then within one block (0.1 ms instead of 0.5 ms
    for np.cumsum over 151936 values)."""
    blocks = len(weights) // BLOCK
    if blocks < 4:
        cumulative = np.cumsum(weights)
        return _first_above(cumulative, u * cumulative[-1], weights)
    split = blocks * BLOCK
    sums = np.empty(blocks + 1)
    weights[:split].reshape(blocks, BLOCK).sum(axis=1, out=sums[:blocks])
    sums[blocks] = weights[split:].sum()
    cumulative = np.cumsum(sums)
    target = u * cumulative[-1]
    block = _first_above(cumulative, target, sums)
    part = weights[block * BLOCK : (block + 1) * BLOCK]
    before = cumulative[block - 1] if block else 0.0
    return block * BLOCK + _first_above(np.cumsum(part), target - before, part)


def _first_above(cumulative: np.ndarray, target: float, weights: np.ndarray) -> int:
    """The first index whose cumulative weight exceeds `target`: always one with weight, never one
    with none (a target on a step's edge goes to the next step)."""
    # A block's sum and its cumsum may differ in the last bit: clamp what that rounding moves out of range.
    index = int(np.searchsorted(cumulative, max(target, 0.0), side="right"))
    return index if index < len(weights) else int(np.flatnonzero(weights)[-1])
