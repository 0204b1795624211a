"""The quick faults of bench/faults.py, injected for real: a store failing mid-pull (503, a reset,
bytes that differ from the digest), a full filesystem (a 4 MiB tmpfs, where this process may mount
one), two deploy jobs pulling into one cache, a pull and a packaging SIGKILLed mid-write, and the
engine raising in the middle of batches. Each must lose nothing: every request answered, every
failure one line, nothing half-written where it would be used, the re-run verified."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.faults import engine_raises, quick_faults


@pytest.mark.parametrize("key", sorted(quick_faults()))
def test_fault_loses_nothing(key: str, tmp_path: Path) -> None:
    outcome = quick_faults()[key](tmp_path)
    if outcome.seen.startswith("skipped"):
        pytest.skip(outcome.seen)
    assert outcome.lost == 0 and outcome.corrupt == 0, outcome
    assert outcome.ok, outcome


def test_engine_raising_mid_batch_fails_only_its_requests(tiny_bundle: Path) -> None:
    outcome = engine_raises(tiny_bundle)
    assert outcome.lost == 0 and outcome.ok, outcome
