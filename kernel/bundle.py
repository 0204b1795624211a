"""The bundle contract between the packaging pipeline and the server.

A bundle is a directory (or a `.tar` of one) holding `manifest.json`, one `model.onnx` per
variant under `variants/<id>/`, the tokenizer for text models and `report.html`. The manifest
lists every other file with its sha256 and size, so a reader can prove that what it loads is
what the pipeline validated.

This module owns the schema (pydantic models), atomic writing, reading and verification. It is
imported by the pipeline components (to write bundles) and by the server (to read them), so it
depends on nothing heavier than pydantic.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ortpack.kernel.archive import BUNDLE_MAX_BYTES, BUNDLE_MAX_MEMBERS, ArchiveRules, is_inside, is_safe_relpath
from ortpack.kernel.contracts import TaskSettings, UnknownTaskError, get_contract, settings_union
from ortpack.kernel.contracts.tensors import Signature

# 2: hardware records, the probe set and typed parity/benchmark sections (a version-1 bundle has no
# probe for the node check: rebuild it).
# 3: the task's own section, `task_settings`, keyed by its `task` (kernel/contracts/<task>.py)
# where version 2 had every task's optional sections at the top level (`upgrade_v2` reads those).
SCHEMA_VERSION = 3
MANIFEST_NAME = "manifest.json"
# The top-level task sections of a version-2 manifest (frozen: version 2 will never change)
V2_SECTIONS = ("tokenizer", "pooling", "preprocessing", "classification", "labels")
# Every registered task's section, discriminated by its `task` field (the type checker sees the base)
if TYPE_CHECKING:
    TaskSection = TaskSettings
else:
    TaskSection = settings_union()


class BundleError(ValueError):
    """A bundle is missing, malformed, tampered with, or of an unknown schema version."""


# What a bundle fetched from an archive, an s3 prefix or an OCI registry may hold, and how its
# refusals read (ortpack.kernel.sources, ortpack.kernel.oci; the rules themselves are ortpack.kernel.archive's).
BUNDLE_RULES = ArchiveRules(
    max_members=BUNDLE_MAX_MEMBERS,
    max_bytes=BUNDLE_MAX_BYTES,
    error=BundleError,
    too_many="too many entries in bundle: more than {max_members} ({source})",
    too_large="bundle too large: more than {max_gib} declared ({source})",
    unsafe_path="unsafe path in {what}: {path} ({source})",
    link="links are not allowed in bundle archives: {name} -> {target} ({source})",
    special="special files are not allowed in bundle archives: {name} ({source})",
    allow_root=True,  # a tar's `./` entry
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorSpec(_Strict):
    """One graph input or output; dynamic axes are named (`"batch"`, `"sequence"`)."""

    name: str
    dtype: str
    shape: list[int | str]


class Source(_Strict):
    """Where the model came from: a Hugging Face checkpoint, a torchvision or timm architecture, the
    user's own module (`factory`: PACKAGE.MODULE:FACTORY) or a `torch.export` program (`program`:
    its file name, the revision its sha256)."""

    kind: Literal["huggingface", "torchvision", "timm", "factory", "program"]
    id: str
    revision: str | None = None
    weights_sha256: str | None = None


class FileEntry(_Strict):
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: int = Field(ge=0)


class HardwareRecord(_Strict):
    """The machine a check or a measurement ran on (ortpack.kernel.hardware.HardwareInfo)."""

    machine: str
    cpu_model: str
    features: list[str]
    cores: int
    int8_kernel: str


class ProbeRecord(_Strict):
    """The probe check of one variant on one machine (ortpack.kernel.probe.ProbeResult)."""

    passed: bool
    values: dict[str, float]
    misses: list[str] = Field(default_factory=list)
    samples: int
    seconds: float
    provider: str
    hardware: HardwareRecord | None = None


class ParitySection(_Strict):
    """The parity gate's verdict at build time, and where it was reached."""

    passed: bool
    validated_on: str  # the execution provider that actually ran the check
    samples: int
    thresholds: dict[str, float]
    values: dict[str, float]
    hardware: HardwareRecord | None = None
    probe: ProbeRecord | None = None  # the probe check on the build machine
    off_target: bool = False  # validated on another provider than the target's, allowed by the user


