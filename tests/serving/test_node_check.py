"""The node check: a serving node replays the bundle's probe set through the variant it is about
to serve and applies that variant's gate before ready; `auto` falls back, an explicit variant
refuses to start. Also the choice of variant by evidence from this kind of CPU."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from ortpack.kernel.bundle import Manifest, read_manifest, sha256_file, verify_bundle
from ortpack.kernel.hardware import HardwareInfo
from ortpack.kernel.selection import candidate_variants
from tests.models import minimal_manifest
from tests.servers import running_server


def tamper_variant(bundle: Path, variant_id: str) -> None:
    """Change the variant's weights, then rewrite its sha256 and size in manifest.json, as an
    attacker (or a broken copy tool that also 'fixes' checksums) would: checksums still verify."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    rel = f"variants/{variant_id}/model.onnx"
    model = onnx.load(str(bundle / rel))
    weights = max(
        (i for i in model.graph.initializer if i.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.FLOAT)),
        key=lambda i: int(np.prod(i.dims)),
    )
    array = numpy_helper.to_array(weights)
    weights.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(-array), weights.name))  # sign flip
    onnx.save(model, str(bundle / rel))
    manifest["files"][rel] = {"sha256": sha256_file(bundle / rel), "bytes": (bundle / rel).stat().st_size}
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=2))


