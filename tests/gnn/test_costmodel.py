import math

import pytest

from carina.core.errors import CapacityError, ConfigError
from carina.gnn.costmodel import (
    MachineSpec,
    Overlap,
    WorkloadProfile,
    best_gap_pages,
    disk_seconds,
    hit_rate,
    predict,
    predict_in_memory,
    recommend,
)
from carina.gnn.hostpath import HostGather


def _work(**kw):
    base = dict(
        num_nodes=1_000_000,
        row_bytes=4096,
        row_stride=4096,
        batch_size=1000,
        batches_per_epoch=100,
        unique_per_batch=100_000.0,
        sample_s=0.01,
        compute_s=0.02,
        hotness_curve=[0.0, 1.0],
    )
    base.update(kw)
    return WorkloadProfile(**base)


def _machine(**kw):
    base = dict(
        ssd_count=1,
        ssd_read_gbps=4.096,
        ssd_iops=1_000_000.0,
        pcie_gbps=40.96,
        host_gather_gbps=10.0,
        disk_cost="overlapped",
    )
    base.update(kw)
    return MachineSpec(**base)


def test_disk_bound_closed_form():
    # 100k misses of one page each over 1M rows: 10% have a missed predecessor, so 90k IOs
    # at 1M IOPS = 0.09 s; 409.6 MB at 4.096 GB/s = 0.1 s: bandwidth bound
    p = predict(_machine(), _work(), gpu_cache_rows=0, host_cache_rows=0)
    assert p.disk_ios == pytest.approx(90_000)
    assert p.stages["disk"] == pytest.approx(0.1)
    assert p.stages["transfer"] == pytest.approx(100_000 * 4096 / 40.96e9)
    assert p.bottleneck == "disk" and p.batch_s == pytest.approx(0.1)
    assert p.epoch_s == pytest.approx(10.0)
    two = predict(_machine(ssd_count=2), _work(), gpu_cache_rows=0, host_cache_rows=0)
    assert two.stages["disk"] == pytest.approx(0.05)


def test_additive_disk_cost_closed_form():
    # 500k IOPS at 4.096 GB/s: a 4 KiB read takes 2 us, 1 us of it the page's transfer, so a request's
    # own cost is 1 us. The same 90k IOs and 409.6 MB: 0.09 s of requests + 0.1 s of transfer
    m = _machine(disk_cost="additive", ssd_iops=500_000.0)
    p = predict(m, _work(), gpu_cache_rows=0, host_cache_rows=0)
    assert p.stages["disk"] == pytest.approx(0.19)
    two = predict(
        _machine(disk_cost="additive", ssd_iops=500_000.0, ssd_count=2), _work(), gpu_cache_rows=0, host_cache_rows=0
    )
    assert two.stages["disk"] == pytest.approx(0.095)  # two SSDs halve both terms
    # the bus caps the transfer term only: 8 SSDs behind 10 GB/s
    eight = _machine(disk_cost="additive", ssd_iops=500_000.0, ssd_count=8, bus_limit_gbps=10.0)
    assert disk_seconds(eight, 80_000, 1_000_000) == pytest.approx(0.01 + 4.096e9 / 10e9)
    assert MachineSpec().disk_cost == "additive"
    with pytest.raises(ConfigError, match="disk_cost"):
        _machine(disk_cost="fast")


@pytest.mark.parametrize("form", ["additive", "overlapped"])
def test_both_disk_forms_meet_the_calibrated_rates(form):
    """One-page reads cost 1 / IOPS each and long reads their bytes at the bandwidth, in either form.

    The IOPS are measured with 4 KiB reads, so they hold one page's transfer: the additive form
    before session 10 charged it twice (1 / IOPS + 4 KiB / B a read).
    """
    m = _machine(disk_cost=form, ssd_iops=74_000.0, ssd_read_gbps=1.46)
    assert disk_seconds(m, 10_000, 10_000) == pytest.approx(10_000 / 74_000)
    one_mib = disk_seconds(m, 1, 256)
    assert one_mib == pytest.approx(256 * 4096 / 1.46e9, rel=0.02 if form == "additive" else 1e-9)
    # in between they part: 5-page reads, where a request's cost equals its bytes'
    five = disk_seconds(m, 1_000, 5_000) / 1_000
    want = 1 / 74_000 + 4 * 4096 / 1.46e9 if form == "additive" else max(1 / 74_000, 5 * 4096 / 1.46e9)
    assert five == pytest.approx(want)


