"""Re-pin the serving image's dependency sets (`make serve-lock`): `python images/lock.py`.

Resolves `.[serve,image,sign,oci]` once (`pip install --dry-run --report`: nothing installed),
keeping the versions pinned now (`--upgrade`: the newest), and writes (each installed with
`--no-deps` by Dockerfile.serve):

- serving/requirements.lock: the `serve` extra's closure, less what serving never imports:
  huggingface_hub and its dependencies (tokenizers needs them only for downloads), and
  flatbuffers, packaging and protobuf (onnxruntime declares them for its offline tools);
- serving/requirements-{image,sign,oci}.lock: what each of those extras adds (its own closure,
  walked from its requirements, less what requirements.lock pins).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = ("image", "sign", "oci")
NEVER = {"huggingface-hub", "hf-xet", "pyyaml", "fsspec", "filelock", "tqdm", "httpx2", "httpcore2", "truststore"}
NOT_SERVED = {"flatbuffers", "packaging", "protobuf"}  # onnxruntime's, for its offline tools
HEADER = {
    "requirements.lock": (
        "# The serving image's exact dependency set, installed with --no-deps (Dockerfile.serve).\n"
        "# It is the closure of the `serve` extra minus what serving never imports: huggingface_hub and its\n"
        "# dependencies (tokenizers needs them only for from_pretrained), and flatbuffers, packaging and\n"
        "# protobuf (onnxruntime's, for its offline tools). Regenerate with make serve-lock (images/lock.py).\n"
    ),
}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def resolve(upgrade: bool) -> dict[str, dict]:
    """name -> pip's report item for `.[serve,image,sign,oci]` in a fresh environment, the versions
    the lock files pin kept unless `upgrade`."""
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "constraints.txt"
        kept = [] if upgrade else [p.read_text() for p in sorted((ROOT / "serving").glob("requirements*.lock"))]
        constraints.write_text("\n".join(kept) + "\n")
        subprocess.run([sys.executable, "-m", "venv", f"{tmp}/venv"], check=True)
        report = Path(tmp) / "report.json"
        subprocess.run(
            [f"{tmp}/venv/bin/python", "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
             "--report", str(report), "--constraint", str(constraints), f".[serve,{','.join(EXTRAS)}]"],
            cwd=ROOT, check=True,
        )  # fmt: skip
        items = json.loads(report.read_text())["install"]
    return {norm(i["metadata"]["name"]): i for i in items}


def closure(start: list[str], items: dict[str, dict]) -> set[str]:
    """The names reachable from the requirement strings `start` in the resolved `items`."""
    environment = default_environment()
    seen: set[str] = set()
    todo = [(Requirement(r), "") for r in start]
    while todo:
        requirement, extra = todo.pop()
        if requirement.marker and not requirement.marker.evaluate({**environment, "extra": extra}):
            continue
        name = norm(requirement.name)
        if name not in items:
            continue
        wanted = set(requirement.extras)
        if name in seen and not wanted:
            continue
        seen.add(name)
        for dependency in items[name]["metadata"].get("requires_dist", []):
            parsed = Requirement(dependency)
            if parsed.marker is None or parsed.marker.evaluate({**environment, "extra": ""}):
                todo.append((parsed, ""))
            else:
                for one in wanted:
                    if parsed.marker.evaluate({**environment, "extra": one}):
                        todo.append((parsed, one))
    return seen


def pins(names: set[str], items: dict[str, dict]) -> list[str]:
    return sorted((f"{items[n]['metadata']['name']}=={items[n]['metadata']['version']}" for n in names), key=str.lower)


def main() -> int:
    import tomllib

    items = resolve(upgrade="--upgrade" in sys.argv[1:])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    base = [*project["dependencies"], *extras["serve"]]
    served = closure(base, items) - NEVER - NOT_SERVED
    out = {"requirements.lock": served}
    for extra in EXTRAS:
        out[f"requirements-{extra}.lock"] = closure(extras[extra], items) - served - NEVER
    for name, names in out.items():
        extra = name.split("-")[1].split(".")[0] if "-" in name else ""
        header = HEADER.get(name) or (
            f"# What the `{extra}` extra adds to serving/requirements.lock in the serving image,\n"
            "# installed with --no-deps (Dockerfile.serve). Regenerate with make serve-lock (images/lock.py).\n"
        )
        (ROOT / "serving" / name).write_text(header + "\n".join(pins(names, items)) + "\n")
        print(f"serving/{name}: {len(names)} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
