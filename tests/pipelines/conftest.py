"""Fixtures of the pipeline tests (the shared chain is tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def fake_kfp() -> Iterator[str]:
    """A fake Kubeflow Pipelines API on 127.0.0.1 (tests/kfp_api.py): its URL."""
    from tests.kfp_api import serve_fake_kfp

    yield from serve_fake_kfp()
