"""Whisper's pieces that need no model: the prompt, the suppressed-token rules, the windows, the
settings' round trip through the manifest, and the transcript gate's arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from ortpack.kernel.contracts.automatic_speech_recognition import (
    WhisperSection,
    edit_distance,
    transcript_metrics,
    words,
)
from ortpack.kernel.errors import InputError
from ortpack.kernel.generation.whisper import SuppressTokens, WhisperSettings, prompt_ids, windows


def settings(*, multilingual: bool = True) -> WhisperSettings:
    return WhisperSettings(
        layers=2,
        heads=2,
        head_dim=4,
        vocab_size=100,
        max_target_positions=32,
        chunk_samples=10,
        frames=5,
        start_of_transcript=90,
        end_of_text=89,
        transcribe=91,
        translate=92 if multilingual else None,
        no_timestamps=93,
        languages={"en": 94, "de": 95} if multilingual else {},
        suppress_tokens=(1, 2, 150),  # an id past the vocabulary is ignored
        begin_suppress_tokens=(3, 89),
    )


def test_the_prompt_names_language_and_task_on_a_multilingual_model() -> None:
    s = settings()
    assert prompt_ids(s) == [90, 94, 91, 93]  # English unless told
    assert prompt_ids(s, language="DE", task="translate") == [90, 95, 92, 93]
    with pytest.raises(InputError, match="unknown language 'fr'"):
        prompt_ids(s, language="fr")
    with pytest.raises(InputError, match="task must be"):
        prompt_ids(s, task="summarize")


def test_an_english_only_model_takes_english_or_nothing() -> None:
    s = settings(multilingual=False)
    assert prompt_ids(s) == prompt_ids(s, language="en") == [90, 93]
    with pytest.raises(InputError, match="English-only"):
        prompt_ids(s, language="de")
    with pytest.raises(InputError, match="does not translate"):
        prompt_ids(s, task="translate")


def test_suppressed_tokens_and_the_begin_suppressed_ones_at_the_first_token_only() -> None:
    rule = SuppressTokens(settings())
    first = np.zeros(100, np.float32)
    rule([], first)
    assert set(np.flatnonzero(np.isinf(first))) == {1, 2, 3, 89}
    later = np.zeros(100, np.float32)
    rule([7], later)
    assert set(np.flatnonzero(np.isinf(later))) == {1, 2}


def test_windows_cut_a_recording_into_chunks_the_last_shorter() -> None:
    parts = windows(np.arange(25, dtype=np.float32), settings())
    assert [len(p.samples) for p in parts] == [10, 10, 5]
    assert [p.start_s for p in parts] == [0.0, 10 / 16_000, 20 / 16_000]
    with pytest.raises(InputError, match="no samples"):
        windows(np.zeros(0, np.float32), settings())


def test_the_manifest_section_gives_back_the_kernel_settings() -> None:
    import dataclasses

    s = settings()
    assert WhisperSection.model_validate(dataclasses.asdict(s)).kernel() == s


def test_words_and_their_edit_distance() -> None:
    assert words("Hello, world. It's 5 o'clock!") == ["hello", "world", "it's", "5", "o'clock"]
    assert edit_distance(["a", "b", "c"], ["a", "x", "c", "d"]) == 2  # one substitution, one insertion
    assert edit_distance([], ["a"]) == 1 and edit_distance(["a"], []) == 1


def test_transcript_metrics_against_pytorchs() -> None:
    vocabulary = {1: " the", 2: " cat", 3: " sat", 4: " dog", 5: "."}

    def decode(ids: list[int]) -> str:
        return "".join(vocabulary[i] for i in ids)

    same = transcript_metrics([[1, 2, 3, 5]], [[1, 2, 3, 5]], decode)
    assert same == {"exact_match": 1.0, "word_error_rate": 0.0, "greedy_match": 1.0, "mean_greedy_match": 1.0}
    off = transcript_metrics([[1, 2, 3, 5], [1, 4]], [[1, 2, 3], [1, 2]], decode)
    assert off["exact_match"] == 0.0  # punctuation alone still differs token for token
    assert off["word_error_rate"] == pytest.approx(1 / 5)  # "dog" -> "cat"; the period is not a word
    assert off["greedy_match"] == 0.5 and off["mean_greedy_match"] == pytest.approx((0.75 + 0.5) / 2)
