"""What every ortpack component runs on: one image, built from Dockerfile.component.

`ORT_VERSION` is the onnxruntime the image pins; it is passed to every step whose result depends
on it, so KFP's cache key changes when onnxruntime does (a test checks it matches the installed
onnxruntime).
"""

from serving import __version__

COMPONENT_IMAGE = f"ghcr.io/ortpack/ortpack-component:{__version__}"
ORT_VERSION = "1.32.0"
