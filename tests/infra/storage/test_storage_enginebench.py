from __future__ import annotations

import lz4.block
import pytest

import carina.infra.storage.engines as engines
from carina.core.errors import IOEngineError
from carina.infra.storage.codecs import Codec, Op
from carina.infra.storage.config import EngineConfig, EngineKind
from carina.infra.storage.enginebench import engine_rate, payload_dataset

B = 16 << 10


def test_payload_dataset_is_exact_length_without_zero_blocks() -> None:
    data = payload_dataset(1 << 20, B)
    assert len(data) == 1 << 20
    assert all(data[i : i + B] != bytes(B) for i in range(0, len(data), B))


@pytest.mark.parametrize("kind", [EngineKind.INLINE, EngineKind.THREAD])
def test_engine_rate_reports_the_codec_ratio_and_checks_round_trips(kind: EngineKind) -> None:
    data = payload_dataset(256 << 10, B)
    out = engine_rate(EngineConfig(kind=kind, workers=2), Codec.LZ4, data, block=B, batch=2, streams=3, seconds=0.05)
    sizes = [len(lz4.block.compress(data[i : i + B], store_size=False)) for i in range(0, len(data), B)]
    kept = [min(n, B) for n in sizes]  # blocks that do not shrink are stored raw
    assert out["ratio"] == pytest.approx(len(kept) * B / sum(kept), rel=1e-12)
    assert out["compress_mb_s"] > 0 and out["decompress_mb_s"] > 0 and out["engine"] == kind.value


def test_engine_rate_fails_an_engine_that_corrupts_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    real = engines.run_jobs

    def corrupting(arena, jobs, **kw):  # type: ignore[no-untyped-def]
        results = real(arena, jobs, **kw)
        for op, _, _, _, dst, _, _ in jobs:
            if op == Op.DECOMPRESS:
                arena[dst] ^= 0xFF
        return results

    monkeypatch.setattr(engines, "run_jobs", corrupting)
    data = payload_dataset(128 << 10, B)
    with pytest.raises(IOEngineError, match="changed a block"):
        engine_rate(EngineConfig(kind=EngineKind.INLINE), Codec.LZ4, data, block=B, batch=2, streams=2, seconds=0.02)
