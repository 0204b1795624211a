"""Assemble a distroless-style root filesystem from this Debian system's own packages:
`python3 images/rootfs.py ROOT [--packages FILE]`, run as root in a Debian bookworm build stage
that has the packages installed (Dockerfile.serve, Dockerfile.steps). The final stage is then
`FROM scratch` + `COPY --from=build ROOT /`.

What goes in: the files `dpkg-query -L` lists for each package named in images/runtime.packages
(CPython 3.11 and the C libraries it and the wheels load), less what they never use at run time
(images/runtime.packages says what and why, as `-` lines); the CA bundle; merged-/usr links;
`/etc/passwd`, `/etc/group` and `/etc/nsswitch.conf` for the users root and ortpack (10001);
`/tmp` and the user's home; and `/var/lib/dpkg/status` holding the entries of the packages taken,
so that image scanners see what the image is made of. No shell, no package manager, no coreutils.

The standard library is compiled to `.pyc` (unchecked-hash: valid whatever the files' times, and
the same bytes on every build), so a read-only root never compiles it again at start-up; with
`--sourceless` each `.pyc` replaces its `.py` (images/prune.py says what that changes).

Debian bookworm's Python is 3.11.2, which predates the tar extraction filters of PEP 706 (3.11.4):
`--tarfile-backport DIR` (the `backports.tarfile` package, pinned in images/runtime.lock) makes the
standard library's `tarfile` that backport, so `extractall(filter="data")` works as on 3.11.4+.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import shutil
import subprocess
import sys
from pathlib import Path

from prune import compile_tree  # images/prune.py, beside this file

HERE = Path(__file__).resolve().parent
USER_ID = 10001
MERGED_USR = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}
PYTHON = f"python{sys.version_info.major}.{sys.version_info.minor}"


def read_list(path: Path) -> tuple[dict[str, list[str]], list[str]]:
    """({package: only these path patterns, or [] for all}, excluded path patterns) from a list
    file: `NAME` lines, `NAME: PATTERN...` lines (only those of its files) and `- PATTERN` lines."""
    packages: dict[str, list[str]] = {}
    excluded = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("- "):
            excluded.append(line[2:].strip().replace("{python}", PYTHON))
        elif line:
            name, _, only = line.partition(":")
            packages[name.strip()] = only.split()
    return packages, excluded


def package_files(package: str) -> list[str]:
    done = subprocess.run(["dpkg-query", "-L", package], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"rootfs: package {package} is not installed here: {done.stderr.strip()}")
    return [line for line in done.stdout.splitlines() if line.startswith("/")]


def canonical(path: str) -> str:
    """`path` with its directory's symbolic links resolved (merged /usr: /lib/x -> /usr/lib/x)."""
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def excluded(path: str, patterns: list[str]) -> bool:
    rel = path.lstrip("/")
    return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(rel, p.rstrip("/") + "/*") for p in patterns)


def copy_entry(source: str, root: Path) -> int:
    """Copy a file or a symbolic link to the same place under `root`; return its size."""
    target = root / source.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    if os.path.islink(source):
        if not target.is_symlink():
            target.symlink_to(os.readlink(source))
        return 0
    shutil.copy2(source, target)
    return target.stat().st_size


def dpkg_status(packages: list[str]) -> str:
    """The dpkg status entries of `packages` (what scanners read to list an image's packages)."""
    entries = Path("/var/lib/dpkg/status").read_text().split("\n\n")
    wanted = set(packages)
    kept = [e for e in entries if e.startswith("Package: ") and e.split("\n", 1)[0][9:].split(":")[0] in wanted]
    return "\n\n".join(kept) + "\n"


