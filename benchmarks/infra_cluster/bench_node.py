"""Run every `carina cluster check` on this node and record each figure against its spec.

Usage: python benchmarks/infra_cluster/bench_node.py [--quick] [--path DIR]

Writes benchmarks/results/<machine>/cluster_node.json (figures with the device's data-sheet
peak as ceiling and the known-good figure for that GPU as a peer) and cluster_model_vela.json
(the scaling model's prediction for Vela's 50B configuration, basis "modeled").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from carina.core.bench import Basis, Figure, make_record, write_record
from carina.infra.cluster.checks.specs import spec_for
from carina.infra.cluster.model import Cluster, Layout, ModelShape, predict
from carina.infra.cluster.runner import RunConfig, run_checks

UNITS = {"gbps": "GB/s", "tflops": "TFLOP/s", "gflops": "GFLOP/s"}


def _spec_values(name: str | None) -> tuple[dict[str, float], dict[str, float], str]:
    spec = spec_for(name) if name else None
    if spec is None:
        return {}, {}, ""
    peaks = {"h2d_gbps": spec.pcie_gbps, "d2h_gbps": spec.pcie_gbps, "hbm_gbps": spec.hbm_gbps}
    peaks.update({f"{d}_tflops": v for d, v in spec.tflops.items()})
    return peaks, dict(spec.good), f"{spec.model} data sheet"


def node_record(config: RunConfig) -> dict:
    report = run_checks(config)
    gpu = None
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        pass
    peaks, good, source = _spec_values(gpu)
    figures = []
    for result in report.results:
        for key, value in result.metrics.items():
            unit = next((u for suffix, u in UNITS.items() if key.endswith(suffix)), None)
            if unit is None or ("_busbw_" in key and "peak" not in key):
                continue
            peers = {f"known-good {gpu}": good[key]} if key in good else {}
            figures.append(
                Figure(
                    name=f"{result.name}.{key}",
                    value=float(value),
                    unit=unit,
                    ceiling=peaks.get(key),
                    ceiling_source=source if key in peaks else "",
                    peers=peers,
                )
            )
    metrics = {
        "label": report.label.value,
        "gpu": gpu,
        "results": [
            {
                "check": r.name,
                "status": r.status.value,
                "message": r.message,
                "metrics": r.metrics,
                "seconds": r.seconds,
            }
            for r in report.results
        ],
    }
    return make_record(
        name="cluster_node", figures=figures, config=config, metrics=metrics, command=" ".join(["python", *sys.argv])
    )


def vela_record() -> dict:
    shape = ModelShape(layers=62, hidden=8192, seq_len=2048, vocab=51200, global_batch=1536)
    layout = Layout(tensor=8, pipeline=4, data=48, micro_batch=1)
    figures, metrics = [], {}
    for gbit in (25, 50, 100, 400):
        pred = predict(shape, Cluster(gpus=1536, inter_gbit=gbit), layout)
        metrics[f"{gbit}gbit"] = {"tflops_per_gpu": pred.tflops_per_gpu, "breakdown_s": pred.breakdown_s}
        figures.append(
            Figure(
                name=f"vela_50b_1536gpu_{gbit}gbit.fraction_of_ideal",
                value=pred.fraction_of_ideal,
                unit="fraction",
                ceiling=1.0,
                ceiling_source="infinitely fast network",
                basis=Basis.MODELED,
            )
        )
    small = predict(
        ModelShape(layers=62, hidden=8192, global_batch=32),
        Cluster(gpus=32, inter_gbit=25),
        Layout(tensor=8, pipeline=4, data=1),
    )
    large = predict(shape, Cluster(gpus=1536, inter_gbit=25), layout)
    figures.append(
        Figure(
            name="vela_50b_weak_scaling_32_to_1536",
            value=large.tflops_per_gpu / small.tflops_per_gpu,
            unit="fraction",
            ceiling=1.0,
            ceiling_source="perfect scaling",
            peers={"Vela paper (~80%)": 0.80},
            basis=Basis.MODELED,
        )
    )
    return make_record(
        name="cluster_model_vela",
        figures=figures,
        config={"shape": shape.to_dict(), "layout": layout.to_dict()},
        metrics=metrics,
        command=" ".join(["python", *sys.argv]),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--path", default=".", help="disk path for disk_bw")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results/<machine>)")
    args = parser.parse_args()
    config = RunConfig(quick=args.quick, paths=[args.path], timeout_s=300)
    for record in (node_record(config), vela_record()):
        print(write_record(record, directory=args.out))


if __name__ == "__main__":
    main()
