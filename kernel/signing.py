"""Sign a bundle and verify its signature: the OpenSSF Model Signing format, with an EC key pair.

`sign_bundle` hashes every file of a bundle directory (manifest.json included, `model.sig`
excluded) with the `model-signing` library, signs that list with an elliptic-curve private key
(P-256, P-384 or P-521, PEM) and writes the signature into the bundle as `model.sig`: a Sigstore
bundle holding a DSSE envelope around an in-toto statement that lists every file with its sha256.

`verify_signature` checks it against a trusted public key, then checks that the files the
signature covers are exactly the files on disk (except `model.sig`): a file added, removed or
changed after signing is refused, and so is a signature that leaves a file out (the library by
itself skips `.git*` paths and honours ignore lists written by the signer; we do not).

Nothing here replaces `ortpack.kernel.bundle.verify_bundle`: the signature proves who produced these
exact files, the manifest's checksums then tie the files to what the pipeline validated.

`model-signing` (the `sign` extra) is imported inside the functions: a server started without
a trust key never imports it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortpack.kernel.bundle import BundleError, sha256_file, verify_bundle
from ortpack.kernel.errors import one_line

SIGNATURE_NAME = "model.sig"
SUPPORTED_CURVES = ("secp256r1", "secp384r1", "secp521r1")


class SignatureError(BundleError):
    """A bundle's signature cannot be trusted (base class)."""


class SignatureMissingError(SignatureError):
    """The bundle has no `model.sig`."""


class SignatureInvalidError(SignatureError):
    """The signature does not verify with the trusted key: another key signed it, or it was altered."""


class SignatureCoverageError(SignatureError):
    """The signature verifies but does not cover exactly the files on disk."""


class SigningKeyError(SignatureError):
    """A signing or trust key cannot be used (missing, not PEM, not an EC key of a supported curve)."""


@dataclass(frozen=True, kw_only=True)
class BundleSignature:
    """What a signature covers and which key it verified with (or was made with)."""

    path: Path
    files: tuple[str, ...]
    key_fingerprint: str  # sha256 of the public key (SubjectPublicKeyInfo PEM), as model.sig records it
    # path -> hex sha256 the signature vouches for: a loader that reads the files (manifest.json
    # included) once can check the bytes it loads against these, closing the check-then-load window
    digests: dict[str, str] = field(default_factory=dict)


def sign_bundle(bundle_dir: Path, private_key_path: Path, *, password: str | None = None) -> BundleSignature:
    """Sign every file of `bundle_dir` with an EC private key; write `model.sig` into the bundle.

    The bundle is verified first (`verify_bundle`): only a bundle whose files match its manifest
    is signed. An existing `model.sig` is replaced. Raises `BundleError` (a `SigningKeyError` for
    an unusable key) with one line.
    """

    bundle_dir = Path(bundle_dir)
    verify_bundle(bundle_dir)
    key = _load_private_key(Path(private_key_path), password)
    fingerprint = _fingerprint(key.public_key())
    files = _files_on_disk(bundle_dir)

    from model_signing import signing

    work = Path(tempfile.mkdtemp(prefix="ortpack-sign-"))
    try:
        unsigned = work / SIGNATURE_NAME
        try:
            # model-signing 1.1 types the password as str but hands it to cryptography, which needs bytes
            secret: Any = password.encode() if password else None
            config = signing.Config().use_elliptic_key_signer(private_key=private_key_path, password=secret)
            config.set_hashing_config(_hashing_config()).sign(bundle_dir, unsigned)
        except (ValueError, TypeError, OSError) as exc:
            raise SignatureError(f"cannot sign {bundle_dir}: {_one_line(exc)}") from None
        partial = bundle_dir / f".{SIGNATURE_NAME}.partial"
        try:
            shutil.copyfile(unsigned, partial)
            os.chmod(partial, 0o644)  # readable by a non-root server, like every bundle file
            os.replace(partial, bundle_dir / SIGNATURE_NAME)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        public = work / "public.pem"
        public.write_bytes(_public_pem(key.public_key()))
        signed = verify_signature(bundle_dir, public)  # what was written verifies and covers the bundle
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if set(signed.files) != set(files):  # a file appeared or went while hashing
        raise SignatureCoverageError(f"the bundle changed while it was signed: {bundle_dir}")
    return BundleSignature(
        path=bundle_dir / SIGNATURE_NAME, files=signed.files, key_fingerprint=fingerprint, digests=signed.digests
    )


