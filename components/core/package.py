"""Step 5: package every variant that passed its gate into a bundle (see `ortpack.kernel.bundle`)."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ortpack.components.core.artifacts import BenchmarkResult, ExportResult, OptimizeResult, ParityReport, VariantRecord
from ortpack.components.core.errors import InvalidSpecError, NoVariantPassedError
from ortpack.components.core.sources import ARCHIVE_SUFFIXES, s3_client, s3_errors, uri_scheme
from ortpack.kernel.bundle import DATA_SUFFIX, Manifest, sha256_file, variant_file, verify_bundle, write_bundle
from ortpack.kernel.oci import OciReference, push_bundle
from ortpack.kernel.probe import Probe
from ortpack.kernel.signing import sign_bundle

log = logging.getLogger("ortpack.package")


def variant_record(built: OptimizeResult, parity: ParityReport, bench: BenchmarkResult | None) -> dict[str, Any]:
    return {
        "id": built.variant_id,
        "target": built.target,
        "precision": built.precision,
        "execution_providers": built.execution_providers,
        "file": variant_file(built.variant_id),
        "ort_version": built.ort_version,
        "opset": built.opset,
        "offline_optimization_level": built.offline_optimization_level,
        "online_optimization_level": built.online_optimization_level,
        "optimize": built.metrics,
        "parity": {
            "passed": parity.passed,
            "validated_on": parity.validated_on,
            "samples": parity.samples,
            "thresholds": parity.thresholds,
            "values": parity.values,
            "hardware": parity.hardware or None,
            "probe": parity.probe or None,
            "off_target": parity.off_target,
        },
        "benchmark": {
            "shapes": bench.shapes,
            "speedup_vs_torch": bench.speedup_vs_torch,
            "execution_providers": bench.execution_providers,
            "hardware": bench.hardware or None,
            "threads": bench.threads,
        }
        if bench
        else {},
    }


def package_bundle(
    export_dir: Path,
    records: list[VariantRecord],
    out_dir: Path,
    *,
    version: str = "1",
    force: bool = False,
    report_html: Path | None = None,
) -> Manifest:
    """Write the bundle for every variant in `records` that passed its gate.

    Raises `NoVariantPassedError`, listing every variant's misses, when none passed; the bundle
    is written atomically, so a failure leaves nothing at `out_dir`.
    """
    import onnxruntime

    export_dir = Path(export_dir)
    export = ExportResult.load(export_dir)
    variants, files = [], {}
    for rec in records:
        if not rec.passed:
            log.warning("package: dropping %s", rec.parity.summary())
            continue
        entry = variant_record(rec.built, rec.parity, rec.benchmark)
        data = rec.model_dir / (rec.built.model_file + DATA_SUFFIX)
        if data.is_file():  # weights beyond 2 GB, beside the graph (named inside it)
            entry["data_file"] = entry["file"] + DATA_SUFFIX
            files[entry["data_file"]] = data
        variants.append(entry)
        files[entry["file"]] = rec.model_dir / rec.built.model_file
    if not variants:
        raise NoVariantPassedError(
            "no variant passed its parity gate: " + " | ".join(r.parity.summary() for r in records)
        )
    for name in export.extra_files:
        files[name] = export_dir / name
    if report_html is not None:
        files["report.html"] = Path(report_html)
    manifest: dict[str, Any] = export.manifest_fields()
    probe_file = next((f for f in export.extra_files if f.startswith("probe/")), None)
    if probe_file is not None:
        samples = len(Probe.from_bytes((export_dir / probe_file).read_bytes()).inputs)
        manifest["probe"] = {"file": probe_file, "samples": samples}
    manifest.update(
        version=version,
        variants=variants,
        versions={**export.versions, "onnxruntime": onnxruntime.__version__, "ortpack": _ortpack_version()},
    )
    written = write_bundle(Path(out_dir), manifest, files, force=force)
    log.info("package: wrote %s with variants %s", out_dir, ", ".join(v.id for v in written.variants))
    return written


def package_dirs(export_dir: Path, variant_dirs: list[Path], out_dir: Path, **kwargs: Any) -> Manifest:
    """`package_bundle` for directories that each hold a variant's graph and records."""
    records = sorted((VariantRecord.load(d) for d in variant_dirs), key=lambda r: r.variant_id)
    return package_bundle(export_dir, records, out_dir, **kwargs)


def _ortpack_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ortpack")
    except PackageNotFoundError:
        return "0+unknown"


# ---------------------------------------------------------------------------- the pipeline's verdict

