"""A Prometheus exporter of node check results (``carina cluster serve``).

Exposes, per node, ``carina_node_health{node, label}`` (1 for the current label),
``carina_check_status{node, check, status}`` and ``carina_check_metric{node, check, metric}``,
refreshed by re-running the checks every ``interval_s``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from carina.infra.cluster.runner import NodeLabel, NodeReport

__all__ = ["Exporter", "render_metrics"]


def _registry_for(report: NodeReport) -> Any:
    from prometheus_client import CollectorRegistry, Gauge

    reg = CollectorRegistry()
    health = Gauge("carina_node_health", "1 for the node's current label", ["node", "label"], registry=reg)
    status = Gauge(
        "carina_check_status", "1 for each check's current status", ["node", "check", "status"], registry=reg
    )
    metric = Gauge("carina_check_metric", "figures measured by each check", ["node", "check", "metric"], registry=reg)
    for label in NodeLabel:
        health.labels(report.node, label.value).set(1 if report.label is label else 0)
    for result in report.results:
        status.labels(report.node, result.name, result.status.value).set(1)
        for name, value in result.metrics.items():
            metric.labels(report.node, result.name, name).set(float(value))
    return reg


def render_metrics(report: NodeReport) -> bytes:
    """The report in Prometheus' text exposition format."""
    from prometheus_client import generate_latest

    return bytes(generate_latest(_registry_for(report)))


class Exporter:
    """Serves the latest report over HTTP and refreshes it in the background."""

    def __init__(self, produce: Callable[[], NodeReport], *, interval_s: float = 300.0) -> None:
        self._produce = produce
        self._interval = interval_s
        self._report = produce()
        self._stop = threading.Event()
        self._server: Any = None

    @property
    def report(self) -> NodeReport:
        """The newest report."""
        return self._report

    def serve(self, host: str = "127.0.0.1", port: int = 9400) -> int:
        """Start the HTTP server and the refresh loop; return the bound port."""
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path not in ("/metrics", "/"):
                    self.send_error(404)
                    return
                body = render_metrics(exporter.report)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer((host, port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        threading.Thread(target=self._refresh, daemon=True).start()
        return int(self._server.server_address[1])

    def _refresh(self) -> None:
        while not self._stop.wait(self._interval):
            self._report = self._produce()

    def close(self) -> None:
        """Stop serving."""
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
