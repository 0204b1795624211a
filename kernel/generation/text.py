"""Token ids to text as they arrive (incremental detokenizing), with OpenAI's stop strings, for one
sequence.

Decoding token by token and joining the pieces is wrong twice over: with byte-level BPE a character
outside ASCII is often split over 2-3 tokens (each alone decodes to U+FFFD), and SentencePiece's
Metaspace decoder drops the leading space of whatever comes first (so "▁world" alone is "world").
This does what vLLM and TGI do instead: it decodes a short window of ids, a few already shown
(context) and the new ones, and emits what the new ones add to the context's text; while that
text ends with U+FFFD it waits for the bytes that complete the character. Each push decodes that
window only (a few ids, twice when it emits), however long the text grows.

Why a window is exact:
- byte-level BPE (GPT-2, Llama 3, Qwen): the decoder turns every token into its bytes and decodes
  them all at once, replacing invalid sequences with U+FFFD; that decoding splits cleanly at any
  point where a character is complete. The window starts where the text emitted so far did not
  end with U+FFFD, so its text is exactly the full text's from there on.
- SentencePiece (Metaspace: "▁" for a space; Llama 2's Replace + ByteFallback + Fuse + Strip):
  each token decodes alone (byte-fallback tokens in runs, again split cleanly where a character
  is complete), except that the window's first token loses its leading space. That token is
  context, decoded the same way in the window and in the context, so the new tokens' text is
  exactly the full text's.
- Not exact: Llama 2's ByteFallback decodes a run of byte tokens strictly, so one invalid byte
  turns the whole run into U+FFFD, characters already shown included: "Grö" and a stray byte
  stream as "Grö���" where the full decode has "Gr���" (a trained model seldom emits invalid
  UTF-8). Decoders that rewrite text across tokens, such as WordPiece's cleanup of " ." (no
  generative model uses one). A model that emits more than HOLD_LIMIT tokens in a row that never
  complete a character (the window is then cut).

Stop strings (OpenAI `stop`): the text is cut right before the first occurrence (the earliest
start) of any of them in the full text, the stop string itself never returned, found even when it
spans tokens. Text that could be the start of a stop string is held back, only the longest such
suffix, so text is never delayed more than a stop string needs. A stop string that is complete
waits while one starting earlier may still complete ("at" in "the cat s", stop=["the cat sat",
"at"]): vLLM stops at whichever completes first, so its cut depends on how the text was split into
tokens; this one does not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ortpack.kernel.errors import InputError

REPLACEMENT = "\ufffd"
# Tokens held while the window's text ends with U+FFFD before the text is emitted as it stands: a
# character has at most 4 bytes, so only a model emitting garbage holds this many (the window must
# stay bounded; the price is one U+FFFD too many if such a run ends in a character after all).
HOLD_LIMIT = 16


class TokenDecoder(Protocol):
    """What TextStream needs of a tokenizer: tokenizers.Tokenizer's decode (a transformers fast
    tokenizer's decode takes the same arguments)."""

    def decode(self, ids: list[int], /, *, skip_special_tokens: bool) -> str: ...


@dataclass(frozen=True, slots=True)
class Delta:
    text: str  # new text safe to send now (may be "")
    stopped: bool  # a stop string was found: `text` ends right before it, and nothing more will come


class TextStream:
    """One sequence's text, token by token. `prefix_ids` are the last few prompt ids (vLLM takes 5),
    decoded as context only and never emitted: with them a leading space, or a character split
    across the prompt and the continuation, decodes as in the full text."""

    def __init__(
        self,
        tokenizer: TokenDecoder,
        *,
        stop: Sequence[str] = (),
        skip_special_tokens: bool = True,
        prefix_ids: Sequence[int] = (),
    ) -> None:
        if any(not s for s in stop):
            raise InputError("stop strings must not be empty")
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._stops = tuple(dict.fromkeys(stop))
        # every proper prefix of a stop string: the text that may have to wait for the rest
        self._stop_starts = {s[:length] for s in self._stops for length in range(1, len(s))}
        self._longest_start = max((len(s) - 1 for s in self._stops), default=0)
        # The window: ids[:read] are context (shown, or prompt), ids[read:] not yet shown.
        self._ids = list(prefix_ids)
        self._read = len(self._ids)
        self._context = self._decode(self._ids)
        self._held = ""  # decoded text held back as the possible start of a stop string
        self._parts: list[str] = []
        self._over = False  # a stop string was found, or flush() was called

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    def push(self, token: int) -> Delta:
        """The text `token` adds that is safe to show now."""
        if self._over:
            return Delta("", True)
        self._ids.append(token)
        text = self._decode(self._ids)
        clean = text.startswith(self._context)
        new = text[self._start(text) :]
        unread = len(self._ids) - self._read
        if not new and unread == 1 and self._context and not text.endswith(REPLACEMENT):
            # A token that shows nothing after visible text (a skipped special token): drop it, so
            # that runs of them keep the window short. (After an incomplete character it may be
            # one more of its bytes.)
            self._ids.pop()
            return Delta("", False)
        if (not new or text.endswith(REPLACEMENT)) and unread <= HOLD_LIMIT:
            # Wait for an incomplete character's other bytes; and keep tokens that show nothing yet
            # (Metaspace's first "▁" is a space only once a token follows it)
            return Delta("", False)
        if clean:
            # What was read becomes the context for the next token
            del self._ids[: self._read]
            self._context = self._decode(self._ids)
        else:
            # The window began within a character (a prompt cut there): keep it whole this once, so
            # that the next window starts where a character does
            self._context = text
        self._read = len(self._ids)
        return self._release(new, final=False)

    def flush(self) -> str:
        """At the end (max tokens, an end-of-sequence id): the text held back, unless stopped. The
        stream is over after it."""
        if self._over:
            return ""
        text = self._decode(self._ids)
        delta = self._release(text[self._start(text) :], final=True)
        self._over = True
        return delta.text

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens) if ids else ""

    def _start(self, text: str) -> int:
        """Where the new text begins in the window's `text`: after the context's text, or where they
        part (a prompt ending within a character decodes it as U+FFFD, completed here)."""
        if text.startswith(self._context):
            return len(self._context)
        common = 0
        for a, b in zip(text, self._context, strict=False):
            if a != b:
                break
            common += 1
        return common

    def _release(self, new: str, *, final: bool) -> Delta:
        """Emit what of the held text and `new` cannot be part of a stop string."""
        pending = self._held + new
        found = [index for index in (pending.find(s) for s in self._stops) if index >= 0]
        # The longest suffix that may still become a stop string (none at the end of the stream)
        wait = 0 if final else self._stop_start_length(pending)
        safe = len(pending) - wait
        if found and min(found) <= safe:
            # No stop string can still complete earlier than this one
            self._over = True
            self._held = ""
            return self._emit(pending[: min(found)], stopped=True)
        self._held = pending[safe:]
        return self._emit(pending[:safe], stopped=False)

    def _stop_start_length(self, pending: str) -> int:
        for length in range(min(len(pending), self._longest_start), 0, -1):
            if pending[-length:] in self._stop_starts:
                return length
        return 0

    def _emit(self, text: str, *, stopped: bool) -> Delta:
        if text:
            self._parts.append(text)
        return Delta(text, stopped)