def write_etc(root: Path) -> None:
    etc = root / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "passwd").write_text(
        "root:x:0:0:root:/root:/sbin/nologin\n"
        f"ortpack:x:{USER_ID}:{USER_ID}:ortpack:/home/ortpack:/sbin/nologin\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n"
    )
    (etc / "group").write_text(f"root:x:0:\nortpack:x:{USER_ID}:\nnogroup:x:65534:\n")
    # /etc/hosts first (the engine writes it), then DNS
    (etc / "nsswitch.conf").write_text("passwd: files\ngroup: files\nhosts: files dns\n")
    certs = Path("/etc/ssl/certs/ca-certificates.crt")
    if not certs.is_file():
        raise SystemExit("rootfs: no /etc/ssl/certs/ca-certificates.crt here (install ca-certificates)")
    (etc / "ssl/certs").mkdir(parents=True, exist_ok=True)
    shutil.copy2(certs, etc / "ssl/certs/ca-certificates.crt")
    # OpenSSL's default verify paths on Debian (OPENSSLDIR /usr/lib/ssl): what ssl.create_default_context() loads
    ssl_dir = root / "usr/lib/ssl"
    ssl_dir.mkdir(parents=True, exist_ok=True)
    for name, target in (("certs", "/etc/ssl/certs"), ("cert.pem", "/etc/ssl/certs/ca-certificates.crt")):
        if not (ssl_dir / name).is_symlink():
            (ssl_dir / name).symlink_to(target)
    for name in ("os-release",):
        if Path("/usr/lib", name).is_file():
            shutil.copy2(Path("/usr/lib", name), root / "usr/lib" / name)
            if not (etc / name).is_symlink():
                (etc / name).symlink_to(f"../usr/lib/{name}")


def use_tarfile_backport(root: Path, backport: Path) -> None:
    """Make the standard library's `tarfile` the PEP 706 backport (see the module's docstring)."""
    stdlib = root / "usr/lib" / PYTHON
    shutil.copytree(backport, stdlib / "_tarfile_pep706", ignore=shutil.ignore_patterns("__pycache__", "__main__.py"))
    (stdlib / "tarfile.py").write_text(
        "\"\"\"This image's tarfile: Debian's Python 3.11.2 predates PEP 706's extraction filters (3.11.4),\n"
        'so this is CPython 3.12\'s tarfile from the backports.tarfile package (images/rootfs.py)."""\n\n'
        "import sys\n\nimport _tarfile_pep706\n\nsys.modules[__name__] = _tarfile_pep706\n"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--packages", type=Path, action="append", help="list files (default images/runtime.packages)")
    parser.add_argument("--tarfile-backport", type=Path, help="the backports.tarfile package directory")
    parser.add_argument("--sourceless", action="store_true", help="each .pyc replaces its .py (images/prune.py)")
    args = parser.parse_args()
    root: Path = args.root
    root.mkdir(parents=True, exist_ok=True)
    for name, target in MERGED_USR.items():
        (root / target).mkdir(parents=True, exist_ok=True)
        if not (root / name).is_symlink():
            (root / name).symlink_to(target)
    packages: dict[str, list[str]] = {}
    patterns: list[str] = []
    for listed in args.packages or [HERE / "runtime.packages"]:
        more, less = read_list(listed)
        packages.update(more)
        patterns += less
    total = 0
    for package, only in packages.items():
        for path in package_files(package):
            if os.path.isdir(path) and not os.path.islink(path):
                continue
            if not os.path.lexists(path):  # diverted or removed on this system
                continue
            path = canonical(path)
            if only and not excluded(path, only):
                continue
            if not excluded(path, patterns):
                total += copy_entry(path, root)
    if packages.get("dash") is not None and not (root / "usr/bin/sh").is_symlink():
        (root / "usr/bin/sh").symlink_to("dash")  # dash's postinst makes /bin/sh; nothing runs it here
    write_etc(root)
    for directory, mode, owner in (("tmp", 0o1777, 0), ("root", 0o700, 0), ("home/ortpack", 0o755, USER_ID)):
        (root / directory).mkdir(parents=True, exist_ok=True)
        os.chmod(root / directory, mode)
        os.chown(root / directory, owner, owner)
    status = root / "var/lib/dpkg/status"
    status.parent.mkdir(parents=True, exist_ok=True)
    status.write_text(dpkg_status(list(packages)))
    has_filters = (
        subprocess.run(
            [sys.executable, "-c", "import tarfile; tarfile.data_filter"], stderr=subprocess.DEVNULL
        ).returncode
        == 0
    )
    if not has_filters:
        if args.tarfile_backport is None:
            raise SystemExit("rootfs: this Python has no tarfile extraction filters: pass --tarfile-backport")
        use_tarfile_backport(root, args.tarfile_backport)
    compile_tree(root / "usr/lib" / PYTHON, sourceless=args.sourceless, strip=str(root))
    print(f"rootfs: {len(packages)} packages, {total / 1e6:.1f} MB of their files in {root}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