class BenchmarkSection(_Strict):
    """Latency per input shape on the build machine, and the speed-up over PyTorch."""

    shapes: dict[str, dict[str, float]] = Field(default_factory=dict)
    speedup_vs_torch: dict[str, float] = Field(default_factory=dict)
    execution_providers: list[str] = Field(default_factory=list)
    hardware: HardwareRecord | None = None
    threads: int = 0


class Int8Candidate(_Strict):
    """One int8 recipe the optimize step tried (components/core/quantization/int8_search.py): its quality
    numbers by name, whether it was within the parity budget and what it missed, its size, and
    for those within budget its latency per benchmark shape and the speed the rule ranked."""

    quality: dict[str, float] = Field(default_factory=dict)
    passed: bool | None = None
    misses: list[str] = Field(default_factory=list)
    mb: float | None = None
    latency_ms: dict[str, float] = Field(default_factory=dict)
    speed_ms: float | None = None
    float_layers: int = 0  # image int8: how many quantizable layers this candidate kept in float

    @model_validator(mode="before")
    @classmethod
    def _numbers_only(cls, data: Any) -> Any:
        """Bundles from before the search recorded each candidate as its numbers alone."""
        if isinstance(data, dict) and data and all(isinstance(v, int | float) for v in data.values()):
            return {"quality": data}
        return data


class Int8Recipe(_Strict):
    """How an int8 variant was quantized: the recipe chosen, the rule that chose it and, where the
    task tried several, every candidate (components/core/quantization/int8_search.py)."""

    recipe: str
    candidate: str = ""  # the candidate shipped, where it is not the recipe alone (the recipe + layers in float)
    rule: str = ""
    candidates: dict[str, Int8Candidate] = Field(default_factory=dict)
    hint: str = ""  # what would help when no recipe was within budget (calibration photos)
    # static int8 (image tasks, components/core/quantization/static_int8.py): the weights' width (8 bits are
    # exact only where the CPU sums u8 x s8 without saturation: `needs_exact_int8_dot`), whether
    # biases were corrected, the calibration, the layers kept in float with the quantization noise
    # each added (their sensitivity), every layer's sensitivity where the search measured it
    weight_bits: int | None = None
    bias_correction: bool | None = None
    calibration: str = ""
    float_layers: dict[str, float] = Field(default_factory=dict)
    sensitivity: dict[str, float] = Field(default_factory=dict)
    # what ONNX Runtime runs for the shipped graph (components/core/quantization/static_int8.kernel_census):
    # int8 kernels and float compute by operator, float compute fed by dequantized weights
    kernels: dict[str, Any] = Field(default_factory=dict)

    @property
    def needs_exact_int8_dot(self) -> bool:
        """8-bit s8 weights: the numbers hold only where u8 x s8 products sum exactly (VNNI, AMX)."""
        return (self.weight_bits or 0) >= 8


class WeightOnlyRecipe(_Strict):
    """How an int4 variant was quantized (components/core/quantization/weight_only.py): the recipe
    chosen by search and its rule, every candidate's numbers, the weights' bits, block size and
    ONNX Runtime accuracy level, whether the embedding table is quantized too, and the layer groups
    kept in float with the KL each added alone (their sensitivity), where the search returned any."""

    recipe: str
    candidate: str = ""
    rule: str = ""
    candidates: dict[str, Int8Candidate] = Field(default_factory=dict)
    bits: int
    block_size: int
    accuracy_level: int
    embeddings: bool = False
    float_layers: dict[str, float] = Field(default_factory=dict)
    sensitivity: dict[str, float] = Field(default_factory=dict)


class OptimizeSection(_Strict):
    """What the optimize step did to the graph: nodes before/after, the fuser and what it fused,
    the operators left, size and time, and for int8 the recipe."""

    nodes_before: int
    nodes_after: int
    fuser: str = "none"
    fusions: dict[str, int] = Field(default_factory=dict)
    ops_after: dict[str, int] = Field(default_factory=dict)
    mb: float
    seconds: float
    int8: Int8Recipe | None = None
    int4: WeightOnlyRecipe | None = None


class ProbeSet(_Strict):
    """The probe inputs and PyTorch outputs every serving node replays before ready."""

    file: str = "probe/probe.npz"
    samples: int = Field(gt=0)


