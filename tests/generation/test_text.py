"""TextStream against the full decode: for any ids, what it emits equals tokenizer.decode(ids) cut
before the first stop string, with three tokenizers built offline: byte-level BPE (GPT-2, Llama 3,
Qwen), SentencePiece Unigram with Metaspace, and Llama 2's BPE with byte fallback."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ortpack.kernel.errors import InputError
from ortpack.kernel.generation.text import HOLD_LIMIT, Delta, TextStream
from tests.causal_lms import make_bpe_tokenizer, training_texts

# Characters that byte-level BPE and byte fallback split over several tokens
WIDE_TEXTS = (
    "Le café crème coûte 3 €, über Größe.",
    "日本語のテキスト、東京都。",
    "Emoji 🙂🚀 and 👩‍💻 mixed with ASCII.",
    "Ελληνικά και русский текст, ça va?",
)


def _metaspace_unigram() -> Tokenizer:
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=800, special_tokens=["<unk>", "<s>", "</s>"], unk_token="<unk>", show_progress=False
    )
    tokenizer.train_from_iterator(training_texts(), trainer=trainer)
    return tokenizer


def _byte_fallback_bpe() -> Tokenizer:
    """Llama 2's layout: Metaspace pieces, <0xNN> tokens for characters outside the vocabulary, and
    its decoder (Replace, ByteFallback, Fuse, Strip)."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    # a small alphabet, so that most letters outside ASCII fall back to bytes
    trainer = trainers.BpeTrainer(
        vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=60, show_progress=False
    )
    tokenizer.train_from_iterator(training_texts(), trainer=trainer)
    spec = json.loads(tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    vocab.update({f"<0x{byte:02X}>": len(vocab) + byte for byte in range(256)})
    return Tokenizer.from_str(json.dumps(spec))


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bpe")
    make_bpe_tokenizer(out)
    return out


@pytest.fixture(scope="module")
def tokenizers(bpe_dir: Path) -> dict[str, Tokenizer]:
    return {
        "byte-level": Tokenizer.from_file(str(bpe_dir / "tokenizer.json")),  # as a server reads a bundle's
        "metaspace": _metaspace_unigram(),
        "byte-fallback": _byte_fallback_bpe(),
    }


@pytest.fixture(params=["byte-level", "metaspace", "byte-fallback"])
def tokenizer(request: pytest.FixtureRequest, tokenizers: dict[str, Tokenizer]) -> Tokenizer:
    return tokenizers[request.param]


class WindowRecorder:
    """A tokenizer that records the longest id list it was asked to decode."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.longest = 0

    def decode(self, ids: list[int], /, *, skip_special_tokens: bool) -> str:
        self.longest = max(self.longest, len(ids))
        return str(self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))


def _id_of(tokenizer: Tokenizer, token: str) -> int:
    id_ = tokenizer.token_to_id(token)
    assert id_ is not None
    return id_


def _stream(tokenizer: Any, ids: Sequence[int], **options: Any) -> tuple[str, list[Delta], TextStream]:
    stream = TextStream(tokenizer, **options)
    deltas = [stream.push(token) for token in ids]
    return "".join(d.text for d in deltas) + stream.flush(), deltas, stream


def _cut(text: str, stop: Sequence[str]) -> str:
    """OpenAI's stop: the text before the first occurrence of any stop string."""
    found = [index for index in (text.find(s) for s in stop) if index >= 0]
    return text[: min(found)] if found else text


def _id_sequences(tokenizer: Tokenizer, seed: int, count: int) -> list[list[int]]:
    """Random ids (special ones included) mixed with pieces of real encodings whose characters span
    several tokens. With byte fallback, byte runs stay valid UTF-8: its decoder turns a whole run
    into U+FFFD for one invalid byte (see test_byte_fallback_with_an_invalid_byte)."""
    rng = np.random.default_rng(seed)
    vocab = tokenizer.get_vocab_size()
    byte_ids = {i for i in range(vocab) if re.fullmatch(r"<0x[0-9A-F]{2}>", tokenizer.id_to_token(i) or "")}
    loose = np.array([i for i in range(vocab) if i not in byte_ids])
    texts = [text for text in (*WIDE_TEXTS, *training_texts()[:20]) if text]
    encoded = [e.ids for e in tokenizer.encode_batch(texts)]
    sequences = []
    for _ in range(count):
        ids: list[int] = []
        while len(ids) < 40:
            if rng.random() < 0.3:
                ids.extend(int(i) for i in rng.choice(loose, int(rng.integers(1, 4))))
            elif byte_ids:  # a piece of text, encoded
                text = texts[int(rng.integers(len(texts)))]
                start = int(rng.integers(len(text)))
                ids.extend(tokenizer.encode(text[start : start + int(rng.integers(1, 30))]).ids)
            else:  # a piece of an encoding, often cut within a character
                piece = encoded[int(rng.integers(len(encoded)))]
                start = int(rng.integers(len(piece)))
                ids.extend(piece[start : start + int(rng.integers(1, 12))])
        sequences.append(ids)
    return sequences


def _check(tokenizer: Any, ids: list[int], stop: Sequence[str], skip: bool = True) -> None:
    full = tokenizer.decode(ids, skip_special_tokens=skip)
    text, deltas, stream = _stream(tokenizer, ids, stop=stop, skip_special_tokens=skip)
    assert text == _cut(full, stop), (ids, stop)
    assert stream.text == text
    stopped = [index for index, delta in enumerate(deltas) if delta.stopped]
    if stopped:
        assert any(s in full for s in stop)
        assert all(d == Delta("", True) for d in deltas[stopped[0] + 1 :])
        assert stream.push(ids[0]) == Delta("", True)


@pytest.mark.parametrize("skip", [True, False])
def test_concatenated_deltas_equal_the_full_decode(tokenizer: Tokenizer, skip: bool) -> None:
    for ids in _id_sequences(tokenizer, seed=0, count=150):
        _check(tokenizer, ids, stop=(), skip=skip)


def test_stop_strings_cut_the_text_before_the_first_one(tokenizer: Tokenizer) -> None:
    rng = np.random.default_rng(1)
    for ids in _id_sequences(tokenizer, seed=2, count=200):
        full = tokenizer.decode(ids, skip_special_tokens=True)
        stop = []
        for _ in range(int(rng.integers(1, 4))):
            if full and rng.random() < 0.8:  # a piece of the text, often spanning tokens
                start = int(rng.integers(len(full)))
                stop.append(full[start : start + int(rng.integers(1, 7))])
            else:
                stop.append("zq" + "x" * int(rng.integers(3)))  # found nowhere
        _check(tokenizer, ids, stop=stop)


def test_text_is_held_back_only_as_long_as_needed(tokenizer: Tokenizer) -> None:
    """After each token: everything decoded so far is out, except a trailing incomplete character
    and the longest end that may start a stop string."""
    stop = ("ing the", "日本", "Hello")
    starts = {s[:n] for s in stop for n in range(1, len(s))}
    for ids in _id_sequences(tokenizer, seed=3, count=60):
        stream = TextStream(tokenizer, stop=stop)
        for n, token in enumerate(ids, start=1):
            delta = stream.push(token)
            so_far = tokenizer.decode(ids[:n], skip_special_tokens=True)
            if delta.stopped:
                assert stream.text == _cut(so_far, stop)
                break
            if so_far.endswith("\ufffd") or any(s in so_far for s in stop):
                continue
            held = max((k for k in range(1, 7) if so_far[-k:] in starts), default=0)
            assert stream.text == so_far[: len(so_far) - held], (ids[:n], stream.text, so_far)


def test_a_stop_string_at_the_very_start(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("Hello world, and more text.").ids
    full = tokenizer.decode(ids, skip_special_tokens=True)
    text, deltas, _ = _stream(tokenizer, ids, stop=[full[:4]])
    assert text == ""
    assert any(d.stopped for d in deltas)
    assert all(d.text == "" for d in deltas)


def test_a_stop_string_spanning_tokens_and_characters(tokenizers: dict[str, Tokenizer]) -> None:
    tokenizer = tokenizers["byte-level"]
    ids = tokenizer.encode("Les prix à Tōkyō: 日本語 est beau").ids
    assert len(ids) > 12  # the characters span tokens
    text, deltas, _ = _stream(tokenizer, ids, stop=["語 est", "xyz"])
    assert text == "Les prix à Tōkyō: 日本"
    assert deltas[-1].stopped


@pytest.mark.parametrize(
    ("text", "stop", "expected"),
    [
        # the earlier "the cat sat" completes: it wins though "at" completed first
        ("I saw the cat sat here", ["the cat sat", "at"], "I saw "),
        # "the cat sat" never completes: "at" is the first occurrence
        ("I saw the cat sit here", ["the cat sat", "at"], "I saw the c"),
        # one stop string inside another, both starting at the same place
        ("one two three", ["two", "two three"], "one "),
        ("one two three", ["o t", "two t"], "one "),
        ("abababc", ["abc", "bab"], "a"),
    ],
)
def test_overlapping_stop_strings(tokenizer: Tokenizer, text: str, stop: list[str], expected: str) -> None:
    ids = tokenizer.encode(text).ids
    assert _stream(tokenizer, ids, stop=stop)[0] == expected
    # and token by token where each token is one character's ids: the same cut
    per_char = [i for char in text for i in tokenizer.encode(char).ids]
    full = tokenizer.decode(per_char, skip_special_tokens=True)
    assert _stream(tokenizer, per_char, stop=stop)[0] == _cut(full, stop)


def test_prefix_ids_give_the_leading_space_as_in_the_full_text(tokenizer: Tokenizer) -> None:
    for prompt, continuation in [
        ("The weather today is", " sunny and warm"),
        ("Le café", " crème coûte trop"),
        ("Write in Japanese:", " 日本語のテキスト"),
    ]:
        prompt_ids = tokenizer.encode(prompt).ids
        new_ids = tokenizer.encode(prompt + continuation).ids[len(prompt_ids) :]
        assert tokenizer.encode(prompt + continuation).ids[: len(prompt_ids)] == prompt_ids
        full = tokenizer.decode(prompt_ids + new_ids, skip_special_tokens=True)
        base = tokenizer.decode(prompt_ids, skip_special_tokens=True)
        assert full.startswith(base)
        text, _, _ = _stream(tokenizer, new_ids, prefix_ids=prompt_ids[-5:])
        assert text == full[len(base) :]
        assert text.startswith(" ")


def test_prefix_ids_with_random_continuations(tokenizer: Tokenizer) -> None:
    prompt_ids = tokenizer.encode("Answer briefly, please: what is the capital of France?").ids
    base = tokenizer.decode(prompt_ids, skip_special_tokens=True)
    for ids in _id_sequences(tokenizer, seed=4, count=80):
        full = tokenizer.decode(prompt_ids + ids, skip_special_tokens=True)
        text, _, _ = _stream(tokenizer, ids, prefix_ids=prompt_ids[-5:], stop=["the", "."])
        assert text == _cut(full[len(base) :], ["the", "."])


def test_random_prefix_ids(tokenizer: Tokenizer) -> None:
    """Prompts that end anywhere, within a character too: the text after where the prompt's own
    decoded text and the whole's part."""
    sequences = _id_sequences(tokenizer, seed=6, count=120)
    for prompt_ids, ids in zip(sequences[::2], sequences[1::2], strict=True):
        prefix = prompt_ids[-5:]
        base = tokenizer.decode(prefix, skip_special_tokens=True)
        full = tokenizer.decode(prefix + ids, skip_special_tokens=True)
        common = next((i for i, (a, b) in enumerate(zip(base, full, strict=False)) if a != b), len(base))
        assert _stream(tokenizer, ids, prefix_ids=prefix)[0] == full[common:], (prefix, ids)


def test_a_character_split_across_the_prompt_and_the_continuation(tokenizers: dict[str, Tokenizer]) -> None:
    for name in ("byte-level", "byte-fallback"):
        tokenizer = tokenizers[name]
        ids = tokenizer.encode("Tokyo is 日本 in Japanese").ids
        split = next(k for k in range(1, len(ids)) if tokenizer.decode(ids[:k]).endswith("\ufffd"))
        prompt = tokenizer.decode(ids[:split]).rstrip("\ufffd")
        text, _, _ = _stream(tokenizer, ids[split:], prefix_ids=ids[:split])
        assert prompt + text == "Tokyo is 日本 in Japanese", name


def test_special_tokens_are_skipped_or_shown(tokenizers: dict[str, Tokenizer]) -> None:
    tokenizer = tokenizers["byte-level"]
    end = _id_of(tokenizer, "<|im_end|>")
    ids = [*tokenizer.encode("Hi there").ids, end, end, *tokenizer.encode(" again").ids]
    assert _stream(tokenizer, ids)[0] == "Hi there again"
    assert _stream(tokenizer, ids, skip_special_tokens=False)[0] == "Hi there<|im_end|><|im_end|> again"
    metaspace = tokenizers["metaspace"]
    ids = [*metaspace.encode("Hello").ids, _id_of(metaspace, "</s>"), *metaspace.encode("world").ids]
    assert _stream(metaspace, ids)[0] == metaspace.decode(ids) == "Hello world"


def test_the_window_stays_short(tokenizer: Tokenizer) -> None:
    recorder = WindowRecorder(tokenizer)
    ids = [i for sequence in _id_sequences(tokenizer, seed=5, count=40) for i in sequence]
    assert len(ids) > 1000
    assert _stream(recorder, ids)[0] == tokenizer.decode(ids, skip_special_tokens=True)
    # context (the last text-bearing tokens) and the tokens held for an unfinished character
    assert recorder.longest <= 2 * (HOLD_LIMIT + 1)


def test_empty_stop_strings_are_refused(tokenizers: dict[str, Tokenizer]) -> None:
    with pytest.raises(InputError, match="stop"):
        TextStream(tokenizers["byte-level"], stop=["end", ""])


def test_flush_ends_the_stream(tokenizers: dict[str, Tokenizer]) -> None:
    tokenizer = tokenizers["byte-level"]
    ids = tokenizer.encode("日本").ids
    cut = max(k for k in range(1, len(ids)) if tokenizer.decode(ids[:k]).endswith("\ufffd"))
    stream = TextStream(tokenizer)
    shown = "".join(stream.push(i).text for i in ids[:cut])  # ends within a character
    assert shown + stream.flush() == tokenizer.decode(ids[:cut])
    assert stream.flush() == ""
    assert stream.push(ids[cut]) == Delta("", True)


def test_byte_fallback_with_an_invalid_byte(tokenizers: dict[str, Tokenizer]) -> None:
    """The one divergence from the full decode: a valid character shown before an invalid byte of the
    same byte run stays shown (the full decode turns the whole run into U+FFFD)."""
    tokenizer = tokenizers["byte-fallback"]
    ids = [*tokenizer.encode("Grö").ids, _id_of(tokenizer, "<0xE6>"), *tokenizer.encode("x").ids]
    assert tokenizer.decode(ids) == "Gr\ufffd\ufffd\ufffd x"
    assert _stream(tokenizer, ids)[0] == "Grö\ufffd\ufffd\ufffd x"


def test_a_transformers_tokenizer_works_too(bpe_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bpe_dir)
    ids = tokenizer.encode("Größe: 日本語 🙂 ok<|im_end|>")
    assert _stream(tokenizer, ids, stop=["ok"])[0] == "Größe: 日本語 🙂 "
    assert _stream(tokenizer, ids)[0] == tokenizer.decode(ids, skip_special_tokens=True) == "Größe: 日本語 🙂 ok"
