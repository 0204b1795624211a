"""Shared fixtures: tiny models built offline, and one tiny export/build reused across tests."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# A few timed calls per measurement, not seconds of them (components/core/timing.py): the tests check
# that timings are taken and recorded, never their values. Subprocesses (the CLI, kfp.local's steps,
# servers) inherit it.
os.environ.setdefault("ORTPACK_TIMING", "quick")

# The trained-model tests (end_to_end/trained/: minutes each, every core busy in ONNX Runtime and
# PyTorch). `make test` runs the suite on two pytest-xdist workers with `--dist loadgroup`, which
# here means the scheduler below: these run one after another on one worker, scheduled first,
# while the other worker takes the rest; every other module stays whole on one worker, so its
# module fixtures are built once. Two of them at once on two cores only slowed both
# (all-MiniLM-L6-v2's build: 165 s alone, 313 s beside MPNet's). xdist's own loadgroup marks do
# not work with pytest 9 (it renames `item._nodeid`, which pytest 9 no longer reads), hence a
# scheduler that groups by folder.
TRAINED = Path(__file__).resolve().parent / "end_to_end" / "trained"


def _trained(path: Path) -> bool:
    return path.resolve().parent == TRAINED


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not _trained(item.path))  # stable: the trained ones first


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    if config.getvalue("dist") != "loadgroup":
        return None  # any other --dist keeps xdist's own scheduler
    from xdist.scheduler import LoadScopeScheduling

    class TrainedTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "trained" if _trained(Path(config.rootpath, module)) else module

    return TrainedTogether(config, log)


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.models import make_tiny_bert

    return make_tiny_bert(tmp_path_factory.mktemp("models") / "tiny-bert")


@pytest.fixture(scope="session")
def tiny_export(tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A raw export of the tiny BERT (model.onnx, tokenizer.json, reference.npz, export.json)."""
    from ortpack.components.core.export import export_model
    from ortpack.components.core.specs import ExportSpec

    out = tmp_path_factory.mktemp("export") / "export"
    export_model(ExportSpec(source=str(tiny_bert), task="text-embedding", name="tiny-bert"), out)
    return out


@pytest.fixture(scope="session")
def tiny_variants(tiny_export: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """cpu-fp32 and cpu-int8 built, validated and benchmarked from `tiny_export`."""
    from ortpack.components.core.benchmark import benchmark_variant
    from ortpack.components.core.optimize import optimize_model
    from ortpack.components.core.parity import validate_variant
    from ortpack.components.core.specs import VariantSpec
    from ortpack.components.core.tasks import thresholds_for

    root = tmp_path_factory.mktemp("variants")
    out = {}
    for precision in ("fp32", "int8"):
        variant = VariantSpec(target="cpu", precision=precision)
        vdir = root / variant.id
        optimize_model(tiny_export, variant, vdir)
        validate_variant(vdir, tiny_export, thresholds_for("text-embedding", precision))
        benchmark_variant(vdir, tiny_export, budget_s=0.2)
        out[variant.id] = vdir
    return out


@pytest.fixture(scope="session")
def tiny_bundle(tiny_export: Path, tiny_variants: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ortpack.components.core.package import package_dirs

    out = tmp_path_factory.mktemp("dist") / "tiny-bert"
    package_dirs(tiny_export, list(tiny_variants.values()), out)
    return out


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1, one per test module (its buckets do not leak between modules)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def _quiet_third_party_logs() -> None:
    logging.getLogger("onnxruntime").setLevel(logging.ERROR)