@pytest.fixture(scope="module")
def tampered_bundle(tiny_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tampered") / "tiny-bert"
    shutil.copytree(tiny_bundle, out)
    tamper_variant(out, "cpu-int8")
    # The tiny model's int8 variant measures slower than fp32, so `auto` would pick fp32 first;
    # without benchmark evidence the preference order (int8, then fp32) puts int8 first.
    manifest = json.loads((out / "manifest.json").read_text())
    for variant in manifest["variants"]:
        variant["benchmark"]["hardware"] = None
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    verify_bundle(out)  # every checksum verifies: only the numbers can tell
    return out


def test_bundle_carries_the_probe_and_where_it_was_proven(tiny_bundle: Path) -> None:
    manifest = read_manifest(tiny_bundle)
    assert manifest.probe is not None and manifest.probe.samples >= 32
    assert manifest.probe.file in manifest.files
    for variant in manifest.variants:
        parity = variant.parity
        assert parity.hardware is not None and parity.hardware.cores >= 1
        assert parity.validated_on == "CPUExecutionProvider" and not parity.off_target
        assert parity.probe is not None and parity.probe.passed and parity.probe.samples == manifest.probe.samples
        assert variant.benchmark.hardware is not None and variant.benchmark.execution_providers


def test_auto_falls_back_to_a_variant_that_passes_on_this_node(tampered_bundle: Path, tmp_path: Path) -> None:
    with running_server(tampered_bundle, log_dir=tmp_path) as server:
        meta = httpx.get(f"{server.url}/v2/models/tiny-bert").json()
        assert meta["parameters"]["variant"] == "cpu-fp32"
        check = meta["parameters"]["node_check"]
        assert check["passed"] and check["values"]["min_cosine"] > 0.99999
        (rejected,) = meta["parameters"]["rejected_variants"]
        assert rejected["variant"] == "cpu-int8" and not rejected["passed"]
        metrics = httpx.get(f"{server.url}/metrics").text
        assert 'ortpack_parity_passed{variant="cpu-int8"} 0.0' in metrics
        assert 'ortpack_parity_passed{variant="cpu-fp32"} 1.0' in metrics
        assert 'ortpack_parity_min_cosine{variant="cpu-fp32"}' in metrics
        emb = httpx.post(f"{server.url}/v1/embeddings", json={"input": "hello"}).json()
        assert len(emb["data"][0]["embedding"]) == 64
    log = server.output()
    warnings = [line for line in log.splitlines() if "missed its gate on this node" in line]
    assert len(warnings) == 1 and "cpu-int8" in warnings[0] and "trying cpu-fp32" in warnings[0]


def test_explicit_variant_that_misses_refuses_to_start(tampered_bundle: Path, tmp_path: Path) -> None:
    with running_server(tampered_bundle, "--variant", "cpu-int8", log_dir=tmp_path, wait_ready=False) as server:
        code = server.process.wait(60)
    lines = [line for line in server.output().splitlines() if line.startswith("ortpack-serve: error")]
    assert code == 2, server.output()
    assert len(lines) == 1 and "passes its parity gate on this node" in lines[0] and "cpu-int8" in lines[0]
    assert "Traceback" not in server.output()


def test_untampered_variant_serves_with_its_check(tiny_bundle: Path, tmp_path: Path) -> None:
    with running_server(tiny_bundle, "--variant", "cpu-int8", log_dir=tmp_path) as server:
        meta = httpx.get(f"{server.url}/v2/models/tiny-bert").json()
    assert meta["parameters"]["variant"] == "cpu-int8"
    assert meta["parameters"]["node_check"]["passed"] and meta["parameters"]["rejected_variants"] == []


def test_bundle_check_is_a_preflight(tiny_bundle: Path, tampered_bundle: Path) -> None:
    def check(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ortpack.pipelines.cli", "bundle", "check", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    ok = check(str(tiny_bundle), "--variant", "cpu-int8")
    assert ok.returncode == 0, ok.stderr
    assert "cpu-int8" in ok.stdout and "passed" in ok.stdout
    missed = check(str(tampered_bundle), "--variant", "cpu-int8")
    assert missed.returncode == 1, missed.stderr
    assert missed.stderr.count("\n") == 1 and "ortpack: error:" in missed.stderr
    fallback = check(str(tampered_bundle))  # auto: int8 misses, fp32 would be served
    assert fallback.returncode == 0, fallback.stderr
    assert "cpu-int8" in fallback.stdout and "cpu-fp32" in fallback.stdout


# ---------------------------------------------------------------- choosing a variant


def _manifest(bench: dict[str, tuple[float, list[str]]]) -> Manifest:
    fields = minimal_manifest()
    base = fields["variants"][0]
    variants = []
    for variant_id, (p50, features) in bench.items():
        precision = variant_id.split("-")[1]
        variants.append(
            {
                **base,
                "id": variant_id,
                "precision": precision,
                "file": f"variants/{variant_id}/model.onnx",
                "benchmark": {
                    "shapes": {"b1_s16": {"p50_ms": p50}},
                    "hardware": {
                        "machine": "x86_64",
                        "cpu_model": "x",
                        "features": features,
                        "cores": 2,
                        "int8_kernel": "x",
                    },
                },
            }
        )
    fields.update(variants=variants, schema_version=2, created_at="now")
    return Manifest.model_validate(fields)


def _cpu(*features: str) -> HardwareInfo:
    return HardwareInfo(machine="x86_64", cpu_model="test", features=features, cores=2)


CPU = ["CPUExecutionProvider"]


def test_auto_orders_by_benchmark_measured_on_this_kind_of_cpu() -> None:
    # int8 measured slower than fp32 (a static-int8 MobileNetV3) on a CPU with no more features
    manifest = _manifest({"cpu-int8": (3.0, ["avx2"]), "cpu-fp32": (2.0, ["avx2"])})
    assert [v.id for v in candidate_variants(manifest, "auto", CPU, _cpu("avx2", "avx512_vnni"))] == [
        "cpu-fp32",
        "cpu-int8",
    ]


def test_benchmark_from_another_cpu_kind_is_not_evidence() -> None:
    manifest = _manifest(
        {"cpu-fp32": (9.0, ["avx2", "avx512_vnni"]), "cpu-int8": (1.0, ["avx2", "avx512_vnni"])},
    )
    # measured with VNNI, served without: the preference order (int8, then fp32) decides
    on_avx2 = candidate_variants(manifest, "auto", CPU, _cpu("avx2"))
    assert [v.id for v in on_avx2] == ["cpu-int8", "cpu-fp32"]


def test_no_variant_for_these_providers() -> None:
    from ortpack.kernel.bundle import BundleError

    manifest = _manifest({"cpu-fp32": (2.0, ["avx2"])})
    with pytest.raises(BundleError, match="no variant of demo runs on this machine"):
        candidate_variants(manifest, "auto", ["CUDAExecutionProvider"], _cpu("avx2"))


def test_a_file_swapped_during_start_up_is_never_served(tiny_bundle: Path, tmp_path: Path) -> None:
    """While a thread keeps swapping the int8 model on disk between the packaged file and a
    tampered one (checksums not rewritten), every start either refuses (it read the tampered
    bytes: checksum mismatch) or serves exactly the packaged model: the session is created from
    the bytes that were hashed, never re-read from the path."""
    import os
    import threading
    import time

    from ortpack.kernel.bundle import BundleError
    from ortpack.serving.config import ServeConfig
    from ortpack.serving.metrics import Metrics
    from ortpack.serving.service import load_service

    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, bundle)
    rel = "variants/cpu-int8/model.onnx"
    good = (bundle / rel).read_bytes()
    tamper_variant(bundle, "cpu-int8")
    bad = (bundle / rel).read_bytes()
    shutil.copyfile(tiny_bundle / "manifest.json", bundle / "manifest.json")  # the packaged checksums
    stop = threading.Event()

    def swap() -> None:  # the tampered file is on disk ~10% of the time, the packaged one ~90%
        staged = bundle / "variants/cpu-int8/.swap"
        while not stop.is_set():
            for data, seconds in ((bad, 0.001), (good, 0.009)):
                staged.write_bytes(data)
                os.replace(staged, bundle / rel)
                time.sleep(seconds)

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    served, refused = 0, 0
    try:
        for _ in range(8):
            try:
                service = load_service(
                    bundle, ServeConfig(bundle=str(bundle), variant="cpu-int8", warmup=False), Metrics()
                )
            except BundleError as exc:
                assert "checksum mismatch" in str(exc) or "size mismatch" in str(exc)
                refused += 1
                continue
            # a tampered model would miss its gate here (NodeCheckError), failing the assertion above
            assert service.node_check is not None and service.node_check.passed
            served += 1
    finally:
        stop.set()
        swapper.join(10)
    assert served + refused == 8 and served >= 1
