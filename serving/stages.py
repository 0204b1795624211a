"""Where a request's time goes: the stage breakdown of one answered inference request.

Each stage is measured where it happens and lands in the request's context
(serving/context.py); the HTTP wrapper (serving/http.py) turns it into this breakdown once the
answer is built and exports it as `ortpack_request_stage_seconds{route,stage}`. The stages
follow each other on the request's path, so they add up to `total`:

- `read`: reading and parsing the body (JSON);
- `tokenize`: tokenizing its texts (inline or on a thread, the hop included);
- `queue`: queued until its first model call started (the hand-off to a worker thread included);
- `model`: its first model call's start to its last one's end (the model runs padding, the
  network and pooling: pooling is in the graph);
- `postprocess`: its last model call's end until its rows are back in the handler (the hand-off
  to the event loop, stacking the rows);
- `serialize`: encoding the answer (orjson, base64);
- `other`: the rest of `total` (routing, checking the request, the event loop's turns);
- `total`: its first byte read to its answer built (what the server can see of it; the client
  also sees the network and the answer being written).
"""

from __future__ import annotations

from ortpack.serving.context import RequestContext

STAGES = ("read", "tokenize", "queue", "model", "postprocess", "serialize", "other", "total")


def breakdown(ctx: RequestContext, total: float) -> dict[str, float] | None:
    """Seconds per stage (`STAGES`, in order) of a request that reached the model; None for one
    that did not (refused, failed, or a route without a model call)."""
    if ctx.queue_s is None or ctx.inference_s is None:
        return None
    parts = {
        "read": ctx.read_s,
        "tokenize": ctx.tokenize_s,
        "queue": ctx.queue_s,
        "model": ctx.inference_s,
        "postprocess": ctx.postprocess_s,
        "serialize": ctx.serialize_s,
    }
    parts["other"] = max(0.0, total - sum(parts.values()))
    parts["total"] = total
    return parts
