"""ortpack: turn a PyTorch model into a fast, verified ONNX Runtime bundle, and serve it.

One installed package, four floors (the repository keeps each as a top-level folder; the
subpackages here link to them):

    ortpack.kernel       the bundle and task contracts, gates, probe, ONNX Runtime sessions, each
                         task's engine (prepare, run, post-process), hardware, variant selection,
                         policy, archives, signing, OCI and URI sources. Imports neither side.
    ortpack.components   the build side: export, optimize, validate, benchmark, package, report
                         (`components.core`) and the thin KFP components around it.
    ortpack.serving      the serving side: HTTP routes, request bodies, answers, the batcher, the app.
    ortpack.pipelines    on top: the Kubeflow pipeline and the `ortpack` command line.

Importing `ortpack` imports nothing else: the version only.
"""

__version__ = "0.1.0"
