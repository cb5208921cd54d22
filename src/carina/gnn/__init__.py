"""Out-of-core GNN training (Hyperion-style) and multi-GPU placement (Moment-style).

Import the submodules you need (``carina.gnn.graph``, ``carina.gnn.sampler``,
``carina.gnn.store``, ``carina.gnn.costmodel``, ``carina.gnn.placement``); this
package itself imports no torch.
"""