VERDICT_FILE = "verdict.json"


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """What the package step decided, written as an artifact of its own before the run's outcome:
    on a Kubeflow backend a failed step uploads none of its outputs, so the package step never
    fails; the gate step after it fails the run from this record, and the record survives."""

    passed: bool
    name: str
    version: str
    variants: dict[str, list[str]]  # variant id -> its misses ([] when it passed)
    reason: str = ""  # one line, when nothing ships
    manifest_sha256: str | None = None
    signed: bool = False
    # the comparison with `baseline_bundle` (compat.BaselineCheck.as_dict), when one was given
    compatibility: dict[str, Any] | None = None

    def save(self, directory: Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / VERDICT_FILE
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, directory: Path) -> Verdict:
        path = Path(directory) / VERDICT_FILE
        if not path.is_file():
            raise ValueError(f"{directory} holds no {VERDICT_FILE}")
        raw = json.loads(path.read_text())
        return cls(**{k: v for k, v in raw.items() if k in {f.name for f in fields(cls)}})

    def raise_if_failed(self) -> None:
        if not self.passed:
            raise NoVariantPassedError(self.reason or "no variant passed its parity gate")


def sign_key_password(key: Path) -> str | None:
    """The signing key's password: $ORTPACK_SIGN_KEY_PASSWORD, else a `password` file beside the
    key (the signing secret's optional `password` key), else none."""
    import os

    if os.environ.get(SIGN_PASSWORD_ENV):
        return os.environ[SIGN_PASSWORD_ENV]
    beside = Path(key).with_name("password")
    return beside.read_text().strip() if beside.is_file() else None


SIGN_PASSWORD_ENV = "ORTPACK_SIGN_KEY_PASSWORD"


def sign_written_bundle(bundle_dir: Path, key: Path) -> str:
    """Sign a bundle (OpenSSF model signing, kernel/signing.py); return the key's fingerprint."""

    key = Path(key)
    if not key.is_file():
        raise InvalidSpecError(
            f"signing key not found: {key} (on a cluster: does the signing secret exist, with a key.pem entry?)"
        )

    signature = sign_bundle(Path(bundle_dir), key, password=sign_key_password(key))
    log.info("package: signed %d files (key sha256 %s)", len(signature.files), signature.key_fingerprint[:16])
    return signature.key_fingerprint


# ---------------------------------------------------------------------------- publishing


def publish_bundle(bundle_dir: Path, destination: str) -> str:
    """Publish a verified bundle and return its pinned URI.

    `oci://HOST[:PORT]/REPO[:TAG]`: pushed as an OCI artifact (kernel/oci.py; the tag defaults to
    the bundle's version), returned as `oci://HOST/REPO@sha256:...`. `s3://BUCKET/PREFIX/` (or
    `minio://`): uploaded as `PREFIX/NAME-VERSION.tar` (or to the `.tar` key given), never over
    an existing object, with the tar's sha256 as object metadata; returned as its URI."""

    manifest = verify_bundle(Path(bundle_dir))
    scheme = uri_scheme(destination)
    if scheme == "oci":
        ref = OciReference.parse(destination)
        target = destination if ref.tag or ref.digest else f"{destination}:{manifest.version}"
        return push_bundle(Path(bundle_dir), target)
    if scheme in ("s3", "minio"):
        return _publish_tar(Path(bundle_dir), destination, f"{manifest.name}-{manifest.version}.tar")
    raise InvalidSpecError(
        f"cannot publish to {destination!r}: use oci://HOST[:PORT]/REPO[:TAG] or s3://BUCKET/PREFIX/ (or minio://)"
    )


def _publish_tar(bundle_dir: Path, destination: str, default_key: str) -> str:
    import tarfile
    import tempfile
    import urllib.parse

    parts = urllib.parse.urlsplit(destination)
    bucket, key = parts.netloc, parts.path.lstrip("/")
    if not bucket:
        raise InvalidSpecError(f"publish destination has no bucket: {destination}")
    if not key.endswith(ARCHIVE_SUFFIXES):
        key = (key.rstrip("/") + "/" if key else "") + default_key
    uri = f"{parts.scheme}://{bucket}/{key}"
    client = s3_client(destination)
    from botocore.exceptions import ClientError

    with s3_errors(uri):
        try:
            client.head_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code", "")) not in ("404", "NoSuchKey", "NotFound"):
                raise
        else:
            raise InvalidSpecError(f"{uri} exists: a published bundle is never replaced (give another --version)")
        with tempfile.TemporaryDirectory(prefix="ortpack-publish-") as tmp:
            archive = Path(tmp) / "bundle.tar"
            with tarfile.open(archive, "w") as tar:
                for path in sorted(p for p in bundle_dir.rglob("*") if p.is_file()):
                    tar.add(path, arcname=path.relative_to(bundle_dir).as_posix(), recursive=False)
            sha = sha256_file(archive)
            client.upload_file(str(archive), bucket, key, ExtraArgs={"Metadata": {"sha256": sha}})
    log.info("publish: %s (sha256 %s)", uri, sha)
    return uri
