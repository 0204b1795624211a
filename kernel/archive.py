"""Untrusted archives and paths: the limits and the safe-path rule, in one place.

Everything that writes files named by someone else goes through here: `ortpack.kernel.sources` (bundle
archives and s3 prefixes), `ortpack.kernel.oci` (the layers of an OCI artifact), `ortpack.kernel.bundle` (the
paths a manifest lists) and `ortpack.components.core.sources` (model checkpoints from a bucket, a URL or
the Hugging Face Hub).

The rule: a path is relative (POSIX), has no `..` component, and once symbolic links are resolved
still lies under the directory it is written into. Tar members must also be regular files or
directories (no links, devices or FIFOs), and an archive holds at most a number of entries and of
declared bytes; `extract_tar` then runs tarfile's "data" filter as a second line of defence.

Each caller keeps its own exception class and wording (its users and tests read them): it
describes them once in an `ArchiveRules` (`ortpack.kernel.bundle.BUNDLE_RULES`, the checkpoint rules in
`ortpack.components.core.sources`), with the limits below.

Only the standard library is imported here.
"""

from __future__ import annotations

import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

GIB = 1024**3

# A bundle the server fetches (an archive, an s3 prefix, an OCI artifact).
BUNDLE_MAX_MEMBERS = 10_000
BUNDLE_MAX_BYTES = 20 * GIB
# A model checkpoint the pipeline downloads (weights can be large).
CHECKPOINT_MAX_FILES = 10_000
CHECKPOINT_MAX_BYTES = 200 * GIB


class ArchiveError(ValueError):
    """A refusal, for callers that do not name their own exception class."""


def gib(n: int) -> str:
    """`n` bytes in GiB, as the refusals say it: `20 GiB`."""
    return f"{n / GIB:g} GiB"


def is_safe_relpath(rel: str, *, allow_root: bool = False, normalized: bool = False) -> bool:
    """True when `rel` is a relative POSIX path without a `..` component (this does not look at
    the disk: see `is_inside`). `""` and `"."` name the root itself: safe only with `allow_root`.
    With `normalized`, `rel` must also be spelled the one way (no `./`, `//` or trailing `/`)."""
    pure = PurePosixPath(rel)
    if pure.is_absolute() or ".." in pure.parts:
        return False
    if not pure.parts and not allow_root:
        return False
    return not normalized or rel == pure.as_posix()


def is_inside(path: Path, root: Path) -> bool:
    """True when `path`, symbolic links resolved, is `root` or lies under it."""
    return path.resolve().is_relative_to(root.resolve())


@dataclass(frozen=True)
class ArchiveRules:
    """One caller's rules for untrusted archives: its limits, its exception class and its wording.

    The messages are `str.format` templates; every one may use `{source}` (the URI or reference
    the caller passes), `{max_members}`, `{max_bytes}` and `{max_gib}` (e.g. `20 GiB`), and:
    `unsafe_path` `{path}` and `{what}`; `link` `{name}`, `{target}` and `{what}`; `special`
    `{name}` and `{what}`.
    """

    max_members: int
    max_bytes: int
    error: Callable[[str], Exception] = ArchiveError
    too_many: str = "too many entries: more than {max_members} ({source})"
    too_large: str = "too large: more than {max_gib} declared ({source})"
    unsafe_path: str = "unsafe path in {what}: {path} ({source})"
    link: str = "links are not allowed in {what}: {name} -> {target} ({source})"
    special: str = "special files are not allowed in {what}: {name} ({source})"
    # "" and "." (a tar's `./` entry) name the target directory itself: allowed, or refused as unsafe
    allow_root: bool = False

    def refusal(self, template: str, **fields: Any) -> Exception:
        """The exception for `template` (one of the messages above) filled with `fields`."""
        limits = {"max_members": self.max_members, "max_bytes": self.max_bytes, "max_gib": gib(self.max_bytes)}
        return self.error(template.format(**limits, **fields))

    def check_limits(self, count: int, total_bytes: int, source: str) -> None:
        """Refuse more than `max_members` entries, then more than `max_bytes` bytes."""
        if count > self.max_members:
            raise self.refusal(self.too_many, source=source)
        if total_bytes > self.max_bytes:
            raise self.refusal(self.too_large, source=source)

    def safe_target(self, rel: str, root: Path, source: str, what: str = "archive") -> Path:
        """`root / rel` with symbolic links resolved, refusing absolute paths, `..` components and
        anything resolving outside `root` (`what` says where `rel` came from, for the message)."""
        if is_safe_relpath(rel, allow_root=self.allow_root):
            target = (root / PurePosixPath(rel)).resolve()
            if target.is_relative_to(root.resolve()):
                return target
        raise self.refusal(self.unsafe_path, path=rel, what=what, source=source)

    def checked_members(
        self, tar: tarfile.TarFile, root: Path, source: str, what: str = "archive"
    ) -> list[tarfile.TarInfo]:
        """Every member of `tar`, read one header at a time and refused at the first that breaks a
        rule: the limits (so a huge declared size trips before any more of the archive is read),
        then its path (to be extracted under `root`), then its kind (regular files and directories)."""
        members: list[tarfile.TarInfo] = []
        total = 0
        for member in tar:
            members.append(member)
            total += member.size
            self.check_limits(len(members), total, source)
            if not (member.isdir() and not PurePosixPath(member.name).parts):  # "." or "./": `root` itself
                self.safe_target(member.name, root, source, what)
            if member.issym() or member.islnk():
                raise self.refusal(self.link, name=member.name, target=member.linkname, what=what, source=source)
            if not (member.isfile() or member.isdir()):
                raise self.refusal(self.special, name=member.name, what=what, source=source)
        return members


def extract_tar(
    archive: Path, dest: Path, check: Callable[[tarfile.TarFile], list[tarfile.TarInfo]]
) -> list[tarfile.TarInfo]:
    """Extract the tar at `archive` (plain, gzip, bzip2 or xz) into `dest`: `check` reads the open
    archive and returns the members to extract, having refused whatever breaks the caller's rules
    (usually `ArchiveRules.checked_members`); tarfile's "data" filter then refuses absolute paths,
    `..`, links leaving `dest` and devices again. Returns the members extracted.

    tarfile's errors propagate for the caller to word: `tarfile.ReadError` when `archive` is not a
    tar, another `tarfile.TarError` (such as the filter's refusals) or an `OSError` otherwise."""
    with tarfile.open(archive, "r:*") as tar:
        members = check(tar)
        tar.extractall(dest, members=members, filter="data")
    return members
