import numpy as np

from carina.io import make_cold, resident_fraction


def test_make_cold_evicts_the_file_and_says_so(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(np.arange(1 << 20, dtype=np.uint8).tobytes())  # 1 MiB: 256 pages
    assert path.read_bytes()[:4] == bytes([0, 1, 2, 3])  # read: the pages are cached
    assert resident_fraction(path) > 0.9
    report = make_cold(path, system=False)
    assert report["fadvise"] is True and report["drop_caches"] is False
    assert report["resident_before"] > 0.9
    assert report["resident_after"] == 0.0 == resident_fraction(path)


def test_resident_fraction_of_an_empty_file(tmp_path):
    path = tmp_path / "empty"
    path.write_bytes(b"")
    assert resident_fraction(path) == 0.0
