"""carina.memory.mapped: a device tensor over pinned host memory, and the CPU's in-place view."""

import pytest
import torch

from carina.memory.mapped import _Mapped, device_view, mapped_view


def test_cpu_reads_host_memory_in_place():
    host = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert device_view(host, "cpu") is host


def test_no_view_without_a_mappable_device():
    host = torch.ones(3, 4)
    assert device_view(host, "cuda") is None  # no CUDA to map into, and pageable memory is not mapped
    with pytest.raises(ValueError, match="pinned"):
        mapped_view(host, torch.device("cuda"))


def test_interface_gets_past_torchs_parser_on_the_cpu():
    # The H200 lane (session 8) lost the zero-copy peer to "TypeError: the read only flag is not
    # supported": torch checks the interface's read-only flag before it needs a device. Without a GPU
    # the parse must get as far as CUDA itself (a RuntimeError), never stop at the interface (TypeError).
    host = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    mapped = _Mapped(host)
    assert mapped.__cuda_array_interface__["shape"] == (3, 16)
    assert mapped.__cuda_array_interface__["data"] == (host.data_ptr(), False)
    if torch.cuda.is_available():
        view = mapped_view(host.pin_memory(), torch.device("cuda"))
        assert view.shape == host.shape
        return
    with pytest.raises(RuntimeError):
        torch.as_tensor(mapped, device="cuda")


@pytest.mark.gpu
def test_mapped_view_aliases_pinned_rows():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    host = torch.randn(1000, 64).pin_memory()
    view = device_view(host, "cuda")
    assert view is not None and view.device.type == "cuda" and view.data_ptr() == host.data_ptr()
    ids = torch.tensor([999, 0, 17, 17, 512], device="cuda")
    assert torch.equal(view.index_select(0, ids).cpu(), host[ids.cpu()])
    host[17] = 3.0  # the view aliases host memory: a write on the host is what the GPU reads next
    torch.cuda.synchronize()
    assert torch.equal(view[17].cpu(), host[17])


@pytest.mark.gpu
def test_rows_of_nan_are_mapped_too():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    host = torch.full((4, 8), float("nan")).pin_memory()  # NaN != NaN: the mapping check compares bytes
    view = mapped_view(host, torch.device("cuda"))
    assert view.data_ptr() == host.data_ptr() and bool(view.isnan().all())
