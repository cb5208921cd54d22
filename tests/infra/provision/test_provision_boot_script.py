from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from carina.core.errors import ConfigError
from carina.infra.provision.boot import BootTarget, normalize_mac, render_ipxe
from carina.infra.provision.config import ExportKind


@given(st.binary(min_size=6, max_size=6), st.sampled_from([":", "-", ""]), st.booleans())
def test_mac_normalises(raw: bytes, sep: str, upper: bool) -> None:
    raw = bytes([raw[0] & 0xFE]) + raw[1:]  # unicast
    text = sep.join(f"{b:02x}" for b in raw)
    assert normalize_mac(text.upper() if upper else text) == ":".join(f"{b:02x}" for b in raw)


@given(st.text(max_size=30))
def test_mac_parser_only_raises_config_error(text: str) -> None:
    try:
        mac = normalize_mac(text)
    except ConfigError as exc:
        assert exc.context["key"] == "mac"
        return
    assert len(mac) == 17 and mac.count(":") == 5


@pytest.mark.parametrize("bad", ["01:00:5e:00:00:01", "52:54:00:00:00", "52:54:00-00:00:01", "zz:54:00:00:00:01"])
def test_bad_macs(bad: str) -> None:
    with pytest.raises(ConfigError):
        normalize_mac(bad)


def test_scripts_name_the_target() -> None:
    iscsi = BootTarget(ExportKind.ISCSI, "10.0.0.1", 3260, "iqn.2026-11.io.carina:lab.n1")
    text = render_ipxe(iscsi, node="n1", mac="52:54:00:00:00:01", kernel_url="k", initrd_url="i")
    assert text.startswith("#!ipxe\n")
    assert "sanboot --keep iscsi:10.0.0.1::3260:1:iqn.2026-11.io.carina:lab.n1" in text
    assert iscsi.uri == "iscsi://10.0.0.1:3260/iqn.2026-11.io.carina:lab.n1/1"
    nbd = BootTarget(ExportKind.NBD, "10.0.0.1", 10809, "lab.n1")
    text = render_ipxe(nbd, node="n1", mac="52:54:00:00:00:01", kernel_url="http://h/k", initrd_url="http://h/i")
    assert "kernel http://h/k root=nbd:10.0.0.1:10809/lab.n1 rw\ninitrd http://h/i\nboot\n" in text
