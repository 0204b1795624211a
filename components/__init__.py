"""ortpack components: the KFP component wrappers and, in `ortpack.components.core`, the library they call."""
