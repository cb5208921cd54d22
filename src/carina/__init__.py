"""carina: build and run AI training infrastructure on commodity parts.

``import carina`` is cheap: it imports no torch, CUDA, networkx, dissect or
fastapi. Subsystems (``carina.io``, ``carina.offload``, ``carina.gnn``, ...)
are imported when used.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
