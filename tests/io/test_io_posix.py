"""The posix backend passes the IO conformance suite (O_DIRECT auto and off)."""

from __future__ import annotations

from carina.testing.io import IOBackendTests


class TestPosix(IOBackendTests):
    backend = "posix"


class TestPosixBuffered(IOBackendTests):
    backend = "posix"
    direct = "off"