SPACE_ID_HEX = 16  # hex digits of the sha256 kept in a space id: 64 bits, "sha256:" + 16


class EmbeddingSpace(BaseModel):
    """What an embedding variant's vectors mean: everything that decides which vector an input
    gets. Two variants with the same `id` put every input at the same point (up to the numerics of
    the machine that runs them), so an index built with one can be searched with the other; a
    different id means the vectors may not be comparable (`ortpack bundle diff` measures how far).

    Every task with a space (its contract's `SpaceDeclaration`) has the fields here; the task
    adds its own facts as further fields (text: `tokenizer_sha256`, `pooling`, `max_length`).
    `model_sha256` is the variant's graph (int8 and fp32 of one model are different spaces) and
    `weights_sha256` the source weights it came from, kept apart so a client can tell "same model,
    another precision" (same weights, another model digest) from "another model". The `id` is
    "sha256:" + the first 16 hex digits of the sha256 of the other fields as canonical JSON
    (`space_id`)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    id: str = Field(pattern=rf"^sha256:[0-9a-f]{{{SPACE_ID_HEX}}}$")
    model_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    weights_sha256: str | None = None
    precision: str
    normalize: bool
    dimensions: int = Field(gt=0)

    @model_validator(mode="after")
    def _check_id(self) -> EmbeddingSpace:
        expected = space_id(self.model_dump(exclude={"id"}))
        if self.id != expected:
            raise ValueError(f"space id {self.id} does not match its fields ({expected})")
        return self


def space_id(fields: Mapping[str, Any]) -> str:
    """The short id of an embedding space: sha256 over the canonical JSON of its defining fields
    (sorted keys, no spaces), first `SPACE_ID_HEX` hex digits."""
    import json

    canonical = json.dumps(dict(fields), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:SPACE_ID_HEX]


class Variant(_Strict):
    """One target x precision build of the model that passed its parity gate."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    target: str
    execution_providers: list[str]
    precision: Literal["fp32", "fp16", "int8", "int4"]
    file: str
    # the graph's weights when they pass what one protobuf file holds (2 GB): `file` + ".data",
    # named inside the graph (a 0.5B-parameter decoder in fp32 is 2 GB)
    data_file: str | None = None
    ort_version: str
    opset: int
    offline_optimization_level: Literal["disabled", "basic", "extended", "all"]
    # The ORT level to load with when this onnxruntime and provider match: measured at build time
    # ("all" adds CPU layout transformations that are never shipped; int8 graphs may run faster
    # without them). A mismatch always loads with "all".
    online_optimization_level: Literal["disabled", "all"] = "all"
    optimize: OptimizeSection
    parity: ParitySection
    benchmark: BenchmarkSection = Field(default_factory=BenchmarkSection)
    # variants of a task with an embedding space: the space its vectors live in, recorded by write_bundle for readers
    # of manifest.json (bundles written before have none); `embedding_space` computes it from the
    # manifest's facts
    space: EmbeddingSpace | None = None


class Manifest(_Strict):
    schema_version: int
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    version: str
    source: Source
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    # what the task reads beyond the graph (tokenizer, pooling, preprocessing, labels...): the
    # task's own model (kernel/contracts/<task>.py), chosen by its `task` field
    task_settings: TaskSection
    probe: ProbeSet | None = None
    variants: list[Variant] = Field(min_length=1)
    files: dict[str, FileEntry] = Field(default_factory=dict)
    created_at: str
    versions: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_consistency(self) -> Manifest:
        ids = [v.id for v in self.variants]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate variant ids: {ids}")
        return self

    @property
    def task(self) -> str:
        return self.task_settings.task

    @property
    def signature(self) -> Signature:
        """The task's tensors for this bundle (its contract's declaration for its section)."""
        return get_contract(self.task).signature(self.task_settings)

    @property
    def sizes(self) -> dict[str, int]:
        """The named dimensions the graph fixes, as recorded at export ({"dim": 384})."""
        return self.signature.sizes([*self.inputs, *self.outputs])

    def variant(self, variant_id: str) -> Variant:
        for v in self.variants:
            if v.id == variant_id:
                return v
        known = ", ".join(v.id for v in self.variants)
        raise BundleError(f"bundle {self.name!r} has no variant {variant_id!r} (it has: {known})")

    def referenced_files(self) -> list[str]:
        """Files the manifest itself points at (variants, tokenizer): they must be listed."""
        names = [v.file for v in self.variants]
        names += [v.data_file for v in self.variants if v.data_file is not None]
        names += self.task_settings.shared_files()
        if self.probe is not None:
            names.append(self.probe.file)
        return names


