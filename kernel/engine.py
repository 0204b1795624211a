"""A task's engine: one loaded variant of one task, without HTTP (prepare -> run -> post).

Each task's engine module (`ortpack.kernel.engines.<task>`, named by its contract) exports
`ENGINE`, an `EngineSpec`: how to open an `Engine` on an ONNX Runtime session, and how its probe
outputs are compared with PyTorch's. An engine turns inputs into payloads (tokenizes, decodes),
runs a batch of payloads through the session and post-processes each item's outputs (pads,
splits detections by image), and says what a payload costs in the units the model pays for
(tokens, pixels). The server's batcher runs it, every serving node's probe check and the build's
validate step replay the probe through it, and `bundle diff` embeds with it: the same code
wherever a variant's numbers are taken.

An item's outputs (`Item`) are its arrays by the task's declared output names
(ortpack.kernel.contracts.tensors): one row of a per-item tensor, or the item's own rows of a
varying-count one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ortpack.kernel.contracts.tensors import Signature, Tensor

if TYPE_CHECKING:
    from ortpack.kernel.bundle import Manifest, Variant
    from ortpack.kernel.contracts import TaskSettings

Item = dict[str, np.ndarray]


@dataclass(frozen=True, kw_only=True)
class EngineOptions:
    """The limits an engine applies (a server's options; the build and the probe use these
    defaults): tokens (0: the model's max length), truncation, buckets (empty: the default
    ones), characters per text (0: 100 per token), pixels per image, the image decode mode, and
    what one batch may cost (padded tokens; pixels) and hold (images; 0: any)."""

    max_tokens: int = 0
    truncate: bool = True
    buckets: tuple[int, ...] = ()
    max_text_chars: int = 0
    max_image_pixels: int = 1 << 40
    decode: str = "auto"
    max_batch_tokens: int = 0
    max_batch_pixels: int = 0
    max_batch_images: int = 0


@dataclass(frozen=True, kw_only=True)
class EngineContext:
    """What opening an engine needs: the task's manifest section and tensors, the session, the
    verified bytes of the bundle's shared files (tokenizer) by path, the limits, and the variant
    being served (None on the build machine, where its parity is what is being measured)."""

    settings: TaskSettings
    signature: Signature
    sizes: Mapping[str, int]  # named dimensions the graph fixes ({"dim": 384})
    session: Any
    files: Mapping[str, bytes] = field(default_factory=dict)
    options: EngineOptions = field(default_factory=EngineOptions)
    variant: Variant | None = None
    name: str = ""  # the bundle's, for messages

    @classmethod
    def of(
        cls,
        manifest: Manifest,
        session: Any,
        files: Mapping[str, bytes],
        *,
        variant: Variant | None = None,
        options: EngineOptions | None = None,
    ) -> EngineContext:
        return cls(
            settings=manifest.task_settings,
            signature=manifest.signature,
            sizes=manifest.sizes,
            session=session,
            files=files,
            options=options or EngineOptions(),
            variant=variant,
            name=manifest.name,
        )


class Engine(Protocol):
    """One loaded variant: what the batcher, the probe check and `bundle diff` call."""

    signature: Signature
    session: Any
    units: str  # what `cost` counts: "tokens", "pixels"
    padded: bool  # a batch costs its longest item times its size (tokens), else the sum (pixels)
    max_batch_cost: float  # a batch stops there (it always holds one item)
    cost_per_byte: float  # a request body byte's cost, as a first guess (a server learns it)
    batching: str  # how it batches, for the start-up line
    max_batch_size: int  # the most payloads one call takes (0: any; a graph exported for batch 1: 1)

    def run(self, payloads: Sequence[Any]) -> list[Item]:
        """One batch of payloads -> one item of outputs per payload, in order."""
        ...

    def cost(self, payload: Any) -> float:
        """What one payload costs the model, in `units`."""
        ...

    def warm_up_batches(self, max_batch_size: int) -> list[list[Any]]:
        """Batches of payloads that touch every shape a server will run (biggest first)."""
        ...

    def probe_payloads(self, inputs: Sequence[Any]) -> list[Any]:
        """Probe inputs (texts, pairs, encoded image files) to payloads, as requests become them."""
        ...

    def on(self, session: Any) -> Engine:
        """The same engine on another session of the same model (the server's lone session)."""
        ...


ProbeMetrics = Callable[[list[Item], list[Item], Sequence[Any]], dict[str, float]]


@dataclass(frozen=True, kw_only=True)
class EngineSpec:
    """A task's engine module's `ENGINE`: how to open one, and its probe comparison ((PyTorch's
    items, the variant's items, the probe inputs) -> the gated metrics a probe can measure)."""

    name: str
    open: Callable[[EngineContext], Engine]
    probe_metrics: ProbeMetrics
    # A generation engine runs its own loop over one session (kernel/generation/): the server gives
    # that session every core and runs no batcher workers or lone session beside it
    own_loop: bool = False


def declared_cost(tensor: Tensor) -> Callable[[Any], float]:
    """What one payload of `tensor` (the graph input a payload fills: one item's slice of it)
    costs: the product of its sizes along the dimensions the declaration names (not its batch):
    a text's `sequence` (its tokens), an image's `height` x `width` (its pixels). A payload whose
    array is an attribute `ids` (a token pair) counts that array."""
    named = [i for i, d in enumerate(tensor.shape[1:]) if isinstance(d, str)]

    def cost(payload: Any) -> float:
        array = getattr(payload, "ids", payload)
        shape = array.shape if isinstance(array, np.ndarray) else np.shape(array)
        return float(math.prod(shape[i] for i in named if i < len(shape)))  # per request, several times: not np.prod

    return cost


def stack(items: Sequence[Item], name: str) -> np.ndarray:
    """One output of per-item tensors over items, as one array (row i is item i's)."""
    return np.stack([item[name] for item in items])


def as_items(name: str, rows: np.ndarray) -> list[Item]:
    """A batch's output of a per-item tensor, as items."""
    return [{name: row} for row in rows]
