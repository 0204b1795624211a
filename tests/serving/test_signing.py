"""Signed bundles: the real model-signing library, real EC keys, real bundles on disk, the real CLI."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ortpack.kernel.bundle import BundleError, sha256_file, verify_bundle
from ortpack.kernel.signing import (
    SIGNATURE_NAME,
    SignatureCoverageError,
    SignatureInvalidError,
    SignatureMissingError,
    SigningKeyError,
    sign_bundle,
    verify_signature,
)
from tests.cli import assert_one_line_error, ortpack
from tests.signed import make_bundle, make_key_pair, tamper_and_rehash


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    return make_key_pair(tmp_path)


@pytest.fixture
def signed(tmp_path: Path, keys: tuple[Path, Path]) -> Path:
    bundle = make_bundle(tmp_path)
    sign_bundle(bundle, keys[0])
    return bundle


def test_sign_then_verify(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    bundle = make_bundle(tmp_path)
    made = sign_bundle(bundle, keys[0])
    assert made.path == bundle / SIGNATURE_NAME
    assert made.files == ("manifest.json", "tokenizer.json", "variants/cpu-fp32/model.onnx")
    assert (bundle / SIGNATURE_NAME).stat().st_mode & 0o777 == 0o644
    checked = verify_signature(bundle, keys[1])
    assert checked.files == made.files and checked.key_fingerprint == made.key_fingerprint
    assert checked.digests == {rel: sha256_file(bundle / rel) for rel in made.files} == made.digests
    # the OpenSSF model signing format: a Sigstore bundle around a DSSE envelope of an in-toto statement
    document = json.loads((bundle / SIGNATURE_NAME).read_text())
    statement = json.loads(base64.b64decode(document["dsseEnvelope"]["payload"]))
    assert statement["predicateType"] == "https://model_signing/signature/v1.0"
    assert {r["name"] for r in statement["predicate"]["resources"]} == set(made.files)
    assert [p.name for p in bundle.iterdir() if p.name.startswith(".")] == []


def test_tampered_and_rehashed_model_passes_checksums_but_not_the_signature(
    signed: Path, keys: tuple[Path, Path]
) -> None:
    tamper_and_rehash(signed, "variants/cpu-fp32/model.onnx", b"a different model")
    verify_bundle(signed)  # the manifest's checksums agree with the files again
    with pytest.raises(SignatureCoverageError) as err:
        verify_signature(signed, keys[1])
    assert "changed after signing: manifest.json, variants/cpu-fp32/model.onnx" in str(err.value)
    assert "\n" not in str(err.value)


def test_signature_from_another_key_is_refused(signed: Path, tmp_path: Path) -> None:
    _, other = make_key_pair(tmp_path, "other")
    with pytest.raises(SignatureInvalidError, match="made with another key than trust key"):
        verify_signature(signed, other)
    # without the key hint in model.sig, the ECDSA check itself refuses
    document = json.loads((signed / SIGNATURE_NAME).read_text())
    document["verificationMaterial"]["publicKey"]["hint"] = ""
    (signed / SIGNATURE_NAME).write_text(json.dumps(document))
    with pytest.raises(SignatureInvalidError, match="does not verify with trust key"):
        verify_signature(signed, other)


def test_altered_signature_is_refused(signed: Path, keys: tuple[Path, Path]) -> None:
    document = json.loads((signed / SIGNATURE_NAME).read_text())
    statement = json.loads(base64.b64decode(document["dsseEnvelope"]["payload"]))
    statement["predicate"]["resources"][0]["digest"] = "0" * 64  # claim another digest for manifest.json
    document["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    (signed / SIGNATURE_NAME).write_text(json.dumps(document))
    with pytest.raises(SignatureInvalidError):
        verify_signature(signed, keys[1])
    (signed / SIGNATURE_NAME).write_text("{not json")
    with pytest.raises(SignatureInvalidError):
        verify_signature(signed, keys[1])


def test_unsigned_bundle_is_refused(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    bundle = make_bundle(tmp_path)
    with pytest.raises(SignatureMissingError, match=f"bundle is not signed: .* has no {SIGNATURE_NAME}"):
        verify_signature(bundle, keys[1])


@pytest.mark.parametrize("added", ["extra.onnx", ".gitignore", ".git/config", "variants/cpu-fp32/.gitattributes"])
def test_file_added_after_signing_is_refused(signed: Path, keys: tuple[Path, Path], added: str) -> None:
    # model-signing by itself skips .git* paths; a bundle's signature must cover every file
    (signed / added).parent.mkdir(parents=True, exist_ok=True)
    (signed / added).write_text("added later")
    verify_bundle(signed)  # files the manifest does not list are ignored by the checksums
    with pytest.raises(SignatureCoverageError, match=f"added after signing: {added}"):
        verify_signature(signed, keys[1])


def test_file_removed_after_signing_is_refused(signed: Path, keys: tuple[Path, Path]) -> None:
    (signed / "tokenizer.json").unlink()
    with pytest.raises(SignatureCoverageError, match="removed after signing: tokenizer.json"):
        verify_signature(signed, keys[1])


def test_signature_that_leaves_a_file_out_is_refused(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    """A signer's own ignore list (honoured by model-signing) must not hide a file from the check."""
    from model_signing import hashing, signing

    bundle = make_bundle(tmp_path)
    partial = hashing.Config().set_ignored_paths(paths=[SIGNATURE_NAME, "tokenizer.json"], ignore_git_paths=False)
    signing.Config().use_elliptic_key_signer(private_key=keys[0]).set_hashing_config(partial).sign(
        bundle, bundle / SIGNATURE_NAME
    )
    with pytest.raises(SignatureCoverageError, match="added after signing: tokenizer.json"):
        verify_signature(bundle, keys[1])


