"""`ortpack bundle ACTION`: verify, check (on this machine), diff, sign, push and pull bundles.

`ortpack bundle diff` answers with its verdict instead of the usual exit codes: 0 drop-in,
3 re-index, 4 incompatible (and 2 for anything that stops the comparison)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from ortpack.components.core.compat import DiffSpec, diff_bundles, read_texts
from ortpack.components.core.errors import InvalidSpecError, OrtpackError, ParityError, did_you_mean, one_line
from ortpack.kernel.bundle import MANIFEST_NAME, embedding_space, read_manifest, verify_bundle
from ortpack.kernel.hardware import this_machine
from ortpack.kernel.oci import pull_bundle, push_bundle, push_modelcar
from ortpack.kernel.policy import admit, parse_requirements, split_expressions
from ortpack.kernel.signing import has_signature, sign_bundle, verify_signature
from ortpack.pipelines.cli.common import existing_dir, log
from ortpack.pipelines.cli.options import add_command
from ortpack.serving.config import ServeConfig

REQUIRE_ENV = "ORTPACK_REQUIRE"  # `bundle verify --require`'s default, as ortpack-serve reads it


def add_commands(sub: Any) -> None:
    """`ortpack bundle ACTION`: one `add_command(...)` call per action, plus its own arguments."""
    what = "verify, check (here), diff, sign, push and pull bundles"
    bundle = sub.add_parser("bundle", help=what, description=f"{what}: ortpack bundle ACTION --help for each")
    bsub = bundle.add_subparsers(dest="bundle_command", required=True, metavar="ACTION")

    def trust_key(p: argparse.ArgumentParser, what: str) -> None:
        p.add_argument(
            "--trust-key",
            default=os.environ.get("ORTPACK_TRUST_KEY") or None,
            metavar="PUB.pem",
            help=f"EC public key (PEM): {what} unless the bundle's model.sig verifies with it and covers every "
            "file (also ORTPACK_TRUST_KEY)",
        )

    where = "bundle directory (or its manifest.json)"
    p = add_command(
        bsub, "verify", cmd_bundle_verify, "check a bundle's schema version, every file's sha256, and its signature"
    )
    p.add_argument("bundle", help=where)
    trust_key(p, "fail")
    p.add_argument(
        "--require",
        action="append",
        default=None,
        metavar="EXPR",
        help="admission policy, repeatable, as ortpack-serve checks it: VARIANT_OR_PRECISION.METRIC OP NUMBER "
        "against the variant's recorded gate values (e.g. int8.min_cosine>=0.95) or space=ID; fail (exit 2) when "
        "no variant meets every expression that applies to it (also ORTPACK_REQUIRE, ';'-separated)",
    )

    p = add_command(
        bsub,
        "diff",
        cmd_bundle_diff,
        "will NEW break an index built with OLD? compare their embedding spaces: exit 0 drop-in, 3 re-index, "
        "4 incompatible",
    )
    p.add_argument("old", help="the bundle the index was built with: a directory or any URI ortpack-serve takes")
    p.add_argument("new", help="the candidate bundle: a directory or any URI ortpack-serve takes")
    p.add_argument(
        "--budget",
        type=float,
        default=0.95,
        help="drop-in when new queries searching old documents find at least this share of the old bundle's own "
        "top-10 (default: 0.95)",
    )
    p.add_argument(
        "--all-pairs",
        action="store_true",
        help="compare every OLD variant with every NEW one (default: the pairs of the same precision)",
    )
    p.add_argument("--json", action="store_true", help="print the whole result as JSON instead of a table")
    p.add_argument(
        "--queries",
        metavar="FILE",
        help="retrieval queries, one per line (or .jsonl strings) (default: 400 shipped support-desk questions)",
    )
    p.add_argument(
        "--documents",
        metavar="FILE",
        help="retrieval documents, one per line (or .jsonl strings) (default: the shipped validation sentences)",
    )
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (default: 0, every core)")

    p = add_command(
        bsub,
        "check",
        cmd_bundle_check,
        "replay the bundle's probe set through a variant on this machine and apply its gate (exit 1 on a miss)",
    )
    p.add_argument("bundle", help=where)
    p.add_argument(
        "--variant",
        default="auto",
        metavar="ID|auto",
        help="the variant to replay the probe set through: one of the bundle's variant ids (e.g. cpu-int8; "
        "`ortpack bundle verify` lists them), or auto (the default): the one a server on this machine would "
        "pick, falling back to the next as a server would when it misses",
    )
    trust_key(p, "fail")

    p = add_command(
        bsub, "sign", cmd_bundle_sign, "sign every file of a bundle (OpenSSF model signing) into BUNDLE/model.sig"
    )
    p.add_argument("bundle", help="bundle directory or its manifest.json (verified before signing)")
    p.add_argument("--key", required=True, metavar="KEY.pem", help="EC private key (PEM; P-256, P-384 or P-521)")
    p.add_argument(
        "--key-password-env",
        metavar="VAR",
        help="environment variable holding the private key's password, if it is encrypted",
    )

    p = add_command(
        bsub, "push", cmd_bundle_push, "push a bundle to an OCI registry; print its pinned oci://...@sha256: URI"
    )
    p.add_argument("bundle", help="bundle directory or its manifest.json (verified before pushing)")
    p.add_argument("reference", metavar="oci://HOST[:PORT]/REPO:TAG", help="where to push")
    p.add_argument(
        "--modelcar",
        action="store_true",
        help="push a container image with the bundle under /models (KServe modelcar, storageUri: oci://...) "
        "instead of an ortpack bundle artifact",
    )
    p.add_argument(
        "--modelcar-base",
        metavar="oci://REF",
        help="with --modelcar: an image with a shell (busybox) whose layers go first; KServe's modelcar "
        "sidecar runs `sh -c ...` in it",
    )
    trust_key(p, "refuse to push")

    p = add_command(
        bsub, "pull", cmd_bundle_pull, "pull a bundle from an OCI registry, check every digest, and verify it"
    )
    p.add_argument("reference", metavar="oci://HOST[:PORT]/REPO@sha256:...|:TAG", help="what to pull")
    p.add_argument("--out", required=True, help="bundle directory to create (must not exist)")
    trust_key(p, "fail (and remove --out)")


def cmd_bundle_verify(args: argparse.Namespace) -> int:

    expressions = args.require if args.require is not None else split_expressions(os.environ.get(REQUIRE_ENV, ""))
    policy = parse_requirements(expressions)  # a malformed expression fails before any work
    bundle = _bundle_dir(args.bundle)
    manifest = verify_bundle(bundle)
    size = sum(f.bytes for f in manifest.files.values())
    signed = ""
    if args.trust_key:
        signature = verify_signature(bundle, Path(args.trust_key))
        signed = f", signature verified ({len(signature.files)} files, key sha256 {signature.key_fingerprint[:16]})"
    else:
        _warn_unchecked_signature(bundle)
    admission = admit(manifest, manifest.variants, policy) if policy else None  # none left: exit 2
    print(
        f"ok: {manifest.name} {manifest.version} ({manifest.task}), variants "
        f"{', '.join(v.id for v in manifest.variants)}, {len(manifest.files)} files, {size / 1e6:.1f} MB verified"
        f"{signed}"
    )
    for variant in manifest.variants:
        space = embedding_space(manifest, variant)
        if space is not None:
            print(f"space: {variant.id} {space.id}")
    if admission is not None:
        admitted = ", ".join(v.id for v in admission.admitted)
        print(f"policy: {len(policy)} requirement{'s' if len(policy) > 1 else ''} met by {admitted}")
        for variant_id, misses in admission.excluded.items():
            print(f"policy: {variant_id} would not be served: {'; '.join(misses)}")
    return 0


def cmd_bundle_check(args: argparse.Namespace) -> int:
    """The serving node's start-up check as a deploy job's pre-flight: verify the bundle, then
    replay its probe set through the variant (`auto`: the one a server would pick, falling back
    as it would) on this machine, and apply the variant's gate."""
    from ortpack.serving.metrics import Metrics
    from ortpack.serving.service import NodeCheckError, load_service

    bundle = existing_dir(str(_bundle_dir(args.bundle)), "bundle")
    if args.trust_key:
        verify_signature(bundle, Path(args.trust_key))
    if args.variant != "auto":
        variants = [v.id for v in read_manifest(bundle).variants]
        if args.variant not in variants:
            raise InvalidSpecError(
                f"--variant {args.variant!r} is not in this bundle: give one of {', '.join(variants)}, or auto"
                f"{did_you_mean(args.variant, variants)}"
            )
    config = ServeConfig(bundle=str(bundle), variant=args.variant, warmup=False, workers=1)
    print(f"machine: {this_machine().summary()}")
    try:
        service = load_service(bundle, config, Metrics())
    except NodeCheckError as exc:
        raise ParityError(str(exc)) from None
    for result in [*service.rejected, service.node_check]:
        if result is None:
            continue
        numbers = ", ".join(f"{k} {v:.6g}" for k, v in sorted(result.values.items()))
        print(f"{result.variant_id}: {'passed' if result.passed else 'MISSED'} ({result.samples} probes, {numbers})")
        if not result.passed:
            print(f"  {result.summary()}")
    if service.node_check is None:
        print(f"{service.variant.id}: not checked (the bundle has no probe set)")
    print(f"a server here would serve {service.variant.id}")
    return 0


