"""ortpack serving: the bundle contract and the ONNX Runtime server.

Nothing under `serving` imports torch, transformers, kfp or `components`: the serving image
installs only the `serve` extra.
"""

__version__ = "0.1.0"
