"""ortpack pipelines: the Kubeflow pipeline definitions and the `ortpack` command line."""

# One import name per file: this folder is the package `ortpack.pipelines` (ortpack/pipelines links to it).
# Imported as `pipelines` (the repository root on sys.path), every module under it would load twice,
# as two module objects with two sets of globals: refuse that at once.
if __name__ != "ortpack.pipelines":
    raise ImportError(f"import ortpack.pipelines, not {__name__}: pipelines/ is the package ortpack.pipelines")