def cmd_bundle_diff(args: argparse.Namespace) -> int:
    """Exit 0 drop-in, 3 re-index, 4 incompatible; anything that stops the comparison is 2 (an
    unreachable source too: a CI job must never read it as a verdict)."""
    import json

    try:
        spec = DiffSpec(
            budget=args.budget,
            all_pairs=args.all_pairs,
            queries=read_texts(Path(args.queries)) if args.queries else (),
            documents=read_texts(Path(args.documents)) if args.documents else (),
            threads=args.threads,
        )
        result = diff_bundles(_bundle_uri(args.old), _bundle_uri(args.new), spec)
    except (OrtpackError, ValueError, OSError, RuntimeError) as exc:
        raise InvalidSpecError(one_line(exc)) from exc
    print(json.dumps(result.as_dict(), indent=2) if args.json else result.table())
    return result.exit_code


def _bundle_uri(value: str) -> str:
    """A bundle URI as given, or the directory a local path names (its manifest.json's folder)."""
    return value if "://" in value else str(existing_dir(str(_bundle_dir(value)), "bundle"))


def _warn_unchecked_signature(bundle: Path) -> None:

    if has_signature(bundle):
        log.warning("the bundle's signature (model.sig) was not checked: pass --trust-key PUB.pem to verify it")
    else:
        log.warning("the bundle is unsigned: nothing proves who made it (ortpack bundle sign)")


