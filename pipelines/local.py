"""`ortpack run`: the package_model pipeline on this machine with `kfp.local`.

Two runners. `subprocess` (the default): steps run as subprocesses in the current environment
(`SubprocessRunner(use_venv=False)`), so `packages_to_install` must stay empty. `docker`: each step
runs in the component image with `kfp.local.DockerRunner`, through any Docker-API engine
(DOCKER_HOST: Docker, or podman's `podman system service` socket), with the command and arguments
the compiled YAML carries. kfp.local mounts only the pipeline root into a step's container, so
local input files are staged under it first (`stage_local_inputs`).

kfp.local prints every step's output to stdout: we keep all of it in `<run>/ortpack-run.log` and
show step transitions and ortpack's progress lines.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortpack.components.core import errors
from ortpack.components.core.artifacts import ExportResult, VariantRecord
from ortpack.components.core.errors import (
    InvalidSpecError,
    NoVariantPassedError,
    OrtpackError,
    UnsupportedHereError,
    one_line,
)
from ortpack.components.core.package import VERDICT_FILE, Verdict
from ortpack.kernel.bundle import replace_dir, verify_bundle

log = logging.getLogger("ortpack.run")

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PROGRESS = re.compile(r"finished with status FAILURE|^\s*\[ortpack")
_STARTED = re.compile(r"Executing task '([\w-]+)'")
_ERROR_LINE = re.compile(r"^\s*(?:[\w.]+\.)?(\w+(?:Error|Exception)): (.+)$")


class PipelineRunError(OrtpackError, RuntimeError):
    """A step of a local pipeline run failed; the message is that step's own error."""


class PipelineRefusedError(OrtpackError, ValueError):
    """A step refused its input (one of ortpack's input errors: exit 2, like the same refusal
    outside the pipeline); the message is that step's own error."""


class _ProgressStream(io.TextIOBase):
    """Tee kfp.local's stdout into a log file (plain text); echo the interesting lines, with
    "step k of N" for each task kfp.local starts (`total_steps`, when known)."""

    def __init__(
        self, log_file: io.TextIOBase, echo: Callable[[str], None], verbose: bool, total_steps: int = 0
    ) -> None:
        self.log_file, self.echo, self.verbose = log_file, echo, verbose
        self.total, self.started = total_steps, 0
        self.pending = ""

    def write(self, text: str) -> int:
        self.log_file.write(_ANSI.sub("", text))  # kfp.local colours its lines
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            clean = _ANSI.sub("", line).rstrip()
            started = _STARTED.search(clean)
            if started:
                self.started += 1
                of = f" of {max(self.total, self.started)}" if self.total else ""
                self.echo(f"step {self.started}{of}: {started.group(1)}")
            elif clean and (self.verbose or _PROGRESS.search(clean)):
                self.echo(clean)
        return len(text)

    def flush(self) -> None:
        self.log_file.flush()


@dataclass(frozen=True, kw_only=True)
class LocalRun:
    run_dir: Path
    bundle_dir: Path
    log_file: Path


def _new_run_dir(root: Path, before: set[Path]) -> Path | None:
    created = [p for p in root.iterdir() if p.is_dir() and p not in before]
    return max(created, key=lambda p: p.stat().st_mtime) if created else None


def last_error(log_file: Path) -> tuple[str, str] | None:
    """The type and message of the last `SomeError: message` line a step printed (its exception),
    if any. kfp.local's own summary ("... Inner task failed: ...") is not a step's error."""
    found = None
    for line in log_file.read_text(errors="replace").splitlines():
        line = _ANSI.sub("", line)
        match = _ERROR_LINE.match(line)
        if match and "Inner task failed" not in line:
            found = (match.group(1), match.group(2).strip())
    return found


def _is_refusal(error_type: str) -> bool:
    """True when a step's error type is one of ortpack's input errors (a ValueError)."""

    found = getattr(errors, error_type, None)
    return isinstance(found, type) and issubclass(found, ValueError)


RUNNERS = ("subprocess", "docker")
RUN_LABEL = "dev.ortpack.run"  # on every step container of a docker run, to clean up after it


