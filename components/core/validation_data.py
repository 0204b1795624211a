"""The validation sets the project ships (parity inputs, never downloaded)."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources


@cache
def validation_sentences() -> tuple[str, ...]:
    """560+ varied sentences: many topics and languages, punctuation, empty-ish strings, and
    paragraphs longer than 256 tokens (they test truncation)."""
    text = resources.files("components.core").joinpath("data/validation_sentences.jsonl").read_text("utf-8")
    return tuple(json.loads(line) for line in text.splitlines() if line.strip())
