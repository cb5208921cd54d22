from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from carina.core.errors import BackendUnavailable
from carina.infra.provision.config import ProvisionConfig
from carina.infra.provision.service import Provisioner
from carina.testing.provision import GuestKernel, build_golden_image, build_initramfs, find_guest_kernel


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def config(tmp_path: Path) -> ProvisionConfig:
    return ProvisionConfig(
        state_dir=tmp_path / "state", nbd_port=free_port(), iscsi_port=free_port(), http_port=free_port()
    )


@pytest.fixture
def prov(config: ProvisionConfig) -> Iterator[Provisioner]:
    p = Provisioner(config)
    p.create_project("lab", token="lab-token")
    p.create_project("other", token="other-token")
    yield p
    p.close(stop_daemons=True)


@pytest.fixture(scope="session")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_golden_image(tmp_path_factory.mktemp("golden") / "golden.raw", label="golden-1", size_mib=32)


@pytest.fixture(scope="session")
def guest(tmp_path_factory: pytest.TempPathFactory) -> tuple[GuestKernel, Path]:
    try:
        kernel = find_guest_kernel()
    except BackendUnavailable as exc:
        pytest.skip(f"no guest kernel: {exc}")
    return kernel, build_initramfs(tmp_path_factory.mktemp("guest") / "initrd.gz", kernel)
