"""ortpack components: the KFP component wrappers and, in `ortpack.components.core`, the library they call."""

# One import name per file: this folder is the package `ortpack.components` (ortpack/components links to it).
# Imported as `components` (the repository root on sys.path), every module under it would load twice,
# as two module objects with two sets of globals: refuse that at once.
if __name__ != "ortpack.components":
    raise ImportError(f"import ortpack.components, not {__name__}: components/ is the package ortpack.components")
