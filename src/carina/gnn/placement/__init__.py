"""Topology-aware feature placement and transfer scheduling (Moment-style).

Modules: ``topology`` (machine graphs: JSON, ``nvidia-smi topo -m``, sysfs, built-ins),
``schedule`` (min-time transfer LP, networkx max-flow cross-check), ``simulate``
(fluid link-sharing simulator), ``place`` (greedy and exact placement).
"""
