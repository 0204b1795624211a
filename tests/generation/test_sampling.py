"""Sampler against transformers' logits warpers (temperature, top-k, top-p, as `generate` applies
them), and its greedy picks, seeds, draw frequencies and logprobs."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from ortpack.kernel.errors import InputError
from ortpack.kernel.generation.sampling import (
    BLOCK,
    BUCKET_TOKENS,
    NUCLEUS_CANDIDATES,
    Pick,
    Sampler,
    SamplingParams,
    distribution,
    pick_greedy_batch,
)


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    """The reference runs on rows of at most 40k: torch's thread pool only spins there (8 s instead
    of 0.3 s for the 40k case on a busy 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _reference(row: np.ndarray, params: SamplingParams) -> np.ndarray:
    """transformers' probabilities: its warpers in generate's order, then softmax. In float64, so
    that float32 rounding in a cumulative sum does not decide a boundary case."""
    scores = torch.from_numpy(row.astype(np.float64))[None]
    if params.temperature != 1.0:
        scores = TemperatureLogitsWarper(float(params.temperature))(None, scores)  # type: ignore[arg-type]
    if params.top_k:
        scores = TopKLogitsWarper(params.top_k)(None, scores)  # type: ignore[arg-type]
    if params.top_p < 1.0:
        scores = TopPLogitsWarper(params.top_p)(None, scores)  # type: ignore[arg-type]
    return torch.softmax(scores, dim=-1)[0].numpy()


