"""ortpack serving: the HTTP server over the kernel's engines.

Routes, request bodies and answers (each task's plugin under `tasks/`), the batcher, the app and
its start-up. Nothing under `serving` imports torch, transformers, kfp or `ortpack.components`:
the serving image installs only the `serve` extra.
"""

# One import name per file: this folder is the package `ortpack.serving` (ortpack/serving links to it).
# Imported as `serving` (the repository root on sys.path), every module under it would load twice,
# as two module objects with two sets of globals: refuse that at once.
if __name__ != "ortpack.serving":
    raise ImportError(f"import ortpack.serving, not {__name__}: serving/ is the package ortpack.serving")
