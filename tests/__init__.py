"""The test suite, in folders by layer: components/, serving/, pipelines/ and end_to_end/ (the
trained models in end_to_end/trained/); conftest.py holds the fixture chain they share."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository
