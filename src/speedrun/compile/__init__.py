"""Compilation: the compile caches, the precompile child, per-block compilation, cold-start phases.
"""
