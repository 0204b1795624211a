"""The shape of a task contract (`TaskContract`) and the pieces several tasks share.

A leaf of the contracts package: the task modules (text_embedding.py, ...) import these types and
the registry in `serving.contracts` imports the task modules. pydantic and the standard library
only: the pipeline, the server and the bundle reader all import contracts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from serving.gates import GateTable


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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


@dataclass(frozen=True, kw_only=True)
class TaskContract:
    """What a task is, as data both sides read: its manifest section, the numbers that gate it
    (threshold name -> `serving.gates.Gate`, in the order checks and reports list them) and the
    serving plugin (`serving/tasks/<task>.py`, whose `TASK` serves it; imported by name so that
    reading a manifest never imports the server)."""

    name: str
    settings: type[TaskSettings]
    gates: GateTable
    plugin: str

    def __post_init__(self) -> None:
        tag = self.settings.model_fields["task"].annotation
        if tag != Literal[self.name]:  # type: ignore[valid-type]
            raise ValueError(f"{self.settings.__name__}.task must be Literal[{self.name!r}], not {tag}")