def computed_space(manifest: Manifest, variant: Variant) -> EmbeddingSpace | None:
    """The embedding space of a variant of a task that declares one (its contract's `space`),
    from the manifest's own facts: the variant's sha256 in `files`, the source weights' sha256,
    the precision, the width of the declared output and the task's own facts. None for tasks
    without a space, or when a fact is missing (a file not listed, a dynamic output width)."""
    declared = get_contract(manifest.task).space
    if declared is None:
        return None
    output = next((o for o in manifest.outputs if o.name == declared.output), None)
    model = manifest.files.get(variant.file)
    width = output.shape[-1] if output is not None and output.shape else None
    facts = declared.facts(manifest.task_settings, manifest.files)
    if model is None or facts is None or not isinstance(width, int):
        return None
    fields: dict[str, Any] = {
        "model_sha256": model.sha256,
        "weights_sha256": manifest.source.weights_sha256,
        "precision": variant.precision,
        "dimensions": width,
        **facts,
    }
    return EmbeddingSpace(id=space_id(fields), **fields)


def embedding_space(manifest: Manifest, variant: Variant) -> EmbeddingSpace | None:
    """The variant's embedding space, computed from the manifest's facts: the digests every loaded
    byte is checked against, so it names what is actually served (a model swapped and rehashed
    in manifest.json changes it, whatever `variant.space` still says). The recorded `space` is the
    same thing written down for readers of manifest.json; bundles written before it have none."""
    computed = computed_space(manifest, variant)
    return computed if computed is not None else variant.space


def variant_file(variant_id: str) -> str:
    """Where a variant's graph lives in a bundle: the layout, defined once."""
    return f"variants/{variant_id}/model.onnx"


DATA_SUFFIX = ".data"  # a graph's weights file beside it (`model.onnx.data`), where it has one


def read_variant(bundle_dir: Path, manifest: Manifest, variant: Variant) -> tuple[bytes, dict[str, bytes]]:
    """A variant's graph and its weights file (by the name the graph gives it), read and verified."""
    model = read_verified(bundle_dir, manifest, variant.file)
    if variant.data_file is None:
        return model, {}
    return model, {Path(variant.data_file).name: read_verified(bundle_dir, manifest, variant.data_file)}


def check_task_settings(task: str, settings: Mapping[str, Any]) -> TaskSettings:
    """Validate an export's task section (tokenizer, pooling, preprocessing, labels...) against its
    task's manifest model now, where the facts are born, instead of at package time; raises
    BundleError naming the first problem."""
    try:
        model = get_contract(task).settings
    except UnknownTaskError as exc:
        raise BundleError(str(exc)) from None
    try:
        return model.model_validate({**settings, "task": task})
    except ValidationError as exc:
        raise BundleError(f"invalid {task} settings: {_first_error(exc)}") from None


def upgrade_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """A version-2 manifest's fields as version 3: the task's top-level sections move into
    `task_settings` (bundles stay readable; their files and signatures are untouched)."""
    out = {k: v for k, v in raw.items() if k not in V2_SECTIONS and k != "task"}
    task = raw.get("task")
    section: dict[str, Any] = {"task": task}
    try:
        known = get_contract(str(task)).settings.model_fields
    except UnknownTaskError as exc:
        raise BundleError(str(exc)) from None
    for key in V2_SECTIONS:
        if raw.get(key) is not None:
            if key not in known:
                raise BundleError(f"a {task} manifest cannot have {key} settings")
            section[key] = raw[key]
    out.update(schema_version=SCHEMA_VERSION, task_settings=section)
    return out


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def utc_now() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _safe_relpath(rel: str) -> str:
    """`rel`, a manifest's path for a file: relative, no `..`, spelled the one way."""
    if not is_safe_relpath(rel, normalized=True):
        raise BundleError(f"unsafe path in bundle: {rel!r}")
    return rel