def docker_runner(images: list[str], run_id: str) -> Any:
    """A `kfp.local.DockerRunner` for the engine DOCKER_HOST names (default: Docker's socket),
    after checking that the engine answers and has each of `images` (or can pull it): kfp.local
    would otherwise fail later, with the registry's error instead of the reason.

    Steps run as the calling user (they write into the pipeline root on this machine, as the
    subprocess runner does), on the host network (a model URI on 127.0.0.1 means this machine,
    as it does for the subprocess runner), labelled with the run for `remove_run_containers`."""
    from kfp import local

    client = _docker_client()
    try:
        for image in dict.fromkeys(images):
            try:
                client.images.get(image)
            except Exception as missing:  # noqa: BLE001 - docker.errors.ImageNotFound, or the engine's own error
                try:
                    client.images.pull(image)
                except Exception as exc:  # noqa: BLE001 - one line with both reasons below
                    raise UnsupportedHereError(
                        f"image {image} is not in the container engine ({one_line(missing, 120)}) and cannot be "
                        f"pulled ({one_line(exc, 160)}): build it with `make images`, or give --component-image "
                        "and --steps-image"
                    ) from None
    finally:
        client.close()
    from kfp.local import docker_task_handler

    docker_task_handler.run_docker_container = run_step_container
    return local.DockerRunner(
        user=f"{os.getuid()}:{os.getgid()}",
        network_mode="host",
        environment={"HOME": "/tmp"},
        labels={RUN_LABEL: run_id},
    )


def run_step_container(client: Any, image: str, command: list[str], volumes: dict[str, Any], **args: Any) -> int:
    """kfp.local's step runner (`docker_task_handler.run_docker_container`) without auto-removal:
    it starts the container with `auto_remove=True`, and when a quick step (the gate) exits and
    is removed before docker-py inspects it, podman's Docker API answers 500 "no such container"
    where Docker answers 404, and the run fails after every step passed. Here the step's exit
    status is waited for and read, then the container is removed; logs stream as kfp.local's do."""
    from kfp.local.docker_task_handler import add_latest_tag_if_not_present

    image = add_latest_tag_if_not_present(image=image)
    try:
        client.images.get(image)
        print(f"Found image {image!r}\n")
    except Exception:  # noqa: BLE001 - docker.errors.ImageNotFound: docker_runner checked it can be pulled
        client.images.pull(image)
    container = client.containers.run(
        image=image, command=command, detach=True, stdout=True, stderr=True, volumes=volumes, **args
    )
    try:
        for line in container.logs(stream=True):
            print(line.decode(), end="")
        return int(container.wait()["StatusCode"])
    finally:
        with contextlib.suppress(Exception):
            container.remove(force=True)


def _docker_client() -> Any:
    try:
        import docker
    except ImportError:
        raise UnsupportedHereError("--runner docker needs the `docker` package (the kfp extra installs it)") from None
    where = os.environ.get("DOCKER_HOST") or "the default socket (unix:///var/run/docker.sock)"
    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - docker.errors.DockerException or a connection error
        raise UnsupportedHereError(
            f"no Docker-API engine answers at {where} ({one_line(exc, 160)}): start Docker, or `podman system "
            "service` and set DOCKER_HOST=unix://PATH/TO/podman.sock, or use --runner subprocess"
        ) from None
    return client


def remove_run_containers(run_id: str) -> None:
    """Stop and remove the step containers of a docker run that are still there (after an
    interrupt or a failure: kfp.local removes a container only when its step ends)."""
    with contextlib.suppress(Exception):
        client = _docker_client()
        try:
            for container in client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_id}"}):
                with contextlib.suppress(Exception):
                    container.remove(force=True)
        finally:
            client.close()


def stage_local_inputs(arguments: dict[str, Any], keys: tuple[str, ...], pipeline_root: Path) -> dict[str, Any]:
    """A copy of `arguments` whose local paths under `keys` point at copies under the pipeline
    root (the only directory kfp.local mounts into a step's container, at the same path). The
    copy is named by the source's path and modification time, so a rerun reuses it."""
    import hashlib

    staged = dict(arguments)
    root = Path(pipeline_root).resolve() / "inputs"
    for key in keys:
        value = str(arguments.get(key) or "")
        path = Path(value).expanduser()
        if not value or "://" in value or not path.exists():
            continue  # a URI, a bundled model name, or nothing
        path = path.resolve()
        if path.is_relative_to(root.parent):
            continue
        stamp = hashlib.sha256(f"{path}:{path.stat().st_mtime_ns}".encode()).hexdigest()[:16]
        target = root / stamp / path.name
        if not target.exists():
            scratch = root / f".{stamp}.staging"
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir(parents=True)
            if path.is_dir():
                shutil.copytree(path, scratch / path.name)
            else:
                shutil.copy2(path, scratch / path.name)
            scratch.rename(target.parent)
        staged[key] = str(target)
    return staged


