"""Build check for ortpack's layout (the configuration is pyproject.toml's).

The repository keeps the package's floors as top-level folders (kernel/, serving/, components/,
pipelines/); ortpack/ holds symbolic links to them, and setuptools packages ortpack* through them.
A checkout without symbolic links (Windows' default: each link becomes a small text file) would
build a wheel of ortpack/__init__.py alone and say nothing. This refuses that build instead. A
floor whose folder is absent from the tree is left out on purpose (the serving image copies only
kernel/ and serving/).
"""

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
for floor in ("kernel", "serving", "components", "pipelines"):
    if (ROOT / floor / "__init__.py").is_file() and not (ROOT / "ortpack" / floor / "__init__.py").is_file():
        raise SystemExit(
            f"ortpack/{floor} must be a symbolic link to {floor}/ (on Windows: git config core.symlinks true, "
            f"then check out again); without it the package would lack ortpack.{floor}"
        )

setup()