def test_links_are_refused(signed: Path, keys: tuple[Path, Path]) -> None:
    os.symlink("tokenizer.json", signed / "alias.json")
    with pytest.raises(SignatureCoverageError, match="links are not allowed"):
        verify_signature(signed, keys[1])


def test_resigning_replaces_the_signature(signed: Path, tmp_path: Path) -> None:
    private, public = make_key_pair(tmp_path, "second", curve="secp384r1")
    sign_bundle(signed, private)
    assert verify_signature(signed, public).files[0] == "manifest.json"


def test_unusable_keys_and_bundles(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    bundle = make_bundle(tmp_path)
    rsa_key = tmp_path / "rsa.pem"
    rsa_key.write_bytes(
        rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    with pytest.raises(SigningKeyError, match="not an elliptic-curve key"):
        sign_bundle(bundle, rsa_key)
    with pytest.raises(SigningKeyError, match="cannot read signing key"):
        sign_bundle(bundle, tmp_path / "missing.pem")
    with pytest.raises(SigningKeyError, match="not a PEM public key"):
        verify_signature(bundle, keys[0])  # the private half is not a trust key
    assert not (bundle / SIGNATURE_NAME).exists()
    (bundle / "tokenizer.json").write_text("changed")
    with pytest.raises(BundleError, match="size mismatch for tokenizer.json"):
        sign_bundle(bundle, keys[0])  # only a bundle that verifies is signed
    assert not (bundle / SIGNATURE_NAME).exists()


# --- the CLI ------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_sign_and_verify(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    bundle = make_bundle(tmp_path)
    private, public = keys
    unsigned = ortpack("bundle", "verify", str(bundle), "--trust-key", str(public))
    assert_one_line_error(unsigned, 2, "bundle is not signed")
    plain = ortpack("bundle", "verify", str(bundle))
    assert plain.returncode == 0 and "unsigned" in plain.stderr

    done = ortpack("bundle", "sign", str(bundle), "--key", str(private))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"signed: {bundle / SIGNATURE_NAME} (3 files, key sha256 ")
    ok = ortpack("bundle", "verify", str(bundle), "--trust-key", str(public))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("ok: demo 3 (text-embedding)") and "signature verified (3 files" in ok.stdout
    from_env = ortpack("bundle", "verify", str(bundle), env={"ORTPACK_TRUST_KEY": str(public)})
    assert from_env.returncode == 0 and "signature verified" in from_env.stdout
    unchecked = ortpack("bundle", "verify", str(bundle))
    assert unchecked.returncode == 0 and "signature (model.sig) was not checked" in unchecked.stderr

    _, other = make_key_pair(tmp_path, "other")
    assert_one_line_error(
        ortpack("bundle", "verify", str(bundle), "--trust-key", str(other)), 2, "made with another key"
    )
    tampered = tmp_path / "tampered"
    shutil.copytree(bundle, tampered)
    tamper_and_rehash(tampered, "variants/cpu-fp32/model.onnx", b"evil")
    assert ortpack("bundle", "verify", str(tampered)).returncode == 0  # checksums alone pass
    assert_one_line_error(
        ortpack("bundle", "verify", str(tampered), "--trust-key", str(public)),
        2,
        "signature does not cover every file in",
    )
    (bundle / "new.txt").write_text("added")
    assert_one_line_error(
        ortpack("bundle", "verify", str(bundle), "--trust-key", str(public)), 2, "added after signing: new.txt"
    )
    assert_one_line_error(
        ortpack("bundle", "sign", str(bundle), "--key", str(tmp_path / "none.pem")), 2, "cannot read signing key"
    )


def test_encrypted_signing_key_from_env(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    private, public = tmp_path / "enc.pem", tmp_path / "enc.pub.pem"
    encryption = serialization.BestAvailableEncryption(b"s3cret")
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    bundle = make_bundle(tmp_path)
    assert_one_line_error(ortpack("bundle", "sign", str(bundle), "--key", str(private)), 2, "cannot use signing key")
    done = ortpack(
        "bundle", "sign", str(bundle), "--key", str(private), "--key-password-env", "KEY_PW", env={"KEY_PW": "s3cret"}
    )
    assert done.returncode == 0, done.stderr
    assert verify_signature(bundle, public).files


def test_serving_start_does_not_import_signing_or_registry_libraries() -> None:
    """Without --trust-key or an oci:// bundle, model-signing (sigstore) and oras stay unimported."""
    code = (
        "import sys, ortpack.serving.__main__, ortpack.kernel.signing, ortpack.kernel.oci, ortpack.kernel.sources, "
        "ortpack.serving.config;"
        "print(','.join(sorted(m for m in ('model_signing', 'sigstore', 'oras', 'requests', 'cryptography') "
        "if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""
