"""SkyNet weights and images from the shared data (never copied into the repo)."""

from __future__ import annotations

from pathlib import Path

import pytest

from carina.testing import shared_data


@pytest.fixture(scope="session")
def skynet_dir() -> Path:
    return shared_data("skynet")


@pytest.fixture(scope="session")
def stages(skynet_dir: Path):
    from carina.security.faults.skynet import load_skynet

    return load_skynet(skynet_dir / "dac.weights")


@pytest.fixture(scope="session")
def images(skynet_dir: Path):
    import torch

    from carina.security.faults.skynet import load_image

    return torch.stack([load_image(skynet_dir / "images" / f"{i}.jpg") for i in (0, 5)])