def test_serial_is_the_sum():
    p = predict(_machine(), _work(), gpu_cache_rows=0, host_cache_rows=0, overlap=Overlap.SERIAL)
    assert p.batch_s == pytest.approx(sum(p.stages.values()))


def test_cache_hits_follow_the_curve():
    work = _work(hotness_curve=[0.0, 0.8, 0.9, 1.0])  # top third of nodes take 80% of accesses
    p = predict(_machine(), work, gpu_cache_rows=333_334, host_cache_rows=333_333)
    assert p.gpu_hit == pytest.approx(0.8, abs=1e-5)
    assert p.host_hit == pytest.approx(0.1, abs=1e-5)
    assert p.stages["disk"] == pytest.approx(0.1 * 0.1, rel=1e-3)


def test_all_cached_is_compute_bound():
    # everything on the GPU: no disk, no gather, no copy; the sampler shares the device with the step
    p = predict(_machine(ssd_count=0), _work(), gpu_cache_rows=10**7, host_cache_rows=0)
    assert p.stages["disk"] == 0 and p.stages["transfer"] == 0 and p.bottleneck == "compute"
    assert p.seeds_per_s == pytest.approx(1000 / (0.01 + 0.02))
    own = predict(_machine(ssd_count=0), _work(sample_lane="own"), gpu_cache_rows=10**7, host_cache_rows=0)
    assert own.seeds_per_s == pytest.approx(1000 / 0.02)  # a sampler with its own device overlaps the step


def test_lanes_closed_form():
    """IO thread = disk + host gather; device = sample + transfer + compute (shared) or a sampler lane."""
    work = _work(hotness_curve=[0.0, 0.5, 1.0], sample_s=0.03, compute_s=0.02)  # half the nodes: half the hits
    m = _machine(ssd_count=0)
    p = predict(m, work, gpu_cache_rows=0, host_cache_rows=10**6)  # all in the host cache, no disk
    gather = 100_000 * 4096 / 10e9  # 41 ms at 10 GB/s
    transfer = 100_000 * 4096 / 40.96e9  # 10 ms at 40.96 GB/s
    assert p.stages["gather"] == pytest.approx(gather) and p.stages["transfer"] == pytest.approx(transfer)
    assert p.bottleneck == "compute" and p.batch_s == pytest.approx(0.03 + transfer + 0.02)  # 60 ms > 41 ms
    work_own = _work(hotness_curve=[0.0, 0.5, 1.0], sample_s=0.03, compute_s=0.02, sample_lane="own")
    own = predict(m, work_own, gpu_cache_rows=0, host_cache_rows=10**6)
    assert own.bottleneck == "disk" and own.batch_s == pytest.approx(gather)  # the IO thread's gather now
    half = predict(_machine(), work, gpu_cache_rows=0, host_cache_rows=500_000)  # 50k misses of one page
    assert half.batch_s == pytest.approx(max(half.stages["disk"] + half.stages["gather"], 0.05 + transfer))
    with pytest.raises(ConfigError, match="sample_lane"):
        _work(sample_lane="gpu")


def test_no_ssd_with_misses_is_refused():
    with pytest.raises(CapacityError):
        predict(_machine(ssd_count=0), _work(), gpu_cache_rows=0, host_cache_rows=0)


def test_small_rows_share_pages():
    # 512 B rows: 8 per page; misses spread over the file touch P (1 - exp(-m/P)) pages
    work = _work(row_bytes=512, row_stride=512, unique_per_batch=125_000.0)
    p = predict(_machine(), work, gpu_cache_rows=0, host_cache_rows=0)
    file_pages = 1_000_000 * 512 / 4096
    assert p.disk_pages == pytest.approx(file_pages * (1 - math.exp(-125_000 / file_pages)))
    assert p.disk_ios < p.disk_pages


def test_hit_rate_interpolates():
    assert hit_rate([0.0, 0.5, 1.0], 0.25) == pytest.approx(0.25)
    assert hit_rate([0.0, 0.5, 1.0], 2.0) == 1.0


