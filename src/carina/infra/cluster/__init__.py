"""carina.infra.cluster: GPU node validation, collectives and a scaling model (Vela).

* :mod:`~carina.infra.cluster.checks`: a registry of node checks (NVML health, PCIe, HBM, matmul,
  HPL-like LU, host memory, disk, collectives, VM topology), each graded PASS/WARN/FAIL against the
  device's spec and the fleet median.
* :mod:`~carina.infra.cluster.runner`: runs checks with timeouts and labels the node PASS/WARN/EVICT.
* :mod:`~carina.infra.cluster.exporter`: a Prometheus exporter of those labels and metrics.
* :mod:`~carina.infra.cluster.multinode`: pairwise and ring bandwidth across nodes that names the slow one.
* :mod:`~carina.infra.cluster.model`: an analytical throughput model of transformer training at scale.

Nothing here imports torch or NVML until a check runs.
"""
