"""The shape of a task contract (`TaskContract`) and the pieces several tasks share.

A leaf of the contracts package: the task modules (text_embedding.py, ...) import these types and
the registry in `ortpack.kernel.contracts` imports the task modules. pydantic and the standard library
only: the pipeline, the server and the bundle reader all import contracts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from ortpack.kernel.contracts.tensors import BATCH, Signature, Tensor

if TYPE_CHECKING:
    from ortpack.kernel.gates import GateTable


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TaskOptions(Strict):
    """The export options a task reads beyond its source, name and opset (`ExportSpec.options`):
    one typed object, carried through the pipeline as the one `task_options` parameter and given
    on the command line with its own flags or `--task-option KEY=VALUE`. An option another task
    reads is refused by name. `FILES`: options naming a file (a path or a URI) the export step
    fetches and pins; `DIRECTORIES`: options naming a local directory (resolved to an absolute
    path, staged into the pipeline root for a container runner)."""

    FILES: ClassVar[tuple[str, ...]] = ()
    DIRECTORIES: ClassVar[tuple[str, ...]] = ()

    def given(self) -> dict[str, Any]:
        """The options set, as JSON values (what travels as the pipeline parameter)."""
        return self.model_dump(mode="json", exclude_none=True)


class TextOptions(TaskOptions):
    """The options of the tasks that tokenize: a token limit (default: the model's own)."""

    max_length: int | None = Field(default=None, gt=1, le=8192)


class TaskSettings(Strict):
    """A task's own section of a bundle manifest (`Manifest.task_settings`): how its inputs are
    prepared and its outputs read. Each task subclasses it with `task: Literal["<its name>"]`,
    the key of the manifest's discriminated union."""

    task: str

    def shared_files(self) -> list[str]:
        """Bundle files this section points at (a tokenizer): listed and verified like variants."""
        return []


class TokenizerSettings(Strict):
    """How text becomes `input_ids`: the serving side must tokenize exactly like this."""

    file: str = "tokenizer.json"
    max_length: int = Field(gt=0)
    truncation: bool = True
    padding: Literal["longest"] = "longest"
    pad_token_id: int = Field(ge=0)
    model_input_names: list[str]


class TextSettings(TaskSettings):
    """The section of a task whose inputs are tokenized text."""

    tokenizer: TokenizerSettings

    def shared_files(self) -> list[str]:
        return [self.tokenizer.file]


# What the graph of a task whose inputs are tokenized text takes (the tokenizer says which of
# them a model has: `TokenizerSettings.model_input_names`), and what a request carries instead
INPUT_IDS = Tensor("input_ids", "int64", (BATCH, "sequence"))
ATTENTION_MASK = Tensor("attention_mask", "int64", (BATCH, "sequence"), optional=True)
TOKEN_TYPE_IDS = Tensor("token_type_ids", "int64", (BATCH, "sequence"), optional=True)
TOKEN_INPUTS = (INPUT_IDS, ATTENTION_MASK, TOKEN_TYPE_IDS)
TEXT = Tensor("text", "string", (BATCH,))  # what a client sends a text task (the server tokenizes)
TEXT_REQUEST = (TEXT,)


@dataclass(frozen=True, kw_only=True)
class SpaceDeclaration:
    """A task whose outputs are vectors an index stores declares its embedding space: which output
    holds the vectors, and the facts of its manifest section that decide which vector an input
    gets beyond the model's own (text: the tokenizer's sha256, pooling, normalisation, max
    length). `facts(settings, files)` takes the section and the manifest's file list ({path:
    entry with .sha256}) and gives them (None when one is missing); they must include
    `normalize`. The kernel adds the model's and weights' sha256, the precision and the output's
    width (ortpack.kernel.bundle.embedding_space)."""

    output: str
    facts: Callable[[Any, Mapping[str, Any]], dict[str, Any] | None]


@dataclass(frozen=True, kw_only=True)
class TaskContract:
    """What a task is, as data every side reads: its manifest section, its export options, its
    tensors (`signature`: the section -> the graph's inputs and outputs and what a request carries;
    ortpack.kernel.contracts.tensors), the numbers that gate it (threshold name ->
    `ortpack.kernel.gates.Gate`, in the order checks and reports list them), its embedding space
    if its outputs are vectors an index stores, and the modules that run it: its engine
    (`ortpack.kernel.engines.<task>`, whose `ENGINE` prepares inputs, runs the model and
    post-processes) and its serving plugin (`ortpack.serving.tasks.<task>`, whose `TASK` adds the
    HTTP routes). Modules are named, not imported, so reading a manifest imports neither."""

    name: str
    settings: type[TaskSettings]
    options: type[TaskOptions]
    signature: Callable[[Any], Signature]
    gates: GateTable
    engine: str
    plugin: str
    space: SpaceDeclaration | None = None

    def __post_init__(self) -> None:
        tag = self.settings.model_fields["task"].annotation
        if tag != Literal[self.name]:  # type: ignore[valid-type]
            raise ValueError(f"{self.settings.__name__}.task must be Literal[{self.name!r}], not {tag}")


def fixed(signature: Signature) -> Callable[[Any], Signature]:
    """The `signature` of a task whose tensors do not depend on its manifest section."""
    return lambda _settings: signature