def test_recommend_picks_ssds_until_compute_bound():
    m = _machine(gpu_mem_gb=8.0, host_mem_gb=16.0, bus_limit_gbps=64.0)
    best, cands = recommend(m, _work(), max_ssds=8)
    # disk time 0.1/k falls below the device lane, sample 0.01 + transfer 0.01 + compute 0.02, at k = 3;
    # more SSDs only add cost
    assert int(best.config["ssd_count"]) == 3
    assert [int(c.config["ssd_count"]) for c in cands] == list(range(1, 9))
    cheap, _ = recommend(m, _work(), budget_usd=m.base_price_usd + m.gpu_price_usd + 2 * m.ssd_price_usd)
    assert int(cheap.config["ssd_count"]) == 2
    with pytest.raises(CapacityError):
        recommend(m, _work(), budget_usd=100.0)


def test_configs_validate():
    with pytest.raises(ConfigError):
        _work(hotness_curve=[0.0, 0.7, 0.6, 1.0])
    with pytest.raises(ConfigError):
        _machine(ssd_iops=0.0)


def test_best_gap_pages_closed_form():
    # 1.6384 GB/s over 10k IOPS = 163,840 B = 40 pages per IO for free: holes up to 39 pages
    assert best_gap_pages(_machine(ssd_read_gbps=1.6384, ssd_iops=10_000.0)) == 39
    assert best_gap_pages(_machine(ssd_read_gbps=4.096, ssd_iops=1_000_000.0)) == 0