def cmd_bundle_sign(args: argparse.Namespace) -> int:

    password = os.environ.get(args.key_password_env) if args.key_password_env else None
    signature = sign_bundle(_bundle_dir(args.bundle), Path(args.key), password=password)
    print(f"signed: {signature.path} ({len(signature.files)} files, key sha256 {signature.key_fingerprint[:16]})")
    return 0


def cmd_bundle_push(args: argparse.Namespace) -> int:

    bundle = _bundle_dir(args.bundle)
    if args.trust_key:
        verify_signature(bundle, Path(args.trust_key))
    if args.modelcar_base and not args.modelcar:
        raise InvalidSpecError("--modelcar-base applies only with --modelcar")
    if args.modelcar:
        if not args.modelcar_base:
            log.warning(
                "the modelcar has no shell: KServe runs it with `sh -c ...`; give --modelcar-base (e.g. busybox)"
            )
        log.info("pushing %s to %s as a KServe modelcar image", bundle, args.reference)
        print(push_modelcar(bundle, args.reference, base=args.modelcar_base))
        return 0
    log.info("pushing %s to %s", bundle, args.reference)
    print(push_bundle(bundle, args.reference))  # verifies the bundle's checksums first
    return 0


def cmd_bundle_pull(args: argparse.Namespace) -> int:
    import shutil

    out = Path(args.out)
    pinned = pull_bundle(args.reference, out)
    try:
        manifest = verify_bundle(out)
        if args.trust_key:
            verify_signature(out, Path(args.trust_key))
        else:
            _warn_unchecked_signature(out)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)  # never leave a bundle that failed verification
        raise
    print(f"pulled: {out} ({manifest.name} {manifest.version}) from {pinned}")
    return 0


def _bundle_dir(value: str) -> Path:
    """The bundle directory an argument names: the directory itself, or its manifest.json (the
    folder holding it is meant). Any other file is refused: a bundle is a directory."""

    path = Path(value)
    if path.name == MANIFEST_NAME and not path.is_dir():
        return path.parent
    if path.is_file():
        raise InvalidSpecError(f"{value} is a file: give the bundle directory (the folder holding {MANIFEST_NAME})")
    return path
