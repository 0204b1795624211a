"""ortpack components: the KFP component wrappers and, in `components.core`, the library they call."""
