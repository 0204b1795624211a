"""ortpack.kernel.archive: the safe-path rule, the limits, the tar checks and extraction, and each caller's wording."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from ortpack.components.core.errors import SourceError
from ortpack.components.core.sources import CHECKPOINT_RULES
from ortpack.kernel.archive import GIB, ArchiveError, ArchiveRules, extract_tar, gib, is_inside, is_safe_relpath
from ortpack.kernel.bundle import BUNDLE_RULES, BundleError

RULES = ArchiveRules(max_members=3, max_bytes=2 * GIB)


def _exact(message: str) -> str:
    return f"^{re.escape(message)}$"


# --- paths --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rel", "safe"),
    [
        ("a/b.txt", True),
        ("./a//b/", True),
        ("/etc/passwd", False),
        ("..", False),
        ("a/../b", False),
        ("", False),
        (".", False),
    ],
)
def test_is_safe_relpath(rel: str, safe: bool) -> None:
    assert is_safe_relpath(rel) is safe


def test_is_safe_relpath_root_and_normal_form() -> None:
    assert is_safe_relpath(".", allow_root=True) and is_safe_relpath("", allow_root=True)
    assert not is_safe_relpath("../x", allow_root=True)
    assert is_safe_relpath("a/b", normalized=True)
    for spelled_otherwise in ("./a/b", "a//b", "a/b/", "a/./b"):
        assert not is_safe_relpath(spelled_otherwise, normalized=True), spelled_otherwise


def test_is_inside(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "out").symlink_to(tmp_path)
    assert is_inside(root / "sub" / "x", root)
    assert is_inside(root, root)
    assert not is_inside(root / "out" / "x", root)
    assert not is_inside(root / ".." / "x", root)


def test_safe_target_refuses_an_absolute_path(tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match=_exact("unsafe path in archive: /etc/passwd (src.tar)")):
        RULES.safe_target("/etc/passwd", tmp_path, "src.tar")


def test_safe_target_refuses_dotdot(tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match=_exact("unsafe path in s3 prefix: a/../../x (s3://b/p/)")):
        RULES.safe_target("a/../../x", tmp_path, "s3://b/p/", "s3 prefix")


def test_safe_target_refuses_a_symlink_out_of_root(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    with pytest.raises(ArchiveError, match=_exact("unsafe path in archive: escape/x.txt (src.tar)")):
        RULES.safe_target("escape/x.txt", root, "src.tar")
    (root / "inside").symlink_to(root / "sub")  # a link that stays under root is fine
    assert RULES.safe_target("inside/x.txt", root, "src.tar") == (root / "sub" / "x.txt").resolve()


def test_safe_target_accepts_a_plain_path(tmp_path: Path) -> None:
    assert RULES.safe_target("a/b/c.txt", tmp_path, "src.tar") == (tmp_path / "a" / "b" / "c.txt").resolve()
    assert RULES.safe_target("./a//b.txt", tmp_path, "src.tar") == (tmp_path / "a" / "b.txt").resolve()


def test_safe_target_and_the_root_itself(tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match=_exact("unsafe path in archive: . (src.tar)")):
        RULES.safe_target(".", tmp_path, "src.tar")
    allowing = ArchiveRules(max_members=3, max_bytes=GIB, allow_root=True)
    assert allowing.safe_target(".", tmp_path, "src.tar") == tmp_path.resolve()
    assert allowing.safe_target("", tmp_path, "src.tar") == tmp_path.resolve()


# --- limits -------------------------------------------------------------------------------


def test_limits_at_the_boundary_pass() -> None:
    RULES.check_limits(3, 2 * GIB, "src.tar")
    RULES.check_limits(0, 0, "src.tar")


def test_one_entry_too_many() -> None:
    with pytest.raises(ArchiveError, match=_exact("too many entries: more than 3 (src.tar)")):
        RULES.check_limits(4, 0, "src.tar")


def test_one_byte_too_many() -> None:
    with pytest.raises(ArchiveError, match=_exact("too large: more than 2 GiB declared (src.tar)")):
        RULES.check_limits(1, 2 * GIB + 1, "src.tar")


def test_entries_are_checked_before_bytes() -> None:
    with pytest.raises(ArchiveError, match="^too many entries"):
        RULES.check_limits(4, 3 * GIB, "src.tar")


def test_gib() -> None:
    assert (gib(20 * GIB), gib(200 * GIB), gib(GIB // 2)) == ("20 GiB", "200 GiB", "0.5 GiB")


# --- the callers' wording (what their users and tests read) -------------------------------


def test_bundle_rules_wording(tmp_path: Path) -> None:
    assert (BUNDLE_RULES.max_members, BUNDLE_RULES.max_bytes) == (10_000, 20 * GIB)
    BUNDLE_RULES.check_limits(10_000, 20 * GIB, "b.tar")
    with pytest.raises(BundleError, match=_exact("too many entries in bundle: more than 10000 (b.tar)")):
        BUNDLE_RULES.check_limits(10_001, 0, "b.tar")
    with pytest.raises(BundleError, match=_exact("bundle too large: more than 20 GiB declared (b.tar)")):
        BUNDLE_RULES.check_limits(1, 20 * GIB + 1, "b.tar")
    with pytest.raises(BundleError, match=_exact("unsafe path in OCI manifest: ../x (oci://h/r:t)")):
        BUNDLE_RULES.safe_target("../x", tmp_path, "oci://h/r:t", "OCI manifest")
    assert BUNDLE_RULES.safe_target(".", tmp_path, "b.tar") == tmp_path.resolve()  # a tar's `./` entry


def test_checkpoint_rules_wording(tmp_path: Path) -> None:
    assert (CHECKPOINT_RULES.max_members, CHECKPOINT_RULES.max_bytes) == (10_000, 200 * GIB)
    CHECKPOINT_RULES.check_limits(10_000, 200 * GIB, "s3://b/m")
    with pytest.raises(SourceError, match=_exact("s3://b/m: more than 10000 files")):
        CHECKPOINT_RULES.check_limits(10_001, 0, "s3://b/m")
    with pytest.raises(SourceError, match=_exact("s3://b/m: more than 200 GiB")):
        CHECKPOINT_RULES.check_limits(1, 200 * GIB + 1, "s3://b/m")
    with pytest.raises(SourceError, match=_exact("s3://b/m: unsafe path '../x'")):
        CHECKPOINT_RULES.safe_target("../x", tmp_path, "s3://b/m")
    with pytest.raises(SourceError, match=_exact("s3://b/m: unsafe path '.'")):
        CHECKPOINT_RULES.safe_target(".", tmp_path, "s3://b/m")


# --- tar members and extraction -----------------------------------------------------------


def _tar(path: Path, *members: tarfile.TarInfo) -> Path:
    with tarfile.open(path, "w") as tar:
        for info in members:
            data = b"x" * info.size if info.isfile() else None
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _member(name: str, kind: bytes = tarfile.REGTYPE, *, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, size, link
    return info


def test_checked_members_accepts_files_and_directories(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "ok.tar", _member("d", tarfile.DIRTYPE), _member("d/a.txt", size=2))
    with tarfile.open(archive) as tar:
        names = [m.name for m in RULES.checked_members(tar, tmp_path / "out", "ok.tar")]
    assert names == ["d", "d/a.txt"]


@pytest.mark.parametrize(
    ("member", "message"),
    [
        (_member("evil", tarfile.SYMTYPE, link="/etc/passwd"), "links are not allowed in archive: evil -> /etc/passwd"),
        (_member("evil", tarfile.LNKTYPE, link="a.txt"), "links are not allowed in archive: evil -> a.txt"),
        (_member("fifo", tarfile.FIFOTYPE), "special files are not allowed in archive: fifo"),
        (_member("../evil.txt"), "unsafe path in archive: ../evil.txt"),
        (_member("/tmp/evil.txt"), "unsafe path in archive: /tmp/evil.txt"),
    ],
)
def test_checked_members_refuses(tmp_path: Path, member: tarfile.TarInfo, message: str) -> None:
    archive = _tar(tmp_path / "evil.tar", _member("a.txt", size=1), member)
    with tarfile.open(archive) as tar, pytest.raises(ArchiveError, match=_exact(f"{message} (evil.tar)")):
        RULES.checked_members(tar, tmp_path / "out", "evil.tar")


def test_checked_members_stops_at_the_member_over_the_limit(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "many.tar", *(_member(f"f{i}") for i in range(4)), _member("../late"))
    with tarfile.open(archive) as tar, pytest.raises(ArchiveError, match=_exact("too many entries: more than 3 (m)")):
        RULES.checked_members(tar, tmp_path / "out", "m")


def test_extract_tar_extracts_what_the_check_returns(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "ok.tar", _member("d", tarfile.DIRTYPE), _member("d/a.txt", size=3))
    out = tmp_path / "out"
    out.mkdir()
    members = extract_tar(archive, out, lambda tar: RULES.checked_members(tar, out, "ok.tar"))
    assert [m.name for m in members] == ["d", "d/a.txt"]
    assert (out / "d" / "a.txt").read_bytes() == b"xxx"


def test_extract_tar_data_filter_refuses_a_link_out(tmp_path: Path) -> None:
    """A check that lets everything through: tarfile's "data" filter still refuses the links."""
    out = tmp_path / "out"
    out.mkdir()
    absolute = _tar(tmp_path / "abs.tar", _member("evil", tarfile.SYMTYPE, link="/etc/passwd"))
    with pytest.raises(tarfile.AbsoluteLinkError, match=_exact("'evil' is a link to an absolute path")):
        extract_tar(absolute, out, lambda tar: tar.getmembers())
    outside = _tar(tmp_path / "up.tar", _member("up", tarfile.SYMTYPE, link="../../x"))
    with pytest.raises(tarfile.LinkOutsideDestinationError, match="^'up' would link to .* outside the destination$"):
        extract_tar(outside, out, lambda tar: tar.getmembers())
    assert os.listdir(out) == []


def test_extract_tar_leaves_not_a_tar_to_the_caller(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar\n" * 100)
    with pytest.raises(tarfile.ReadError):
        extract_tar(junk, tmp_path, lambda tar: tar.getmembers())


# --- the import circle stays open ---------------------------------------------------------


def test_archive_and_oci_import_no_fetching_code() -> None:
    code = (
        "import sys, ortpack.kernel.archive; "
        "light = 'pydantic' not in sys.modules and 'ortpack.kernel.bundle' not in sys.modules; "
        "import ortpack.kernel.oci; print(light, 'ortpack.kernel.sources' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "False"]