@pytest.mark.parametrize("gap", [0, 3, 20])
def test_disk_model_matches_the_store_page_planner(gap):
    """The model's pages and IOs for uniform misses agree with page_runs on a real draw."""
    import numpy as np

    from carina.gnn.store import page_runs

    n, stride, misses = 400_000, 512, 20_000
    rng = np.random.default_rng(0)
    ids = rng.choice(n, size=misses, replace=False)
    pages = np.unique(ids * stride // 4096)
    runs = page_runs(pages, gap_pages=gap, max_run_pages=1 << 20)
    work = _work(num_nodes=n, row_bytes=stride, row_stride=stride, unique_per_batch=float(misses))
    p = predict(_machine(), work, gpu_cache_rows=0, host_cache_rows=0, gap_pages=gap)
    assert p.disk_pages == pytest.approx(runs.total_pages, rel=0.03)
    assert p.disk_ios == pytest.approx(runs.run_first.size, rel=0.03, abs=5)


def test_pick_disk_cost_closed_form():
    from carina.gnn.calibrate import pick_disk_cost

    # 1000 reads of 20 pages at 5k IOPS and 409.6 MB/s: a read's own cost is 200 - 10 = 190 us, so
    # additive = 0.19 s + 0.2 s of bytes = 0.39 s; overlapped = max(0.2 s, 0.2 s) = 0.2 s
    kw = dict(reads=1000, pages_per_read=20, iops=5_000.0, bandwidth=409.6e6)
    assert pick_disk_cost(0.39, **kw) == "additive"  # the sum: requests served one after another
    assert pick_disk_cost(0.2, **kw) == "overlapped"  # the max: requests hidden behind transfers
    assert pick_disk_cost(0.30, **kw) == "additive"  # nearer 0.39 than 0.2 by ratio (0.77 vs 1.5)
    assert pick_disk_cost(0.26, **kw) == "overlapped"  # (0.67 vs 1.3)


def test_uva_fit_through_two_row_sizes():
    from carina.gnn.calibrate import uva_fit

    # 50 GB/s and 10 ns a row: 512 B rows take 20.24 ns, 4 KiB rows 91.92 ns
    rate, per_row = uva_fit(512 / 50e9 + 10e-9, 4096 / 50e9 + 10e-9)
    assert rate == pytest.approx(50e9) and per_row == pytest.approx(10e-9)
    rate, per_row = uva_fit(4e-9, 4096 / 50e9)  # small rows relatively faster: no per-row term
    assert rate == pytest.approx(50e9) and per_row == 0.0


@pytest.mark.gpu
def test_uva_rates_on_a_gpu():
    """The calibration's GPU gather of mapped pinned rows gives a rate a bus can carry and a per-row cost >= 0."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from carina.gnn.calibrate import _uva_rates

    rate, per_row = _uva_rates("cuda", table_mb=64, batch=1 << 14)
    assert 1e9 < rate < 1e12 and 0 <= per_row < 1e-6


def _host_heavy():
    # every row cached, half on the host: 50k host hits of 4 KiB a batch; sample 10 ms + compute 20 ms
    work = _work(hotness_curve=[0.0, 0.5, 1.0])
    return work, dict(gpu_cache_rows=500_000, host_cache_rows=500_000)


def test_device_host_path_closed_form():
    """device: no CPU gather, no copy of the host hits; the device reads them in place (device lane)."""
    work, caches = _host_heavy()
    m = _machine(ssd_count=0, uva_gbps=20.48, uva_row_ns=100.0)
    dev = predict(m, work, host_gather=HostGather.DEVICE, **caches)
    read = 50_000 * (4096 / 20.48e9 + 100e-9)  # 10 ms + 5 ms
    assert dev.host_gather == "device" and dev.stages["device_gather"] == pytest.approx(read)
    assert dev.stages["gather"] == 0 and dev.stages["transfer"] == 0  # no misses: nothing to copy
    assert dev.lanes == {"disk": 0.0, "compute": pytest.approx(0.01 + read + 0.02)}
    cpu = predict(m, work, host_gather=HostGather.CPU, **caches)
    gather, transfer = 50_000 * 4096 / 10e9, 50_000 * 4096 / 40.96e9  # 20.5 ms on the IO thread, 5 ms
    assert cpu.stages["gather"] == pytest.approx(gather) and cpu.stages["transfer"] == pytest.approx(transfer)
    assert cpu.stages["device_gather"] == 0 and cpu.batch_s == pytest.approx(max(gather, 0.03 + transfer))
    assert predict(m, work, host_gather=HostGather.AUTO, **caches).host_gather == "device"
    unmeasured = _machine(ssd_count=0)
    assert predict(unmeasured, work, host_gather=HostGather.AUTO, **caches).host_gather == "cpu"
    with pytest.raises(ConfigError, match="uva_gbps"):
        predict(unmeasured, work, host_gather=HostGather.DEVICE, **caches)


def test_recommend_takes_the_faster_host_path():
    work, _ = _host_heavy()
    slow_cpu = _machine(host_gather_gbps=1.0, uva_gbps=40.96, gpu_mem_gb=2.048, host_mem_gb=2.048)
    best, cands = recommend(slow_cpu, work, max_ssds=2, gpu_reserve_gb=0, host_reserve_gb=0)
    # all 1M rows fit (0.5M + 0.5M of 4 KiB): no SSD; the CPU path would take 205 ms on the IO thread
    assert [int(c.config["ssd_count"]) for c in cands] == [0, 1, 2]
    assert best.host_gather == "device" and int(best.config["ssd_count"]) == 0
    slow_uva = _machine(host_gather_gbps=100.0, uva_gbps=0.5, gpu_mem_gb=2.048, host_mem_gb=2.048)
    best, _ = recommend(slow_uva, work, max_ssds=0, gpu_reserve_gb=0, host_reserve_gb=0)
    assert best.host_gather == "cpu"


def _lookup_machine(**kw):
    # 200 us a lookup, 20 ns an id, 30 ns a host hit copied to the CPU (cpu path)
    return _machine(
        ssd_count=0,
        uva_gbps=20.48,
        uva_row_ns=100.0,
        lookup_batch_us=200.0,
        lookup_id_ns=20.0,
        lookup_host_id_ns=30.0,
        **kw,
    )


def test_lookup_on_the_sampler_thread_closed_form():
    """sampler thread = sample + t_lookup + U t_id (+ U h_c t_host on the cpu path); none in memory."""
    work, caches = _host_heavy()  # U = 100k, h_c = 0.5
    m = _lookup_machine()
    dev = predict(m, work, host_gather=HostGather.DEVICE, **caches)
    lookup_dev = 200e-6 + 100_000 * 20e-9  # 2.2 ms
    assert dev.stages["lookup"] == pytest.approx(lookup_dev)
    read = 50_000 * (4096 / 20.48e9 + 100e-9)
    assert dev.lanes == {"disk": 0.0, "compute": pytest.approx(0.01 + lookup_dev + read + 0.02)}
    cpu = predict(m, work, host_gather=HostGather.CPU, **caches)
    lookup_cpu = lookup_dev + 50_000 * 30e-9  # + 1.5 ms: the host hits' positions and slots to the CPU
    assert cpu.stages["lookup"] == pytest.approx(lookup_cpu)
    assert cpu.lanes["compute"] == pytest.approx(0.01 + lookup_cpu + 50_000 * 4096 / 40.96e9 + 0.02)
    own = predict(m, _work(hotness_curve=[0.0, 0.5, 1.0], sample_lane="own"), host_gather=HostGather.DEVICE, **caches)
    assert own.lanes["sample"] == pytest.approx(0.01 + lookup_dev)
    serial = predict(m, work, host_gather=HostGather.DEVICE, overlap=Overlap.SERIAL, **caches)
    assert serial.batch_s == pytest.approx(0.01 + lookup_dev + read + 0.02)
    mem = predict_in_memory(m, work)  # no cache, no lookup
    assert mem.stages["lookup"] == 0 and mem.seeds_per_s == pytest.approx(1000 / (0.01 + 0.02))
    full = predict(m, work, gpu_cache_rows=10**6, host_cache_rows=0)  # carina with every row on the GPU still looks up
    assert full.batch_s == pytest.approx(0.03 + lookup_dev)


def test_lookup_cost_moves_the_host_path_pick():
    """The cpu path's copy of the host hits' positions to the CPU counts against it in recommend."""
    work, _ = _host_heavy()
    # device lane on the device path: 10 + 15 (read) + 20 = 45 ms; cpu path: 10 + 5 (copy) + 20 = 35 ms
    base = dict(gpu_mem_gb=2.048, host_mem_gb=2.048, host_gather_gbps=100.0)
    plain = _machine(uva_gbps=20.48, uva_row_ns=100.0, **base)
    best, _ = recommend(plain, work, max_ssds=0, gpu_reserve_gb=0, host_reserve_gb=0)
    assert best.host_gather == "cpu"
    slow_copy = _machine(uva_gbps=20.48, uva_row_ns=100.0, lookup_host_id_ns=300.0, **base)  # + 15 ms, cpu path only
    best, _ = recommend(slow_copy, work, max_ssds=0, gpu_reserve_gb=0, host_reserve_gb=0)
    assert best.host_gather == "device" and best.batch_s == pytest.approx(0.045)


def test_a_calibration_without_lookup_rates_prices_no_lookup():
    """A MachineSpec file from before session 13 loads; its lookup is 0 and it says so."""
    old = {k: v for k, v in _lookup_machine().to_dict().items() if not k.startswith("lookup_")}
    m = MachineSpec.from_dict(old)
    assert not m.lookup_priced and _lookup_machine().lookup_priced
    work, caches = _host_heavy()
    assert predict(m, work, **caches).stages["lookup"] == 0
    with pytest.raises(ConfigError, match="lookup_id_ns"):
        _machine(lookup_id_ns=-1.0)


def test_line_fit_closed_form():
    from carina.gnn.calibrate import line_fit

    assert line_fit(100, 1e-3 + 100 * 2e-8, 1000, 1e-3 + 1000 * 2e-8) == pytest.approx((1e-3, 2e-8))
    assert line_fit(100, 1e-6, 1000, 1e-3) == pytest.approx((0.0, 1e-6))  # fixed part below 0: rate alone
    assert line_fit(100, 2e-3, 1000, 1e-3) == (1e-3, 0.0)  # falling: all fixed


def test_lookup_rates_on_the_cpu():
    from carina.gnn.calibrate import lookup_rates

    r = lookup_rates("cpu", num_nodes=1 << 14, small=256, large=8192, repeats=3)
    assert set(r) == {"batch_s", "id_s", "host_id_s"}
    assert min(r.values()) >= 0 and r["batch_s"] + 8192 * r["id_s"] > 0 and r["batch_s"] < 1.0


@pytest.mark.gpu
def test_lookup_rates_on_a_gpu():
    """On CUDA the calibration times the device's lookup; the line through two batch sizes is non-negative."""
    from carina.gnn.calibrate import lookup_rates

    r = lookup_rates("cuda", num_nodes=1 << 20, small=1 << 12, large=1 << 16, repeats=3)
    assert min(r.values()) >= 0 and r["batch_s"] + (1 << 16) * r["id_s"] > 0