def read_verified(bundle_dir: Path, manifest: Manifest, rel: str) -> bytes:
    """The bytes of one listed file, read once and checked against the manifest: the caller loads
    these bytes, not the path, so a file swapped after the check can never be what is used."""
    entry = manifest.files.get(rel)
    if entry is None:
        raise BundleError(f"manifest points at unlisted file: {rel}")
    path = Path(bundle_dir) / _safe_relpath(rel)
    if not is_inside(path, Path(bundle_dir)):
        raise BundleError(f"file escapes the bundle: {rel}")
    try:
        with open(path, "rb") as fh:
            data = fh.read(entry.bytes + 1)
    except FileNotFoundError:
        raise BundleError(f"missing file in bundle: {rel}") from None
    if len(data) != entry.bytes:
        raise BundleError(f"size mismatch for {rel}: {len(data)} bytes, manifest says {entry.bytes}")
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        raise BundleError(f"checksum mismatch for {rel}: the file was changed after packaging")
    return data


def _make_readable(root: Path) -> None:
    """0755 folders and 0644 files whatever the umask: a non-root server must read the bundle."""
    os.chmod(root, 0o755)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            os.chmod(Path(dirpath) / name, 0o755)
        for name in filenames:
            os.chmod(Path(dirpath) / name, 0o644)


