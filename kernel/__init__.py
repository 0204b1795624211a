"""The kernel both sides stand on: what a bundle is and how its numbers are checked and run.

The bundle contract (`bundle`), the task contracts (`contracts`: each task's manifest section,
export options, tensors, gates and whether it has an embedding space), the gate arithmetic
(`gates`), the probe set every serving node replays (`probe`), ONNX Runtime sessions (`runtime`),
each task's engine (`engines`: inputs to payloads, the model call, post-processing, probe
metrics), the tokenizer and the image decoder, hardware and targets, variant selection and
policy, archives, signing, OCI registries and URI sources.

It imports neither `ortpack.serving` nor `ortpack.components` (tests/test_import_boundary.py), nor
torch, transformers or kfp: the serving image installs it with the serving side alone.
"""

# One import name per file: this folder is the package `ortpack.kernel` (ortpack/kernel links to it).
# Imported as `kernel` (the repository root on sys.path), every module under it would load twice,
# as two module objects with two sets of globals: refuse that at once.
if __name__ != "ortpack.kernel":
    raise ImportError(f"import ortpack.kernel, not {__name__}: kernel/ is the package ortpack.kernel")
