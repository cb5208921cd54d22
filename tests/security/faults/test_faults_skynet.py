"""SkyNet: float32 matches a float64 reference, fixed-point emulation is deterministic, bad input is clear."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from carina.core.errors import ModelFormatError
from carina.security.faults.metrics import iou, summarize, wilson
from carina.security.faults.skynet import Numeric, SkyNet, decode_boxes, load_image, load_skynet


def test_float_matches_float64_reference(stages, images) -> None:
    ref = SkyNet(stages, numeric=Numeric.FLOAT, dtype=torch.float64)(images[:1])
    out = SkyNet(stages, numeric=Numeric.FLOAT, dtype=torch.float32)(images[:1])
    assert (out.double() - ref).abs().max().item() < 1e-3
    assert iou(decode_boxes(out), decode_boxes(ref)).min().item() > 0.999


def test_decoded_boxes_are_in_frame_coordinates(stages, images) -> None:
    boxes = decode_boxes(SkyNet(stages, numeric=Numeric.FLOAT, dtype=torch.float32)(images))
    assert boxes.shape == (2, 5)
    assert ((boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])).all()
    assert (boxes[:, :4] > -50).all() and (boxes[:, [0, 2]] < 700).all() and (boxes[:, [1, 3]] < 400).all()


def test_bad_inputs(tmp_path: Path) -> None:
    bad = tmp_path / "w.h5"
    bad.write_bytes(b"not hdf5")
    with pytest.raises(ModelFormatError, match="HDF5"):
        load_skynet(bad)
    img = tmp_path / "x.jpg"
    img.write_bytes(b"\xff\xd8garbage")
    with pytest.raises(ModelFormatError, match="cannot read image"):
        load_image(img)


def test_metrics() -> None:
    a = torch.tensor([[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 10.0]])
    b = torch.tensor([[0.0, 0.0, 10.0, 10.0], [5.0, 0.0, 15.0, 10.0]])
    assert iou(a, b).tolist() == pytest.approx([1.0, 1 / 3])
    s = summarize([1.0, 0.0, 1.0, 0.0])
    assert (s.loss, s.frac_below_half, s.n) == (0.5, 0.5, 4)
    assert s.loss_ci[0] < 0.5 < s.loss_ci[1]
    lo, hi = wilson(0, 10)
    assert lo == 0.0 and 0.2 < hi < 0.35