def run_pipeline_locally(
    pipeline: Callable[..., Any],
    arguments: dict[str, Any],
    *,
    pipeline_root: Path,
    out_dir: Path,
    force: bool = False,
    verbose: bool = False,
    echo: Callable[[str], None] = print,
    runner: Any = None,
    total_steps: int = 0,
) -> LocalRun:
    """Run `pipeline` with kfp.local and copy its bundle to `out_dir` (atomically). `runner` is a
    kfp.local runner (default: the subprocess runner in this environment)."""
    from kfp import local

    pipeline_root = Path(pipeline_root).resolve()
    pipeline_root.mkdir(parents=True, exist_ok=True)
    before = set(pipeline_root.iterdir())
    local.init(
        runner=runner or local.SubprocessRunner(use_venv=False), pipeline_root=str(pipeline_root), raise_on_error=True
    )
    scratch_log = pipeline_root / f".ortpack-run-{time.strftime('%Y%m%d-%H%M%S')}.log"
    failure: Exception | None = None
    with open(scratch_log, "w") as fh:
        stream = _ProgressStream(fh, echo, verbose, total_steps)
        # kfp.local also logs some lines on the root logger outside its own handler: keep them too
        root_handler = logging.StreamHandler(stream)  # type: ignore[arg-type]
        logging.getLogger().addHandler(root_handler)
        # kfp.local swaps builtins.print per task (to indent step output); with tasks on several
        # threads the swaps interleave and can leave it swapped. Put the real one back after.
        real_print = builtins.print
        try:
            with contextlib.redirect_stdout(stream):  # type: ignore[type-var]
                pipeline(**arguments)
        except Exception as exc:  # noqa: BLE001 - reported below with the step's own message
            failure = exc
        finally:
            logging.getLogger().removeHandler(root_handler)
            builtins.print = real_print
    run_dir = _new_run_dir(pipeline_root, before)
    log_file = scratch_log
    if run_dir is not None:
        log_file = run_dir / "ortpack-run.log"
        shutil.move(scratch_log, log_file)
    if failure is not None:
        verdict = run_verdict(run_dir) if run_dir is not None else None
        if verdict is not None and not verdict.passed:  # the package step's record, not a message
            raise NoVariantPassedError(verdict.reason)
        found = last_error(log_file)
        step_error = found[1] if found else one_line(_ANSI.sub("", str(failure)))
        error = PipelineRefusedError if found and _is_refusal(found[0]) else PipelineRunError
        raise error(f"{step_error} (full log: {log_file})")
    if run_dir is None:
        raise PipelineRunError(f"kfp.local wrote no run directory under {pipeline_root}")
    bundles = sorted(run_dir.glob("**/package-bundle/bundle"))
    if not bundles:
        raise PipelineRunError(f"the run finished without a bundle (full log: {log_file})")
    out_dir = Path(out_dir)
    if out_dir.exists() and not force:
        raise InvalidSpecError(f"output directory exists: {out_dir} (use --force to replace it)")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.with_name(f".{out_dir.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(bundles[-1], staging)
    verify_bundle(staging)
    replace_dir(staging, out_dir)
    return LocalRun(run_dir=run_dir, bundle_dir=out_dir, log_file=log_file)


def load_run_records(run_dir: Path) -> tuple[Any, list[Any]]:
    """The export record and every measured variant of a local run (for the summary table)."""

    exports = sorted(Path(run_dir).glob("**/export-model/exported"))
    export = ExportResult.load(exports[-1])
    records = [VariantRecord.load(d) for d in sorted(Path(run_dir).glob("**/benchmark-variant*/measured"))]
    return export, sorted(records, key=lambda r: r.variant_id)


def run_verdict(run_dir: Path) -> Any:
    """The package step's verdict (ortpack.components.core.package.Verdict) of a local run, if it wrote one."""

    found = sorted(Path(run_dir).glob(f"**/package-bundle/verdict/{VERDICT_FILE}"))
    return Verdict.load(found[-1].parent) if found else None


def published_uri(run_dir: Path) -> str | None:
    """The publish step's pinned URI in a local run, if that step ran."""
    import json

    for path in sorted(Path(run_dir).glob("**/publish-bundle/executor_output.json")):
        value = json.loads(path.read_text()).get("parameterValues", {}).get("Output")
        if value:
            return str(value)
    return None
