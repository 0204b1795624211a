"""The packaging library: export, optimize, validate, benchmark and package.

Plain functions that take paths and frozen specs and return result dataclasses. Nothing here
imports `kfp`; the KFP components in `components/` are thin wrappers around these functions.
"""