def verify_signature(bundle_dir: Path, public_key_path: Path) -> BundleSignature:
    """Verify `model.sig` with a trusted EC public key and check it covers exactly the bundle's files.

    Raises `SignatureMissingError`, `SignatureInvalidError` (another key, altered signature),
    `SignatureCoverageError` (a file added, removed or changed after signing) or
    `SigningKeyError` (unusable key), each with a one-line message.
    """
    bundle_dir = Path(bundle_dir)
    signature = bundle_dir / SIGNATURE_NAME
    if not bundle_dir.is_dir():
        raise BundleError(f"bundle directory not found: {bundle_dir}")
    public_key_path = Path(public_key_path)
    fingerprint = _fingerprint(_load_public_key(public_key_path))  # a bad key is reported first
    if not signature.is_file() or signature.is_symlink():
        raise SignatureMissingError(f"bundle is not signed: {bundle_dir} has no {SIGNATURE_NAME}")
    on_disk = _files_on_disk(bundle_dir)

    from cryptography.exceptions import InvalidSignature
    from model_signing import verifying

    config = verifying.Config().use_elliptic_key_verifier(public_key=public_key_path)
    try:
        config.set_hashing_config(_hashing_config()).verify(bundle_dir, signature)
    except InvalidSignature:
        raise SignatureInvalidError(
            f"signature of {bundle_dir} does not verify with trust key {public_key_path}: "
            "it was made with another key or altered"
        ) from None
    except (ValueError, KeyError, TypeError, OSError) as exc:
        message = _one_line(exc)
        if message.startswith("Key mismatch"):
            raise SignatureInvalidError(
                f"signature of {bundle_dir} was made with another key than trust key {public_key_path}"
            ) from None
        if message.startswith("Signature mismatch"):  # the signature verified; the files differ
            diff = _describe_difference(_signed_digests(signature), bundle_dir, on_disk)
            raise SignatureCoverageError(
                f"signature does not cover every file in {bundle_dir}: {diff or message}"
            ) from None
        raise SignatureInvalidError(f"signature of {bundle_dir} cannot be verified: {message}") from None
    # The library compared the files it hashed; now check the signed list is every file there is
    # (the signer may have recorded its own ignore list, which the library honours).
    signed = _signed_digests(signature)
    if set(signed) != set(on_disk):
        diff = _describe_difference(signed, bundle_dir, on_disk)
        raise SignatureCoverageError(f"signature does not cover every file in {bundle_dir}: {diff}")
    sha256 = {rel: d.partition(":")[2] for rel, d in signed.items() if d.startswith("sha256:")}
    return BundleSignature(path=signature, files=tuple(sorted(signed)), key_fingerprint=fingerprint, digests=sha256)


def has_signature(bundle_dir: Path) -> bool:
    """Whether the bundle carries a `model.sig` (says nothing about its validity)."""
    return (Path(bundle_dir) / SIGNATURE_NAME).is_file()


# --- hashing ------------------------------------------------------------------------------


def _hashing_config() -> Any:
    """sha256 per file; skip only `model.sig` (the library would also skip `.git*` paths by default)."""
    from model_signing import hashing

    return hashing.Config().set_ignored_paths(paths=[SIGNATURE_NAME], ignore_git_paths=False)


def _files_on_disk(bundle_dir: Path) -> list[str]:
    """Every regular file under `bundle_dir` but `model.sig`, as POSIX paths; links are refused."""
    root = Path(bundle_dir)
    files: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            if path.is_symlink():
                raise SignatureCoverageError(f"links are not allowed in a signed bundle: {path.relative_to(root)}")
        for name in filenames:
            rel = (Path(dirpath) / name).relative_to(root).as_posix()
            if rel != SIGNATURE_NAME:
                files.append(rel)
    return sorted(files)


def _signed_digests(signature: Path) -> dict[str, str]:
    """The files a (verified) model.sig lists, with their digests, from its in-toto statement."""
    import base64
    import json

    try:
        envelope = json.loads(signature.read_text(encoding="utf-8"))["dsseEnvelope"]
        statement = json.loads(base64.b64decode(envelope["payload"]))
        predicate = statement["predicate"]
        method = predicate.get("serialization", {}).get("method", "files")
        digests: dict[str, str] = {}
        for resource in predicate["resources"]:
            name = str(resource["name"])
            if method == "shards":  # "path:start:end"
                name = name.rsplit(":", 2)[0]
            digests[name] = f"{resource['algorithm']}:{resource['digest']}"
        return digests
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SignatureInvalidError(f"unreadable {SIGNATURE_NAME} in {signature.parent}: {_one_line(exc)}") from None


def _describe_difference(signed: dict[str, str], bundle_dir: Path, on_disk: list[str]) -> str:
    added = sorted(set(on_disk) - set(signed))
    removed = sorted(set(signed) - set(on_disk))
    changed = []
    for rel in sorted(set(on_disk) & set(signed)):
        algorithm, _, digest = signed[rel].partition(":")
        if algorithm == "sha256" and _sha256(bundle_dir / rel) != digest:
            changed.append(rel)
    parts = [
        f"{label} after signing: {', '.join(names)}"
        for label, names in (("added", added), ("removed", removed), ("changed", changed))
        if names
    ]
    return "; ".join(parts)


def _sha256(path: Path) -> str:

    return sha256_file(path)


# --- keys ---------------------------------------------------------------------------------


def _load_private_key(path: Path, password: str | None) -> Any:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    data = _read_key(path, "signing")
    try:
        key = serialization.load_pem_private_key(data, password.encode() if password else None)
    except (ValueError, TypeError) as exc:
        raise SigningKeyError(f"cannot use signing key {path}: {_one_line(exc)}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name not in SUPPORTED_CURVES:
        raise SigningKeyError(
            f"cannot use signing key {path}: not an elliptic-curve key on {', '.join(SUPPORTED_CURVES)}"
        )
    return key


def _load_public_key(path: Path) -> Any:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    data = _read_key(path, "trust")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise SigningKeyError(f"cannot use trust key {path}: not a PEM public key ({_one_line(exc)})") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in SUPPORTED_CURVES:
        raise SigningKeyError(
            f"cannot use trust key {path}: not an elliptic-curve key on {', '.join(SUPPORTED_CURVES)}"
        )
    return key


def _read_key(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SigningKeyError(f"cannot read {what} key {path}: {exc.strerror or exc}") from None


def _public_pem(public_key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


def _fingerprint(public_key: Any) -> str:
    return hashlib.sha256(_public_pem(public_key)).hexdigest()


def _one_line(exc: BaseException) -> str:
    return one_line(exc)
