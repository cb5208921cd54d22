"""Layered-graph risk quantification of system stacks (STRonG-compatible, and sounder).

Light on import: YAML, numpy, networkx and numba load in the modules that need them.
Start with :func:`carina.security.risk.loader.load_model` and
:func:`carina.security.risk.scoring.score`.
"""
