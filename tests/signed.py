"""Signing material for the tests: EC key pairs, a small bundle to sign, and a tamperer that keeps
the checksums right (so only the signature can tell)."""

from __future__ import annotations

import json
from pathlib import Path

from ortpack.kernel.bundle import write_bundle
from tests.models import minimal_manifest


def make_key_pair(directory: Path, name: str = "key", curve: str = "secp256r1") -> tuple[Path, Path]:
    """An EC key pair as PEM files: (private, public)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1() if curve == "secp384r1" else ec.SECP256R1())
    private, public = directory / f"{name}.pem", directory / f"{name}.pub.pem"
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public


def tamper_and_rehash(bundle: Path, rel: str, data: bytes) -> None:
    """Replace a file and rewrite its sha256 and size in manifest.json: checksums alone cannot tell."""
    import hashlib

    (bundle / rel).write_bytes(data)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def make_bundle(root: Path, model: bytes = b"model bytes: a stand-in for an ONNX graph") -> Path:
    src = root / "src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "model.onnx").write_bytes(model)
    (src / "tokenizer.json").write_text("{}")
    out = root / "bundle"
    files = {"variants/cpu-fp32/model.onnx": src / "model.onnx", "tokenizer.json": src / "tokenizer.json"}
    write_bundle(out, minimal_manifest(), files)
    return out