def write_bundle(
    out_dir: Path,
    manifest: Mapping[str, Any],
    files: Mapping[str, Path],
    *,
    force: bool = False,
) -> Manifest:
    """Write a bundle atomically and return its manifest.

    `manifest` is every manifest field but `files`, `schema_version` and `created_at`, which
    this function fills in. `files` maps a path inside the bundle to a source file to copy.
    The bundle is built in a temporary directory beside `out_dir` and renamed into place, so a
    failure (a full disk: one-line BundleError), or the process killed, leaves nothing at
    `out_dir`. Writers of one directory take turns (a lock on it), and each first removes what a
    killed writer of this bundle left (its hidden staging directory). An existing `out_dir` is
    replaced only with `force`.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not force:
        raise BundleError(f"output directory exists: {out_dir} (use --force to replace it)")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with _writing(out_dir):
        try:
            return _write_staged(out_dir, manifest, files)
        except OSError as exc:
            where = f" ({exc.filename})" if exc.filename else ""
            raise BundleError(f"cannot write the bundle {out_dir}: {exc.strerror or exc}{where}") from None


@contextmanager
def _writing(out_dir: Path) -> Iterator[None]:
    """Hold the lock of `out_dir`'s parent; remove the staging left there by killed writers."""
    fd = os.open(out_dir.parent, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a filesystem without locks (some network and FUSE mounts): no turns, no cleanup
            yield
            return
        for left in out_dir.parent.glob(f".{out_dir.name}.*"):
            if left.is_dir():
                shutil.rmtree(left, ignore_errors=True)
        yield
    finally:
        os.close(fd)  # closing the descriptor drops the lock


def _write_staged(out_dir: Path, manifest: Mapping[str, Any], files: Mapping[str, Path]) -> Manifest:
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        entries: dict[str, FileEntry] = {}
        for rel, src in sorted(files.items()):
            target = staging / _safe_relpath(rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target)
            entries[rel] = FileEntry(sha256=sha256_file(target), bytes=target.stat().st_size)
        fields = dict(manifest)
        fields.update(schema_version=SCHEMA_VERSION, files=entries)
        fields.setdefault("created_at", utc_now())
        try:
            parsed = _with_spaces(Manifest.model_validate(fields))
        except ValidationError as exc:
            raise BundleError(f"invalid manifest: {_first_error(exc)}") from None
        missing = [name for name in parsed.referenced_files() if name not in entries]
        if missing:
            raise BundleError(f"manifest points at files the bundle lacks: {missing}")
        (staging / MANIFEST_NAME).write_text(parsed.model_dump_json(indent=2) + "\n")
        _make_readable(staging)
        replace_dir(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return parsed


def _with_spaces(manifest: Manifest) -> Manifest:
    """The manifest with every embedding variant's space recorded: the file digests it needs
    are known only once the files are written."""
    variants = [
        v if v.space is not None else v.model_copy(update={"space": computed_space(manifest, v)})
        for v in manifest.variants
    ]
    return Manifest.model_validate({**manifest.model_dump(), "variants": [v.model_dump() for v in variants]})


def replace_dir(new: Path, dest: Path) -> None:
    """Rename `new` to `dest`; an existing `dest` is moved aside first and removed after."""
    if not dest.exists():
        os.rename(new, dest)
        return
    old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
    os.rename(dest, old)
    try:
        os.rename(new, dest)
    except BaseException:
        os.rename(old, dest)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "manifest"
    return f"{where}: {err['msg']}"


def read_manifest(bundle_dir: Path, trusted_sha256: str | None = None) -> Manifest:
    """Parse `manifest.json` without checking files (see `verify_bundle`). With `trusted_sha256`
    (what a verified signature vouches for), the bytes parsed must be those bytes: a manifest
    swapped after the signature check is refused."""
    path = Path(bundle_dir) / MANIFEST_NAME
    if not Path(bundle_dir).is_dir():
        raise BundleError(f"bundle directory not found: {bundle_dir}")
    if not path.is_file():
        raise BundleError(f"not a bundle: {bundle_dir} has no {MANIFEST_NAME}")
    try:
        import json

        data = path.read_bytes()
        if trusted_sha256 is not None and hashlib.sha256(data).hexdigest() != trusted_sha256:
            raise BundleError(f"{MANIFEST_NAME} changed after its signature was verified")
        raw = json.loads(data)
    except (OSError, ValueError) as exc:
        raise BundleError(f"unreadable {MANIFEST_NAME} in {bundle_dir}: {exc}") from None
    if not isinstance(raw, dict):
        raise BundleError(f"{MANIFEST_NAME} in {bundle_dir} is not a JSON object")
    version = raw.get("schema_version")
    if version == 1:
        raise BundleError(
            f"{bundle_dir} is a schema_version 1 bundle, written by an older ortpack without the probe set "
            f"every node re-checks: rebuild it (this ortpack reads version {SCHEMA_VERSION})"
        )
    if version == 2:
        raw = upgrade_v2(raw)
    elif version != SCHEMA_VERSION:
        raise BundleError(
            f"unknown bundle schema_version {version!r} in {bundle_dir} "
            f"(this ortpack reads versions 2 and {SCHEMA_VERSION})"
        )
    try:
        return Manifest.model_validate(raw)
    except ValidationError as exc:
        raise BundleError(f"invalid {MANIFEST_NAME} in {bundle_dir}: {_first_error(exc)}") from None


def verify_bundle(
    bundle_dir: Path, only: list[str] | None = None, known: Callable[[Path], str | None] | None = None
) -> Manifest:
    """Read the manifest and check every listed file's size and sha256 (or only the files in
    `only`: a server verifies what it loads, not variants it will never open). `known` gives a
    file's sha256 when it was hashed already (ortpack.serving.startup.Prehash), else None.

    Raises `BundleError` naming the first problem: unknown schema version, a file the manifest
    points at but does not list, a missing file, a size or checksum mismatch. Files present but
    not listed are ignored (nothing loads them).
    """
    bundle_dir = Path(bundle_dir)
    manifest = read_manifest(bundle_dir)
    unlisted = [name for name in manifest.referenced_files() if name not in manifest.files]
    if unlisted:
        raise BundleError(f"manifest points at unlisted files: {unlisted}")
    selected = manifest.files if only is None else {rel: manifest.files[rel] for rel in only}
    for rel, entry in sorted(selected.items()):
        path = bundle_dir / _safe_relpath(rel)
        if not is_inside(path, bundle_dir):
            raise BundleError(f"file escapes the bundle: {rel}")
        if not path.is_file():
            raise BundleError(f"missing file in bundle: {rel}")
        size = path.stat().st_size
        if size != entry.bytes:
            raise BundleError(f"size mismatch for {rel}: {size} bytes, manifest says {entry.bytes}")
        if ((known(path) if known is not None else None) or sha256_file(path)) != entry.sha256:
            raise BundleError(f"checksum mismatch for {rel}: the file was changed after packaging")
    return manifest