def _ours(row: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """(a mask of the tokens a draw may pick, their probabilities over the whole row)"""
    ids, probs = distribution(row, params)
    allowed, dense = np.zeros(len(row), dtype=bool), np.zeros(len(row))
    allowed[ids], dense[ids] = True, probs
    assert len(np.unique(ids)) == len(ids)
    return allowed, dense


def _kept(reference: np.ndarray) -> np.ndarray:
    return reference > 0


def _rows(rng: np.random.Generator, vocab: int, count: int) -> list[np.ndarray]:
    """Logits as models give them: a few strong tokens over a spread, some rows flat, some masked."""
    rows = []
    for index in range(count):
        row = rng.standard_normal(vocab) * rng.choice([0.05, 1.0, 3.0])
        lead = rng.choice(vocab, size=min(vocab, int(rng.integers(1, 8))), replace=False)
        row[lead] += rng.uniform(0, 10, len(lead))
        if index % 5 == 4:
            row[rng.choice(vocab, size=vocab // 4, replace=False)] = -np.inf
        rows.append(row.astype(np.float32))
    return rows


PARAMS = [
    SamplingParams(temperature=t, top_k=k, top_p=p)
    for t in (0.3, 1.0, 1.7)
    for k in (0, 2, 7, 50)
    for p in (1e-9, 0.3, 0.8, 0.95, 1.0)
]


@pytest.mark.parametrize("vocab", [9, 16, 200, 5_000, 40_000])
def test_the_distribution_is_transformers(vocab: int) -> None:
    rng = np.random.default_rng(vocab)
    for row in _rows(rng, vocab, 6 if vocab < 10_000 else 2):
        for params in PARAMS:
            allowed, ours = _ours(row, params)
            reference = _reference(row, params)
            # a token of weight 0 (a masked -inf, or underflowed) may be allowed: it is never drawn
            np.testing.assert_array_equal(allowed & (ours > 0), _kept(reference), err_msg=str(params))
            np.testing.assert_allclose(ours, reference, rtol=1e-9, atol=1e-15)


def test_top_p_edges() -> None:
    row = np.array([2.0, 1.0, 0.5, 0.5, -1.0, -np.inf], dtype=np.float32)
    assert _ours(row, SamplingParams(top_p=1e-9))[0].tolist() == [True] + [False] * 5  # a tiny top_p: the best
    assert _ours(row, SamplingParams(top_p=1.0))[0].all()  # 1.0 is off
    # The mass of the best few tokens exactly at top_p: a token whose cumulative probability from below
    # equals 1 - top_p is removed, as transformers does
    probs = np.array([0.5, 0.25, 0.125, 0.125])
    logits = np.log(probs).astype(np.float32)
    for top_p in (0.5, 0.75, 0.875, 0.9):
        params = SamplingParams(top_p=top_p)
        np.testing.assert_array_equal(_ours(logits, params)[0], _kept(_reference(logits, params)))


def test_ties_are_cut_as_transformers_cuts_them() -> None:
    """Tied values across the top-p boundary: transformers keeps the later indices (its ascending sort
    is stable on CPU rows up to 16 wide; beyond, which tied token it keeps is arbitrary, but how many
    is not)."""
    rng = np.random.default_rng(0)
    for vocab in (4, 9, 16, 300, 20_000):
        for _ in range(40):
            row = rng.integers(-3, 3, vocab).astype(np.float32)
            # top_p that no sum of a few tied probabilities hits exactly (where rounding alone decides)
            for params in (
                SamplingParams(top_p=0.3137),
                SamplingParams(top_p=0.7071),
                SamplingParams(top_k=3, top_p=0.618),
            ):
                allowed, ours = _ours(row, params)
                reference = _reference(row, params)
                if vocab <= 16:
                    np.testing.assert_array_equal(allowed, _kept(reference), err_msg=f"{row} {params}")
                else:
                    for value in np.unique(row):
                        tied = row == value
                        assert (allowed & tied).sum() == (_kept(reference) & tied).sum()
                np.testing.assert_allclose(np.sort(ours), np.sort(reference), rtol=1e-9, atol=1e-15)


def test_top_k_keeps_ties_at_the_kth_value() -> None:
    row = np.array([5.0, 3.0, 4.0, 3.0, 1.0], dtype=np.float32)
    params = SamplingParams(top_k=2, temperature=0.5)
    assert np.flatnonzero(_ours(row, params)[0]).tolist() == [0, 2]
    assert np.flatnonzero(_ours(row, SamplingParams(top_k=3))[0]).tolist() == [0, 1, 2, 3]  # both 3.0s kept
    np.testing.assert_allclose(_ours(row, SamplingParams(top_k=3))[1], _reference(row, SamplingParams(top_k=3)))


def test_top_k_never_picks_outside_the_top_k() -> None:
    rng = np.random.default_rng(1)
    row = (rng.standard_normal(50_000) * 0.5).astype(np.float32)  # nearly flat: the draw would roam
    best = set(np.argsort(-row)[:5].tolist())
    sampler = Sampler(SamplingParams(top_k=5, temperature=2.0, seed=3))
    picked = {sampler.pick(row).token for _ in range(2000)}
    assert picked == best


def test_top_p_never_picks_outside_the_nucleus() -> None:
    rng = np.random.default_rng(2)
    for scale in (0.02, 3.0):  # the whole row bucketed, and the best NUCLEUS_CANDIDATES tokens
        row = (rng.standard_normal(30_000) * scale).astype(np.float32)
        params = SamplingParams(top_p=0.5, seed=4)
        allowed, _ = _ours(row, params)
        assert (allowed.sum() > NUCLEUS_CANDIDATES) == (scale < 1)
        sampler = Sampler(params)
        assert allowed[[sampler.pick(row).token for _ in range(1000)]].all()


@pytest.mark.parametrize("vocab", [8, 40 * BLOCK + 17])
def test_draws_follow_the_softmax(vocab: int) -> None:
    """Frequencies of 20000 draws against softmax(logits / T): a chi-square over 8 bins (7 degrees of
    freedom; 24.3 is its 0.1% point), the whole row drawn at once or by blocks."""
    rng = np.random.default_rng(5)
    temperature = 0.7
    # 7 tokens spread over the blocks; the rest, together about as likely as one of them, form bin 8
    row = (rng.uniform(-1.5, 1.5, vocab) - temperature * np.log(vocab - 7)).astype(np.float32)
    bins = rng.choice(vocab, size=7, replace=False)
    row[bins] = rng.uniform(-1.5, 1.5, 7).astype(np.float32)
    probs = np.exp(row.astype(np.float64) / temperature)
    probs /= probs.sum()
    expected = np.append(probs[bins], 1 - probs[bins].sum()) * 20_000
    sampler = Sampler(SamplingParams(temperature=temperature, seed=6))
    tokens = np.array([sampler.pick(row).token for _ in range(20_000)])
    observed = np.append([(tokens == b).sum() for b in bins], (~np.isin(tokens, bins)).sum())
    assert expected.min() > 50
    assert ((observed - expected) ** 2 / expected).sum() < 24.3


def test_greedy_is_the_argmax_with_the_lowest_index_on_a_tie() -> None:
    rng = np.random.default_rng(7)
    rows = rng.integers(0, 4, size=(20, 300)).astype(np.float32)  # many ties at the top
    for params in (SamplingParams(temperature=0), SamplingParams(top_k=1), SamplingParams(temperature=0, seed=1)):
        assert params.greedy
        sampler = Sampler(params)
        assert [sampler.pick(row).token for row in rows] == np.argmax(rows, axis=1).tolist()
    batch = pick_greedy_batch(rows)
    assert batch.dtype == np.int64
    assert batch.tolist() == torch.from_numpy(rows).argmax(dim=1).tolist() == np.argmax(rows, axis=1).tolist()
    assert not SamplingParams(temperature=0.1, top_k=2).greedy


def test_a_seed_reproduces_the_tokens() -> None:
    rng = np.random.default_rng(8)
    rows = [row * 0.3 for row in _rows(rng, 2000, 30)]
    params = SamplingParams(temperature=1.2, top_p=0.95, top_k=40, seed=1234)

    def tokens(params: SamplingParams) -> list[int]:
        sampler = Sampler(params)
        return [sampler.pick(row).token for row in rows]

    first = tokens(params)
    assert tokens(params) == first
    assert tokens(SamplingParams(temperature=1.2, top_p=0.95, top_k=40, seed=1235)) != first
    assert tokens(SamplingParams(temperature=1.2, top_p=0.95, top_k=40, seed=-5)) == tokens(
        SamplingParams(temperature=1.2, top_p=0.95, top_k=40, seed=-5)
    )
    assert len(set(tokens(SamplingParams(temperature=1.2, top_p=0.95, top_k=40)))) > 1  # unseeded: varied


@pytest.mark.parametrize("temperature", [0.0, 0.5, 1.0])
def test_logprobs_are_the_log_softmax_of_the_raw_logits(temperature: float) -> None:
    rng = np.random.default_rng(9)
    row = (rng.standard_normal(3000) * 4).astype(np.float32)
    row[[10, 20]] = row.max() + 1  # a tie at the top: the lower index first
    expected = torch.log_softmax(torch.from_numpy(row.astype(np.float64)), dim=-1).numpy()
    sampler = Sampler(SamplingParams(temperature=temperature, top_p=0.9, logprobs=5, seed=0))
    for _ in range(20):
        pick = sampler.pick(row)
        assert pick.logprob == pytest.approx(expected[pick.token], abs=1e-12)
        assert [token for token, _ in pick.top] == np.argsort(-expected, kind="stable")[:5].tolist()
        assert [token for token, _ in pick.top][:2] == [10, 20]
        logprobs = [value for _, value in pick.top]
        assert logprobs == sorted(logprobs, reverse=True)
        np.testing.assert_allclose(logprobs, expected[[token for token, _ in pick.top]], atol=1e-12)
        assert all(isinstance(value, float) for value in [pick.logprob, *logprobs])


def test_logprobs_zero_and_none() -> None:
    row = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    assert Sampler(SamplingParams(temperature=0)).pick(row) == Pick(token=2, logprob=None)
    pick = Sampler(SamplingParams(temperature=0, logprobs=0)).pick(row)
    assert pick.top == () and pick.logprob == pytest.approx(float(torch.log_softmax(torch.tensor(row), 0)[2]))
    assert len(Sampler(SamplingParams(temperature=0, logprobs=20)).pick(row).top) == 3  # no more than the vocabulary


def test_the_whole_row_is_bucketed_for_a_flat_top_p() -> None:
    """A nucleus of thousands of tokens (bucketed, see _rise_above), -inf logits in the row."""
    rng = np.random.default_rng(10)
    row = (rng.standard_normal(20 * BUCKET_TOKENS * 64) * 0.2).astype(np.float32)
    row[rng.choice(len(row), 500, replace=False)] = -np.inf
    for top_p in (0.1, 0.5, 0.99):
        params = SamplingParams(top_p=top_p, temperature=1.3)
        allowed, ours = _ours(row, params)
        reference = _reference(row, params)
        np.testing.assert_array_equal(allowed & (ours > 0), _kept(reference))
        assert allowed.sum() > 1000
        np.testing.assert_allclose(ours, reference, rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1),
        ("temperature", 2.5),
        ("temperature", float("nan")),
        ("temperature", "1"),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -1),
        ("top_k", 2.0),
        ("top_k", True),
        ("seed", 1.5),
        ("logprobs", 21),
        ("logprobs", -1),
    ],
)
def test_invalid_params_name_their_field(field: str, value: object) -> None:
    with pytest.raises(InputError, match=f"^{field} must"):
        SamplingParams(**{field: value})  # type: ignore[arg-type]


def test_a_row_without_a_finite_maximum_is_refused() -> None:
    sampler = Sampler(SamplingParams(temperature=0.8))
    with pytest.raises(InputError, match="finite"):
        sampler.pick(np.full(10, -np.inf, dtype=np.float32))
    with pytest.raises(InputError, match="finite"):
        sampler.pick(np.array([0.0, np.nan, 1.0], dtype=np.float32))
