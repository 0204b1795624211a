"""ortpack serving: the HTTP server over the kernel's engines.

Routes, request bodies and answers (each task's plugin under `tasks/`), the batcher, the app and
its start-up. Nothing under `serving` imports torch, transformers, kfp or `ortpack.components`:
the serving image installs only the `serve` extra.
"""
