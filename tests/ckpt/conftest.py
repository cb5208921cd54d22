from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator

import pytest
from ckpt_state import s3_options


@pytest.fixture(params=["sync", "thread", "fork", "process"])
def writer(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1, a random port: real HTTP, real S3 protocol.

    One per test session, so the CLI's s3fs (whose instances s3fs caches per
    process, keyed without the endpoint read from the environment) always meets the same one.
    """
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def bucket_url(s3_endpoint: str) -> str:
    """A fresh bucket per test; the URL of a prefix inside it."""
    from carina.ckpt.remote import RemoteStore

    name = f"ckpt-{secrets.token_hex(4)}"
    RemoteStore(f"s3://{name}", s3_options(s3_endpoint)).fs.mkdir(name)
    return f"s3://{name}/run1"
