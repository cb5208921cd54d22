"""GPU-initiated gathers (CamGather) on device="cpu": the same ring, manager and engine as on CUDA."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from carina.core.errors import BackendUnavailable, ConfigError, IOEngineError
from carina.io import CamConfig, CamGather, IOConfig, IOEngine
from carina.io._cam import reference_rows
from carina.io._memops import memops_unavailable_reason
from carina.testing.io import MockBackend

torch = pytest.importorskip("torch")

ROW = 512
ROWS = 4096


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "rows.bin"
    np.random.default_rng(3).integers(0, 256, ROW * ROWS, dtype=np.uint8).tofile(path)
    return path


@pytest.mark.parametrize("backend", ["uring", "posix"])
def test_posted_requests_arrive_bit_exact_through_every_slot(data_file: Path, backend: str) -> None:
    rng = np.random.default_rng(11)
    with IOEngine(IOConfig(backend=backend, queue_depth=16)) as eng:
        h = eng.open(data_file, "r")
        cam = CamGather(eng, h, CamConfig(row_bytes=ROW, max_rows=64, slots=3, device="cpu"))
        dests = [torch.empty(64 * ROW, dtype=torch.uint8) for _ in range(3)]
        wanted = []
        tickets = []
        for i in range(10):  # more requests than slots: slots are reused
            ids = rng.integers(0, ROWS, 1 + i * 6)
            tickets.append(cam.post(torch.from_numpy(ids), dests[i % 3]))
            wanted.append(reference_rows(str(data_file), ids, ROW))
            if i >= 2:  # the ticket whose dest is reused next is checked before that
                j = i - 2
                cam.wait(tickets[j])
                got = dests[j % 3][: len(wanted[j])].numpy()
                assert np.array_equal(got, wanted[j]), f"request {j} differs"
        for j in (8, 9):
            cam.wait(tickets[j])
            assert np.array_equal(dests[j % 3][: len(wanted[j])].numpy(), wanted[j])
        cam.close()
        assert cam.stats["posted"] == cam.stats["served"] == 10
        assert [t.slot for t in tickets[:4]] == [1, 2, 0, 1]


def test_a_bad_row_fails_its_own_ticket_only(data_file: Path) -> None:
    with (
        IOEngine(IOConfig(queue_depth=8)) as eng,
        CamGather(eng, eng.open(data_file, "r"), CamConfig(row_bytes=ROW, max_rows=8, slots=2, device="cpu")) as cam,
    ):
        dest = torch.zeros(8 * ROW, dtype=torch.uint8)
        bad = cam.post(torch.tensor([1, ROWS + 5]), dest)
        with pytest.raises(IOEngineError, match="outside the file"):
            cam.host_wait(bad, timeout=10)
        good = cam.post(torch.tensor([7, 0, 7]), dest)
        cam.host_wait(good, timeout=10)
        assert np.array_equal(dest[: 3 * ROW].numpy(), reference_rows(str(data_file), np.array([7, 0, 7]), ROW))


def test_completion_words_are_written_in_sequence_order(data_file: Path) -> None:
    # On CUDA the copy stream is shared and each copy first waits for the caller's stream to pass
    # its post: a later request completed first would block an earlier one's completion word
    # behind a post that may itself sit behind a stream wait for that earlier request (a deadlock).
    mock = MockBackend(hold=True)  # the first request's read waits until release()
    cfg = CamConfig(row_bytes=ROW, max_rows=8, slots=3, device="cpu")
    with IOEngine(IOConfig(queue_depth=8), backend=mock) as eng, CamGather(eng, eng.open(data_file, "r"), cfg) as cam:
        dest = torch.zeros(8 * ROW, dtype=torch.uint8)
        first = cam.post(torch.tensor([7, 0]), dest)
        second = cam.post(torch.tensor([ROWS]), torch.zeros(8 * ROW, dtype=torch.uint8))  # fails without a read
        try:
            with pytest.raises(IOEngineError, match="request 2 not served within 1 s"):
                cam.host_wait(second, timeout=1)  # its outcome is known, but request 1 is not done
        finally:
            mock.release()
        cam.host_wait(first, timeout=10)
        with pytest.raises(IOEngineError, match="outside the file"):
            cam.host_wait(second, timeout=10)
        assert np.array_equal(dest[: 2 * ROW].numpy(), reference_rows(str(data_file), np.array([7, 0]), ROW))


def test_bad_arguments_and_closed_gather_are_refused(data_file: Path) -> None:
    with pytest.raises(ConfigError, match="row_bytes"):
        CamConfig(row_bytes=0, max_rows=4)
    with pytest.raises(ConfigError, match="device"):
        CamConfig(row_bytes=8, max_rows=4, device="tpu")
    before = threading.active_count()
    with IOEngine(IOConfig(queue_depth=4)) as eng:
        cam = CamGather(eng, eng.open(data_file, "r"), CamConfig(row_bytes=ROW, max_rows=4, device="cpu"))
        dest = torch.empty(4 * ROW, dtype=torch.uint8)
        with pytest.raises(ConfigError, match="int64"):
            cam.post(torch.tensor([1, 2], dtype=torch.int32), dest)
        with pytest.raises(ConfigError, match="1 to 4"):
            cam.post(torch.arange(5), dest)
        with pytest.raises(ConfigError, match="hold"):
            cam.post(torch.arange(4), dest[:100])
        cam.close()
        assert not cam._thread.is_alive()
        with pytest.raises(IOEngineError, match="closed"):
            cam.post(torch.arange(2), dest)
    assert threading.active_count() == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_mode_is_refused_with_a_reason_without_cuda(data_file: Path) -> None:
    assert memops_unavailable_reason() == "no CUDA device"
    with (
        IOEngine(IOConfig(queue_depth=4)) as eng,
        pytest.raises(BackendUnavailable, match="stream memory operations: no CUDA device"),
    ):
        CamGather(eng, eng.open(data_file, "r"), CamConfig(row_bytes=ROW, max_rows=4, device="cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_posted_requests_release_the_stream(data_file: Path) -> None:
    rng = np.random.default_rng(5)
    with (
        IOEngine(IOConfig(queue_depth=16)) as eng,
        CamGather(eng, eng.open(data_file, "r"), CamConfig(row_bytes=ROW, max_rows=32, slots=2, device="cuda")) as cam,
    ):
        assert eng._staging is not None and eng._staging.pinned  # made here, not on the manager thread
        for _ in range(6):
            ids = rng.integers(0, ROWS, 32)
            dest = torch.empty(32 * ROW, dtype=torch.uint8, device="cuda")
            t = cam.post(torch.from_numpy(ids).cuda(), dest)
            cam.wait(t)
            cam.host_wait(t, timeout=10)  # a stuck request fails here, not inside a blocking CUDA copy
            got = dest.cpu().numpy()  # runs after the stream's wait
            assert np.array_equal(got, reference_rows(str(data_file), ids, ROW))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_waiting_on_the_copy_stream_itself_is_refused(data_file: Path) -> None:
    with (
        IOEngine(IOConfig(queue_depth=4)) as eng,
        CamGather(eng, eng.open(data_file, "r"), CamConfig(row_bytes=ROW, max_rows=4, slots=2, device="cuda")) as cam,
    ):
        assert cam._copy_stream.priority < torch.cuda.Stream().priority  # a pool apart from ordinary streams
        dest = torch.empty(4 * ROW, dtype=torch.uint8, device="cuda")
        t = cam.post(torch.arange(4, device="cuda"), dest)
        with pytest.raises(ConfigError, match="copy stream"):
            cam.wait(t, stream=cam._copy_stream)  # it would wait ahead of the copy that releases it
        cam.wait(t)
        cam.host_wait(t, timeout=10)
        assert np.array_equal(dest.cpu().numpy(), reference_rows(str(data_file), np.arange(4), ROW))
