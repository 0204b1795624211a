"""Prune an installed environment to what runs, then compile it: `python3 images/prune.py VENV
LIST... [--sourceless [--keep-source PACKAGE]]` (Dockerfile.serve, Dockerfile.steps).

1. Remove what each LIST file names: glob patterns relative to site-packages, one a line, `#`
   comments (images/serve.prune says what the serving image never loads, and why). A pattern
   that matches nothing fails the build: a list that no longer fits the locked wheels is found at
   once, not when the image is found too large.
2. Strip the debugging symbols of extension modules (`strip --strip-unneeded`; uvloop's 13.6 MB
   module becomes 1.6 MB). Never the libraries that auditwheel vendors into `*.libs/`: numpy's
   OpenBLAS no longer loads once stripped.
3. Compile every `.py` to `.pyc` (unchecked-hash: valid whatever the files' times, the same bytes
   on every build), dropping the caches pip wrote, so no module is compiled when the server starts
   on a read-only root. With `--sourceless`, each `.pyc` takes its source's place (`compileall
   -b`) and the source goes (a third of the pure-Python bytes), except under the packages
   `--keep-source` names (ortpack: its tracebacks show their lines); Python loads such modules as
   it does any other, and a traceback through them names the file and line without the line's text.
4. Remove pip's and setuptools' own files and every `RECORD` (pip's uninstall list, which the
   pruning made untrue); the rest of each `.dist-info` (metadata, licences) stays.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

ALWAYS = ("pip", "pip-*.dist-info", "setuptools", "setuptools-*.dist-info", "pkg_resources", "_distutils_hack",
          "distutils-precedence.pth", "**/__pycache__")  # fmt: skip


def patterns(path: Path) -> list[str]:
    return [line.split("#", 1)[0].strip() for line in path.read_text().splitlines() if line.split("#", 1)[0].strip()]


def remove(site: Path, pattern: str) -> int:
    """Remove what `pattern` matches under `site`; return the bytes removed."""
    removed = 0
    for path in sorted(site.glob(pattern), reverse=True):
        if not path.exists() and not path.is_symlink():
            continue  # inside a directory removed already
        if path.is_dir() and not path.is_symlink():
            removed += sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
            shutil.rmtree(path)
        else:
            removed += path.lstat().st_size
            path.unlink()
    return removed


def is_elf(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(4) == b"\x7fELF"


def strip_extensions(site: Path) -> tuple[int, int]:
    before = after = 0
    for path in site.rglob("*.so*"):
        if path.is_symlink() or not path.is_file() or any(p.endswith(".libs") for p in path.relative_to(site).parts):
            continue
        if not is_elf(path):
            continue
        before += path.stat().st_size
        subprocess.run(["strip", "--strip-unneeded", str(path)], check=True)
        after += path.stat().st_size
    return before, after


def compile_tree(directory: Path, *, sourceless: bool = False, keep: tuple[str, ...] = (), strip: str = "") -> None:
    """Compile every .py under `directory` (unchecked-hash .pyc), after removing the caches there.
    `sourceless`: each .pyc replaces its .py, except under the top-level names in `keep`. `strip`:
    a prefix taken off the paths the .pyc files record (a tree built under /rootfs is run from /)."""
    for cache in sorted(directory.rglob("__pycache__"), reverse=True):
        shutil.rmtree(cache)
    where = ["-s", strip, "-p", "/"] if strip else []
    command = [sys.executable, "-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash", *where]
    if not sourceless:
        subprocess.run([*command, str(directory)], check=True)
        return
    kept = [directory / name for name in keep]
    skip = "|".join(re.escape(f"{path}/") for path in kept) or "(?!)"
    subprocess.run([*command, "-b", "-x", skip, str(directory)], check=True)
    for source in directory.rglob("*.py"):
        if source.with_suffix(".pyc").is_file() and not any(path in source.parents for path in kept):
            source.unlink()
    for path in kept:
        if path.exists():
            subprocess.run([*command, str(path)], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("venv", type=Path)
    parser.add_argument("lists", type=Path, nargs="+")
    parser.add_argument("--sourceless", action="store_true", help="each .pyc replaces its .py (see above)")
    parser.add_argument("--keep-source", action="append", default=[], help="a top-level package keeping its .py")
    args = parser.parse_args()
    (site,) = args.venv.glob("lib/python3*/site-packages")
    removed = sum(remove(site, pattern) for pattern in ALWAYS)
    for listed in args.lists:
        for pattern in patterns(listed):
            gone = remove(site, pattern)
            if not gone and not list(site.glob(pattern)):
                raise SystemExit(f"prune: {pattern} ({listed.name}) matches nothing in {site}: update the list")
            removed += gone
    for record in site.glob("*.dist-info/RECORD"):
        record.unlink()
    before, after = strip_extensions(site)
    compile_tree(site, sourceless=args.sourceless, keep=tuple(args.keep_source))
    print(
        f"prune: removed {removed / 1e6:.1f} MB; extension modules stripped {before / 1e6:.1f} -> {after / 1e6:.1f} MB",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
