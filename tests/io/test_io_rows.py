"""RowGather: one post/wait interface over the GPU-initiated (CamGather) and host-initiated paths."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import numpy as np
import pytest

from carina.core.errors import BackendUnavailable, ConfigError, IOEngineError
from carina.io import IOConfig, IOEngine, RowGather, RowGatherConfig, choose_gather_path
from carina.io._cam import reference_rows
from carina.io._rows import gather_path_report
from carina.testing.io import MockBackend

torch = pytest.importorskip("torch")

ROW = 512
ROWS = 1000  # not a multiple of anything the engine rounds to: the last row ends the file


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "rows.bin"
    np.random.default_rng(7).integers(0, 256, ROW * ROWS, dtype=np.uint8).tofile(path)
    return path


@pytest.mark.parametrize("path", ["gpu", "host"], ids=["gpu_initiated", "host_initiated"])
@pytest.mark.parametrize("backend", ["uring", "posix"])
def test_both_paths_return_the_files_rows_bit_exact(data_file: Path, path: str, backend: str) -> None:
    requests = [
        np.array([ROWS - 1, 0, ROWS - 1, 5, 5, 999]),  # duplicates, the file's last row
        np.array([700, 3, 250, 1, 998, 42, 17]),  # out of order
        np.arange(ROWS - 64, ROWS),  # adjacent rows up to the end
        np.array([9]),
    ]
    cfg = RowGatherConfig(row_bytes=ROW, max_rows=64, slots=2, device="cpu", path=path)
    with IOEngine(IOConfig(backend=backend, queue_depth=16)) as eng, RowGather(eng, eng.open(data_file), cfg) as g:
        assert g.path == path
        dests = [torch.full((64, ROW), 0xAB, dtype=torch.uint8) for _ in requests]
        tickets = [g.post(torch.from_numpy(ids), d) for ids, d in zip(requests, dests, strict=True)]
        for ids, d, t in zip(requests, dests, tickets, strict=True):
            g.wait(t)
            assert t.rows == len(ids)
            assert np.array_equal(d[: len(ids)].reshape(-1).numpy(), reference_rows(str(data_file), ids, ROW))
            assert (d[len(ids) :] == 0xAB).all()  # nothing written past the request's rows
        g.host_wait(tickets[-1])  # a ticket waited for already returns at once
    assert g.stats["posted"] == g.stats["served"] == len(requests)


@pytest.mark.parametrize("path", ["gpu", "host"], ids=["gpu_initiated", "host_initiated"])
def test_a_failed_request_raises_at_its_wait_naming_it(data_file: Path, path: str) -> None:
    cfg = RowGatherConfig(row_bytes=ROW, max_rows=8, slots=2, device="cpu", path=path)
    with IOEngine(IOConfig(queue_depth=8)) as eng, RowGather(eng, eng.open(data_file), cfg) as g:
        dest = torch.zeros(8, ROW, dtype=torch.uint8)
        good = g.post(torch.tensor([4, 2]), dest)
        bad = g.post(torch.tensor([1, ROWS]), torch.zeros(8, ROW, dtype=torch.uint8))  # one past the last row
        g.wait(good)
        with pytest.raises(IOEngineError, match=r"gather request 2 \(2 rows\) failed: row id outside the file") as e:
            g.wait(bad)
        assert e.value.context == {"path": str(data_file), "offset": ROWS * ROW}
        assert np.array_equal(dest[:2].reshape(-1).numpy(), reference_rows(str(data_file), np.array([4, 2]), ROW))


def test_an_engine_error_fails_its_own_request_on_the_host_path(data_file: Path) -> None:
    failures = [OSError(errno.EIO, "injected")]

    def script(op: object) -> OSError | None:
        return failures.pop() if failures else None

    mock = MockBackend(script=script)
    cfg = RowGatherConfig(row_bytes=ROW, max_rows=4, slots=2, device="cpu", path="host")
    with IOEngine(IOConfig(queue_depth=4), backend=mock) as eng, RowGather(eng, eng.open(data_file), cfg) as g:
        bad = g.post(torch.tensor([3]), torch.zeros(1, ROW, dtype=torch.uint8))
        with pytest.raises(IOEngineError, match=r"gather request 1 \(1 rows\) failed: gather row failed: errno 5"):
            g.host_wait(bad, timeout=10)
        dest = torch.zeros(1, ROW, dtype=torch.uint8)
        g.wait(g.post(torch.tensor([3]), dest))  # the next request is unaffected
        assert np.array_equal(dest.reshape(-1).numpy(), reference_rows(str(data_file), np.array([3]), ROW))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU machine's choice")
def test_auto_takes_the_host_path_without_cuda_and_says_why(data_file: Path) -> None:
    with IOEngine(IOConfig(queue_depth=4)) as eng:
        g = RowGather(eng, eng.open(data_file), RowGatherConfig(row_bytes=ROW, max_rows=4, device="cpu"))
        g.close()
    assert g.path == "host" and g.selection.skipped == {}
    report = gather_path_report()
    assert report["device"] == "cpu" and report["path"] == "host"
    assert report["why"].startswith("host-initiated for a cpu destination; ")
    assert "io_cam_h200.json (session 7)" in report["why"]
    with pytest.raises(BackendUnavailable) as e:
        choose_gather_path("auto", device="cuda")  # neither path can fill a CUDA tensor here
    assert "host: no CUDA device for a cuda destination" in str(e.value)
    assert "gpu: CUDA stream memory operations unavailable: no CUDA device" in str(e.value)
    with pytest.raises(BackendUnavailable, match="no CUDA device"):
        RowGather(None, None, RowGatherConfig(row_bytes=ROW, max_rows=4, device="cuda", path="gpu"))


@pytest.mark.parametrize("path", ["gpu", "host"], ids=["gpu_initiated", "host_initiated"])
def test_close_leaks_no_thread_and_refuses_new_requests(data_file: Path, path: str) -> None:
    before = threading.active_count()
    with IOEngine(IOConfig(backend="posix", workers=2, queue_depth=4)) as eng:
        cfg = RowGatherConfig(row_bytes=ROW, max_rows=4, slots=2, device="cpu", path=path)
        g = RowGather(eng, eng.open(data_file), cfg)
        g.post(torch.tensor([1, 2]), torch.empty(4, ROW, dtype=torch.uint8))  # posted, never waited for
        g.close()
        g.close()  # idempotent
        with pytest.raises(IOEngineError, match="closed"):
            g.post(torch.tensor([1]), torch.empty(4, ROW, dtype=torch.uint8))
        assert eng.staging_arena().used == 0  # the host path gave its staging back
    assert threading.active_count() == before


def test_bad_config_is_refused() -> None:
    with pytest.raises(ConfigError, match="path must be one of auto, gpu, host"):
        RowGatherConfig(row_bytes=ROW, max_rows=4, path="fastest")
    with pytest.raises(ConfigError, match="max_rows"):
        RowGatherConfig(row_bytes=ROW, max_rows=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_auto_takes_the_host_path_for_a_cuda_destination_and_gpu_is_one_argument_away(data_file: Path) -> None:
    rng = np.random.default_rng(5)
    with IOEngine(IOConfig(queue_depth=16)) as eng:
        with RowGather(eng, eng.open(data_file), RowGatherConfig(row_bytes=ROW, max_rows=32, slots=2)) as g:
            assert g.path == "host" and g.selection.skipped == {}
        assert gather_path_report()["path"] == "host"
        cfg = RowGatherConfig(row_bytes=ROW, max_rows=32, slots=2, path="gpu")
        with RowGather(eng, eng.open(data_file), cfg) as g:
            assert g.path == "gpu"
            for _ in range(4):
                ids = rng.integers(0, ROWS, 32)
                dest = torch.empty(32, ROW, dtype=torch.uint8, device="cuda")
                ticket = g.post(torch.from_numpy(ids).cuda(), dest)
                g.wait(ticket)
                g.host_wait(ticket, timeout=10)  # a stuck request fails here, not inside a blocking CUDA copy
                assert np.array_equal(dest.cpu().reshape(-1).numpy(), reference_rows(str(data_file), ids, ROW))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_host_path_fills_cuda_destinations_posted_from_a_side_stream(data_file: Path) -> None:
    rng = np.random.default_rng(6)
    side = torch.cuda.Stream()
    cfg = RowGatherConfig(row_bytes=ROW, max_rows=32, slots=2, path="host")
    with IOEngine(IOConfig(queue_depth=16)) as eng, RowGather(eng, eng.open(data_file), cfg) as g:
        assert g.path == "host"
        requests = [rng.integers(0, ROWS, 32) for _ in range(5)]
        dests = [torch.empty(32, ROW, dtype=torch.uint8, device="cuda") for _ in requests]
        tickets = []
        for ids, d in zip(requests, dests, strict=True):
            with torch.cuda.stream(side):  # the host reads the ids from the stream that made them
                tickets.append(g.post(torch.from_numpy(ids).cuda(), d))
        for ids, d, t in zip(requests, dests, tickets, strict=True):
            g.wait(t)  # the copy is queued on the current stream, before .cpu() below
            g.host_wait(t, timeout=10)
            assert np.array_equal(d.cpu().reshape(-1).numpy(), reference_rows(str(data_file), ids, ROW))
