"""SkyNet (DAC-SDC 2019 winner, arXiv 1906.10327) in PyTorch, written from its published architecture.

Input 3x160x320 (RGB in [0, 1]); six depthwise-separable bundles (3x3 depthwise +
BN + ReLU6, 1x1 pointwise + BN + ReLU6) with 48, 96, 192, 384, 512 channels and
2x2 max pools; the 192-channel map is reorganised (stride 2, 768 channels) and
concatenated with the 512-channel map (1280 channels) -> bundle to 96 -> 1x1 conv
to 2 anchors x (x, y, w, h, conf) on a 20x40 grid. One object per image: the
cell/anchor with the highest confidence; boxes in 640x360 pixels.

:class:`SkyNet` runs as an explicit list of convolution *stages* so that a
campaign can start from cached activations before the first faulted stage, and
in one of two numeric modes: float (BN folded, any dtype) or the accelerator's
fixed-point types (see :mod:`carina.security.faults.fixedpoint`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from carina.core.errors import ModelFormatError
from carina.security.faults import kernels
from carina.security.faults.fixedpoint import ACCUMULATOR, FEATURE, WEIGHT

if TYPE_CHECKING:
    import torch

__all__ = ["ANCHORS", "Numeric", "SkyNet", "Stage", "decode_boxes", "load_image", "load_skynet"]

ANCHORS = ((1.4940052559648322, 2.3598481287086823), (4.0113013115312155, 5.760873975661669))
GRID_H, GRID_W = 20, 40
IN_H, IN_W = 160, 320
OUT_W, OUT_H = 640, 360
BUNDLES: tuple[tuple[str, int, int], ...] = (
    ("model_p1.0", 3, 48),
    ("model_p1.2", 48, 96),
    ("model_p1.4", 96, 192),
    ("model_p2.1", 192, 384),
    ("model_p2.2", 384, 512),
    ("model_p3.0", 1280, 96),
)


class Numeric(enum.Enum):
    """How the network computes."""

    FLOAT = "float"  # BN folded, float32 or float64
    FIXED = "fixed"  # the accelerator's ap_fixed types (features 9,3; accumulators 12,4; weights 11,4)


@dataclass
class Stage:
    """One convolution as the accelerator runs it: BN folded into weight and bias.

    ``after`` is what follows the convolution: ``relu6`` (+ optional ``pool``), or
    nothing for the last 1x1 layer.
    """

    name: str
    weight: torch.Tensor
    bias: torch.Tensor | None
    groups: int
    relu6: bool = True
    pool_after: bool = False
    macs: int = 0
    out_shape: tuple[int, int, int] = (0, 0, 0)


def _fold(h5: Any, conv: str, bn: str) -> tuple[Any, Any]:
    import numpy as np

    w = np.asarray(h5[f"{conv}.weight"], dtype=np.float64)
    gamma, beta = np.asarray(h5[f"{bn}.weight"], np.float64), np.asarray(h5[f"{bn}.bias"], np.float64)
    mean, var = np.asarray(h5[f"{bn}.running_mean"], np.float64), np.asarray(h5[f"{bn}.running_var"], np.float64)
    scale = gamma / np.sqrt(var + 1e-5)
    return w * scale[:, None, None, None], beta - mean * scale


def load_skynet(path: str | Path) -> list[Stage]:
    """Read ``dac.weights`` (an HDF5 state dict) and fold BN into 13 stages (float64).

    Raises:
        ModelFormatError: Not HDF5, or a tensor is missing or misshapen.
    """
    import h5py
    import torch

    try:
        h5 = h5py.File(path, "r")
    except OSError as exc:
        raise ModelFormatError(f"not an HDF5 weights file: {exc}", file=str(path)) from exc
    stages: list[Stage] = []
    h, w = IN_H, IN_W
    try:
        with h5:
            for i, (prefix, cin, cout) in enumerate(BUNDLES):
                dw_w, dw_b = _fold(h5, f"{prefix}.0", f"{prefix}.1")
                pw_w, pw_b = _fold(h5, f"{prefix}.3", f"{prefix}.4")
                if dw_w.shape != (cin, 1, 3, 3) or pw_w.shape != (cout, cin, 1, 1):
                    raise ModelFormatError(f"{prefix}: unexpected shapes {dw_w.shape} {pw_w.shape}", file=str(path))
                pool = i < 3
                stages.append(Stage(f"dw{i + 1}.dw", torch.from_numpy(dw_w), torch.from_numpy(dw_b), cin))
                stages.append(
                    Stage(f"dw{i + 1}.pw", torch.from_numpy(pw_w), torch.from_numpy(pw_b), 1, pool_after=pool)
                )
            last = torch.from_numpy(h5["model_p3.1.weight"][()].astype("float64"))
    except KeyError as exc:
        raise ModelFormatError(f"missing tensor {exc}", file=str(path)) from exc
    stages.append(Stage("pw7", last, None, 1, relu6=False))
    for s in stages:
        cout, cin_g, kh, kw = s.weight.shape
        if s.name == "dw4.dw":
            h, w = h // 2, w // 2  # model_p2 starts with a pool of the 192-channel map
        s.out_shape = (cout, h, w)
        s.macs = cout * cin_g * kh * kw * h * w
        if s.pool_after and s.name != "dw3.pw":
            h, w = h // 2, w // 2
    return stages


def reorg(x: torch.Tensor, stride: int = 2) -> torch.Tensor:
    """Space-to-depth as in YOLOv2/SkyNet (channel order: offset-major, then input channel)."""
    b, c, h, w = x.shape
    x = x.view(b, c, h // stride, stride, w // stride, stride).transpose(3, 4).contiguous()
    x = x.view(b, c, (h // stride) * (w // stride), stride * stride).transpose(2, 3).contiguous()
    x = x.view(b, c, stride * stride, h // stride, w // stride).transpose(1, 2).contiguous()
    return x.view(b, stride * stride * c, h // stride, w // stride)


@dataclass
class SkyNet:
    """The stage list plus a forward that can start at any stage and be hooked per stage.

    ``hooks`` maps a stage index to ``fn(index, acc, x) -> acc``, called on the
    accumulator output ``acc`` of that stage (``x`` is the stage's input) (before bias/activation in fixed mode,
    after the convolution in float mode) -- where timing faults strike. A hook may return
    ``acc`` changed in place; it must not keep it (the stage rounds it in place afterwards).
    """

    stages: list[Stage]
    numeric: Numeric = Numeric.FIXED
    dtype: Any = None
    hooks: dict[int, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        import torch

        self.dtype = self.dtype or torch.float64
        fixed = self.numeric is Numeric.FIXED
        wt = [WEIGHT.quantize(s.weight) if fixed else s.weight for s in self.stages]
        self._w = [w.to(self.dtype) for w in wt]
        self._b = [None if s.bias is None else s.bias.to(self.dtype) for s in self.stages]
        if fixed:
            self._b = [None if b is None else WEIGHT.quantize(b) for b in self._b]
        # In fixed mode every product is a multiple of 2**-13; a sum whose partial sums
        # stay below 2**24 of those steps is exact in float32 (so independent of summation
        # order, device and batch). Stages that could exceed that bound sum in float64.
        # Stages that could exceed that bound sum in float64, or, for 1x1 stages, as float32
        # sums over input-channel blocks each below the bound (exact), added in float64.
        self._wide = [fixed and self.dtype == torch.float32 and _bound(w) >= 2**24 for w in wt]
        self._split = [exact_blocks(w) if wide else None for w, wide in zip(wt, self._wide, strict=True)]

    def to(self, device: Any) -> SkyNet:
        """Move the weights to ``device`` (in place); returns self."""
        self._w = [w.to(device) for w in self._w]
        self._b = [None if b is None else b.to(device) for b in self._b]
        return self

    @property
    def macs(self) -> list[int]:
        """MACs per stage."""
        return [s.macs for s in self.stages]

    def run(
        self,
        x: torch.Tensor | None,
        *,
        start: int = 0,
        state: dict[str, torch.Tensor] | None = None,
        keep: tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, dict[int, dict[str, torch.Tensor]]]:
        """Run stages ``start..`` on input ``x`` (or on ``state`` cached before ``start``).

        Args:
            x: Images (B, 3, 160, 320) when ``start`` is 0; ignored otherwise.
            start: First stage to run.
            state: ``{"x": ..., "p1": ...}`` as returned for ``keep == start``.
            keep: Stages before which to return the state (for caching).

        Returns:
            The raw output (B, 10, 20, 40) and ``{stage: state}`` for each kept stage.
        """
        import torch

        p1 = None
        if state is not None:
            cur, p1 = state["x"], state.get("p1")
        else:
            assert x is not None, "x or state is required"
            cur = x.to(self.dtype)
            if self.numeric is Numeric.FIXED:
                cur = FEATURE.quantize(cur)
        kept: dict[int, dict[str, torch.Tensor]] = {}
        for i in range(start, len(self.stages)):
            if i in keep:
                kept[i] = {"x": cur} if p1 is None else {"x": cur, "p1": p1}
            s = self.stages[i]
            if s.name == "dw4.dw":
                p1 = cur
                cur = _pool2(cur)
            if s.name == "dw6.dw":
                cur = torch.cat([reorg(p1), cur], 1)  # type: ignore[arg-type]
            cur = self._stage(i, cur, pool=s.pool_after and s.name != "dw3.pw")
        return cur, kept

    def _stage(self, i: int, x: torch.Tensor, *, pool: bool = False) -> torch.Tensor:
        """Stage ``i`` on input ``x``, then a 2x2 max pool when ``pool``."""
        s = self.stages[i]
        # fixed point on the CPU: fused numba kernels, the same bits as the torch ops (test_faults_kernels)
        fused = self.numeric is Numeric.FIXED and kernels.applies(x)
        if fused and s.groups > 1 and not self._wide[i]:
            acc = kernels.depthwise_quantized_cpu(x, self._w[i], ACCUMULATOR)
        else:
            acc = self._conv(i, x)
            if fused:
                acc = kernels.quantize_cpu(acc, ACCUMULATOR, self.dtype, inplace=True)  # acc is fresh
            elif self.numeric is Numeric.FIXED:
                acc = ACCUMULATOR.quantize(acc).to(self.dtype)
        if i in self.hooks:
            acc = self.hooks[i](i, acc, x)
        if fused and s.relu6:
            return kernels.quantize_cpu(acc, FEATURE, self.dtype, bias=self._b[i], relu6=True, inplace=True, pool=pool)
        if self._b[i] is not None:
            acc = acc + self._b[i].view(1, -1, 1, 1)  # type: ignore[union-attr]
        if s.relu6:
            acc = acc.clamp_(0.0, 6.0)
        out = FEATURE.quantize(acc) if self.numeric is Numeric.FIXED and s.relu6 else acc
        return _pool2(out) if pool else out

    def _conv(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Stage ``i``'s convolution: exact float32 channel blocks, float64 where float32 could round, else as is."""
        w, split = self._w[i], self._split[i]
        if split is not None:
            return blocked_matmul(x, w, split)
        return conv(x.double(), w.double()) if self._wide[i] else conv(x, w)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The raw output of a full run."""
        return self.run(x)[0]


def _bound(w: torch.Tensor) -> float:
    """Largest sum of |weight codes| x |feature code| of any output, in units of 2**-13."""
    codes = WEIGHT.codes(w).abs().reshape(w.shape[0], -1).sum(1)
    return float(codes.max()) * abs(FEATURE.qmin)


def _pool2(x: torch.Tensor) -> torch.Tensor:
    """2x2 max pool, stride 2, as two maxima of strided views (a max is exact: the values of ``F.max_pool2d``)."""
    import torch

    top = torch.maximum(x[:, :, 0::2, 0::2], x[:, :, 0::2, 1::2])
    return torch.maximum(top, torch.maximum(x[:, :, 1::2, 0::2], x[:, :, 1::2, 1::2]), out=top)


def exact_blocks(w: torch.Tensor, limit: float = 2.0**24) -> list[tuple[int, int]] | None:
    """Input-channel blocks of a 1x1 fixed-point weight ``w`` whose sums are exact in float32.

    A block is exact when, for every output, the sum over its channels of |weight code| x
    the largest feature code stays below ``limit`` steps of 2**-13 (see :func:`_bound`).
    ``w`` may be a sum of weights (integer codes of any size). None when ``w`` is not 1x1
    or one channel alone exceeds the bound.
    """
    if tuple(w.shape[2:]) != (1, 1):
        return None
    cost = (w.double().reshape(w.shape[0], -1) * (1 << WEIGHT.frac_bits)).abs() * abs(FEATURE.qmin)
    blocks, lo, run = [], 0, cost[:, 0] * 0
    for c in range(cost.shape[1]):
        if float((run + cost[:, c]).max()) >= limit:
            if c == lo:
                return None
            blocks.append((lo, c))
            lo, run = c, cost[:, c] * 0
        run = run + cost[:, c]
    if float(run.max()) >= limit:
        return None
    return [*blocks, (lo, cost.shape[1])]


def blocked_matmul(x: torch.Tensor, w: torch.Tensor, blocks: list[tuple[int, int]]) -> torch.Tensor:
    """A 1x1 convolution as float32 products over channel ``blocks``, summed in float64 (one block: float32).

    Exact (hence the same bits as a float64 product) when ``blocks`` come from :func:`exact_blocks`.
    """
    import torch

    b, c, h, wd = x.shape
    cout = w.shape[0]
    xs, ws = x.reshape(b, c, h * wd), w.reshape(cout, c)
    parts = [torch.matmul(ws[:, lo:hi].contiguous(), xs[:, lo:hi]) for lo, hi in blocks]
    if len(parts) == 1:
        return parts[0].view(b, cout, h, wd)
    acc = parts[0].double()
    for part in parts[1:]:
        acc += part
    return acc.view(b, cout, h, wd)


def conv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """SkyNet's convolutions without cuDNN/oneDNN algorithm choices.

    1x1 as a matrix product, 3x3 depthwise (padding 1) as nine shifted multiply-adds:
    plain products and sums, so exact inputs give the same bits on CPU and CUDA.
    """
    import torch
    import torch.nn.functional as F

    b, c, h, wd = x.shape
    cout, cin_g, kh, kw = w.shape
    if (kh, kw) == (1, 1) and cin_g == c:
        return torch.matmul(w.view(cout, c), x.reshape(b, c, h * wd)).view(b, cout, h, wd)
    if (kh, kw) == (3, 3) and cin_g == 1 and cout == c:
        xp = F.pad(x, (1, 1, 1, 1))
        k = w.view(1, c, 9, 1, 1)
        acc = xp[:, :, 0:h, 0:wd] * k[:, :, 0]
        for t in range(1, 9):
            dy, dx = divmod(t, 3)
            acc.addcmul_(xp[:, :, dy : dy + h, dx : dx + wd], k[:, :, t])
        return acc
    raise ValueError(f"unsupported convolution {tuple(w.shape)} on input {tuple(x.shape)}")


def decode_boxes(out: torch.Tensor) -> torch.Tensor:
    """One box per image from SkyNet's raw output: (B, 5) = x1, y1, x2, y2 (640x360 pixels), confidence."""
    import torch

    b = out.shape[0]
    o = out.detach().cpu().to(torch.float64).view(b, 2, 5, GRID_H, GRID_W)
    conf = torch.sigmoid(o[:, :, 4]).reshape(b, -1)
    best = torch.argmax(conf, dim=1)
    anchor, cell = best // (GRID_H * GRID_W), best % (GRID_H * GRID_W)
    gy, gx = cell // GRID_W, cell % GRID_W
    sel = o[torch.arange(b), anchor, :, gy, gx]  # (B, 5)
    anchors = torch.tensor(ANCHORS, dtype=torch.float64)[anchor]
    cx = (torch.sigmoid(sel[:, 0]) + gx) / GRID_W
    cy = (torch.sigmoid(sel[:, 1]) + gy) / GRID_H
    w = torch.exp(torch.clamp(sel[:, 2], max=20.0)) * anchors[:, 0] / GRID_W
    h = torch.exp(torch.clamp(sel[:, 3], max=20.0)) * anchors[:, 1] / GRID_H
    boxes = torch.stack([(cx - w / 2) * OUT_W, (cy - h / 2) * OUT_H, (cx + w / 2) * OUT_W, (cy + h / 2) * OUT_H], 1)
    return torch.cat([boxes, conf.gather(1, best[:, None])], 1)


def load_image(path: str | Path) -> torch.Tensor:
    """An image as SkyNet sees it: RGB resized to 320x160 (bilinear), values in [0, 1], shape (3, 160, 320)."""
    import numpy as np
    import torch
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            arr = np.asarray(im.convert("RGB").resize((IN_W, IN_H), Image.Resampling.BILINEAR), dtype=np.float32)
    except (OSError, UnidentifiedImageError) as exc:
        raise ModelFormatError(f"cannot read image: {exc}", file=str(path)) from exc
    return torch.from_numpy(arr / 255.0).permute(2, 0, 1).contiguous()
