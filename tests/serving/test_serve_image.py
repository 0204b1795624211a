"""The serving image's dependency set: `.[serve]` alone, in a fresh venv, serves a bundle (slow).

Docker engines do not run on this project's CI, so the image itself is linted (make lint) and
what it installs is tested here: the same `pip install ".[serve]"` the Dockerfile runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests import ROOT
from tests.servers import running_server

pytestmark = pytest.mark.slow

BUDGET_MB = 200


def _du_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) / 1e6


def test_serve_extra_alone_serves_a_bundle(tiny_bundle: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    # the Dockerfile's build context: COPY pyproject.toml README.md, COPY ortpack kernel serving (the
    # package's links to components/ and pipelines/ dangle there: those floors are not installed)
    context = tmp_path / "context"
    context.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copyfile(ROOT / name, context / name)
    for name in ("ortpack", "kernel", "serving"):
        shutil.copytree(ROOT / name, context / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    for step in (["-r", str(context / "serving" / "requirements.lock")], [str(context)]):  # as Dockerfile.serve
        install = subprocess.run(
            [python, "-m", "pip", "install", "--quiet", "--no-deps", *step], capture_output=True, text=True, timeout=900
        )
        assert install.returncode == 0, install.stderr[-3000:]
    probe = (
        "import importlib.util as u, json; print(json.dumps("
        "[m for m in ('torch', 'transformers', 'kfp', 'components', 'pipelines', 'serving', 'kernel', 'torchvision', "
        "'onnx', 'ortpack.components', 'ortpack.pipelines') if u.find_spec(m)]))"
    )
    alone = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the fresh venv's packages only
    absent = subprocess.run([python, "-c", probe], capture_output=True, text=True, cwd=tmp_path, check=True, env=alone)
    assert absent.stdout.strip() == "[]"

    site = next((venv / "lib").glob("python3*/site-packages"))
    # what every Python base image already has: pip and setuptools (with pkg_resources)
    base = ("pip", "setuptools", "pkg_resources", "_distutils_hack", "distutils")
    tooling = sum(_du_mb(p) for p in site.iterdir() if p.name.split("-")[0] in base)
    size = _du_mb(site) - tooling
    print(f"serve dependency set: {size:.0f} MB installed")
    assert size <= BUDGET_MB, f"the serve extra installs {size:.0f} MB (budget {BUDGET_MB} MB)"

    # run from tmp_path so the installed package, not this checkout, is imported
    with running_server(tiny_bundle, log_dir=tmp_path, python=python, cwd=tmp_path, env={"PYTHONPATH": ""}) as server:
        answer = httpx.post(f"{server.url}/v1/embeddings", json={"input": "served from the slim install"})
        assert answer.status_code == 200 and len(answer.json()["data"][0]["embedding"]) == 64


def test_lock_covers_the_serve_extra() -> None:
    """serving/requirements.lock pins every requirement of the serve extra (and no hub)."""
    import re
    import tomllib

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["serve"]
    wanted = {norm(re.split(r"[ <>=;\[]", r, maxsplit=1)[0]) for r in [*extra, "pydantic", "numpy"]}
    lines = [ln for ln in (ROOT / "serving" / "requirements.lock").read_text().splitlines() if ln and ln[0] != "#"]
    pinned = {norm(ln.split("==")[0]) for ln in lines}
    assert all("==" in ln for ln in lines)
    assert wanted <= pinned, wanted - pinned
    assert not pinned & {"huggingface-hub", "hf-xet", "torch", "transformers", "kfp", "pillow"}
