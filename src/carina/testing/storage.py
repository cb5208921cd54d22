"""Test kit of the storage middle tier: run a real tier, and a raw NBD client for bad frames.

Nothing here fakes the tier: :class:`TierThread` serves a real store on
loopback from a background thread, :class:`TierProcess` runs ``carina storage
serve`` as a separate process (so tests can kill it), and :class:`RawNbdClient`
speaks the wire protocol byte by byte so tests can send what real clients never
would.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from carina.infra.storage import protocol as p
from carina.infra.storage.config import (
    CodecName,
    EngineConfig,
    EngineKind,
    LoopKind,
    ServerConfig,
    StoreConfig,
    TierConfig,
)

__all__ = [
    "NbdReply",
    "RawNbdClient",
    "TierProcess",
    "TierThread",
    "import_libnbd",
    "mixed_image",
    "qemu_io",
    "small_tier_config",
]

#: Where Debian's python3-libnbd puts the libnbd bindings (outside any virtualenv).
DEBIAN_DIST_PACKAGES = "/usr/lib/python3/dist-packages"


def import_libnbd() -> Any:
    """The libnbd Python bindings (``nbd``), or ``None`` when they are not installed.

    Debian ships them only as ``python3-libnbd`` for the system Python; a venv of
    the same Python version can load them from there. (PyPI's ``nbd`` is an
    unrelated notebook tool.)
    """
    import importlib

    try:
        return importlib.import_module("nbd")
    except ImportError:
        pass
    if DEBIAN_DIST_PACKAGES not in sys.path and os.path.isdir(DEBIAN_DIST_PACKAGES):
        sys.path.append(DEBIAN_DIST_PACKAGES)
        try:
            module = importlib.import_module("nbd")
        except ImportError:
            return None
        finally:
            sys.path.remove(DEBIAN_DIST_PACKAGES)
        return module if hasattr(module, "NBD") else None
    return None


def small_tier_config(
    path: Path,
    *,
    engine: str = "inline",
    codec: str = "lz4",
    size: int = 16 << 20,
    block_size: int = 64 << 10,
    slots: int = 8,
    loop: str = "asyncio",
    workers: int = 2,
) -> TierConfig:
    """A tier sized for tests: small export, few 256 KiB slots, port 0, frequent stats."""
    return TierConfig(
        store=StoreConfig(path=path, size=size, block_size=block_size, codec=CodecName(codec)),
        engine=EngineConfig(kind=EngineKind(engine), workers=workers, device="cpu"),
        server=ServerConfig(port=0, slots=slots, slot_bytes=256 << 10, loop=LoopKind(loop), stats_interval=0.2),
    )


def mixed_image(nbytes: int, seed: int = 0) -> bytes:
    """Deterministic mixed data: source text, random bytes, zero runs, repeated records."""
    rng = random.Random(seed)
    text = Path(__file__).read_bytes() + Path(os.__file__).read_bytes()
    out = bytearray()
    while len(out) < nbytes:
        kind = rng.randrange(4)
        n = rng.choice([512, 4096, 20000, 70000])
        if kind == 0:
            start = rng.randrange(len(text))
            out += (text[start:] + text)[:n]
        elif kind == 1:
            out += rng.randbytes(n)
        elif kind == 2:
            out += bytes(n)
        else:
            out += (b"record %08d;" % rng.randrange(10**8)) * (n // 16)
    return bytes(out[:nbytes])


class TierThread:
    """Serve ``config`` from a background thread's event loop; use as a context manager."""

    def __init__(self, config: TierConfig) -> None:
        self.config = config
        self.port = 0
        self.final: dict[str, Any] | None = None
        self.server: Any = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="carina-tier", daemon=True)

    @property
    def url(self) -> str:
        """The export's NBD URL."""
        return f"nbd://127.0.0.1:{self.port}/{self.config.server.export}"

    def _main(self) -> None:
        from carina.infra.storage.service import loop_factory, serve

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()

            def ready(server: Any) -> None:
                self.server, self.port = server, server.ports[0]
                self._ready.set()

            self.final = await serve(self.config, ready=ready, stop=self._stop)

        try:
            with asyncio.Runner(loop_factory=loop_factory(self.config.server.loop)) as runner:
                runner.run(main())
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            self._error = exc
            self._ready.set()

    def __enter__(self) -> TierThread:
        self._thread.start()
        if not self._ready.wait(60) or self._error is not None:
            raise RuntimeError(f"tier did not start: {self._error!r}")
        return self

    def stop(self) -> dict[str, Any] | None:
        """Shut the tier down cleanly and return its final stats."""
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)
        if self._error is not None:
            raise self._error
        return self.final

    def __exit__(self, *exc: object) -> None:
        self.stop()


class TierProcess:
    """``carina storage serve --json --port 0 ...`` as a child process."""

    def __init__(self, args: list[str], *, env: dict[str, str] | None = None) -> None:
        cmd = [sys.executable, "-m", "carina", "storage", "serve", "--json", "--port", "0", *args]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"carina storage serve did not start: {err[-2000:]}")
        ready = json.loads(line)
        self.url: str = ready["url"]
        self.port: int = ready["port"]
        self.events: list[dict[str, Any]] = [ready]
        self._reader = threading.Thread(target=self._drain, daemon=True)  # a full pipe would stall the server
        self._reader.start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.append(json.loads(line))

    def kill(self) -> None:
        """SIGKILL: no flush, no checkpoint (what a crash does)."""
        self.proc.kill()
        self.proc.wait(30)

    def stop(self) -> str:
        """SIGTERM and wait; return what the server wrote to stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        self._reader.join(10)
        return self.proc.stderr.read() if self.proc.stderr else ""

    def __enter__(self) -> TierProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.stop()


def qemu_io(url: str, *commands: str, timeout: float = 60) -> str:
    """Run ``qemu-io`` commands against ``url``; raise if one fails or a pattern check mismatches."""
    args = ["qemu-io", "-f", "raw"]
    for c in commands:
        args += ["-c", c]
    out = subprocess.run([*args, url], capture_output=True, text=True, timeout=timeout, check=False)
    text = out.stdout + out.stderr
    if out.returncode != 0 or "failed" in text.lower() or "error" in text.lower():
        raise AssertionError(f"qemu-io failed ({out.returncode}): {text[-2000:]}")
    return text


@dataclass(frozen=True)
class NbdReply:
    """A reply as the raw client saw it."""

    cookie: int
    error: int
    data: bytes = b""


class RawNbdClient:
    """A minimal blocking NBD client that can also send malformed frames."""

    def __init__(self, port: int, *, host: str = "127.0.0.1", timeout: float = 10) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.size = 0
        self.flags = 0

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()

    def recv_exact(self, n: int) -> bytes:
        """Exactly ``n`` bytes; raise ``ConnectionError`` when the server closes first."""
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError(f"server closed after {len(buf)} of {n} bytes")
            buf += chunk
        return bytes(buf)

    def closed_by_server(self) -> bool:
        """Whether the server has closed the connection (reads EOF, after any pending bytes)."""
        try:
            while True:
                if not self.sock.recv(65536):
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False

    def greet(self, flags: int = 3) -> None:
        """Read the greeting and send client ``flags``."""
        magic, opt, _ = struct.unpack(">QQH", self.recv_exact(18))
        assert (magic, opt) == (p.NBDMAGIC, p.IHAVEOPT)
        self.sock.sendall(struct.pack(">I", flags))

    def option(self, option: int, data: bytes = b"") -> list[tuple[int, bytes]]:
        """Send an option; collect ``(reply type, data)`` until an ACK or error reply."""
        self.sock.sendall(struct.pack(">QII", p.IHAVEOPT, option, len(data)) + data)
        replies = []
        while True:
            magic, opt, rtype, n = struct.unpack(">QIII", self.recv_exact(20))
            assert magic == p.REPLY_MAGIC and opt == option
            replies.append((rtype, self.recv_exact(n)))
            if rtype == p.Rep.ACK or rtype >= 1 << 31:
                return replies

    def go(self, name: str = "carina") -> None:
        """Greet and ``NBD_OPT_GO`` into transmission."""
        self.greet()
        raw = name.encode()
        replies = self.option(p.Opt.GO, struct.pack(">I", len(raw)) + raw + struct.pack(">H", 0))
        for rtype, data in replies:
            if rtype == p.Rep.INFO and struct.unpack(">H", data[:2])[0] == p.Info.EXPORT:
                _, self.size, self.flags = struct.unpack(">HQH", data)
        assert replies[-1][0] == p.Rep.ACK, replies

    def request(
        self, cmd: int, offset: int, length: int, *, data: bytes = b"", cookie: int = 1, flags: int = 0
    ) -> None:
        """Send one request header (and its payload)."""
        self.sock.sendall(p.encode_request(p.Request(flags, cmd, cookie, offset, length)) + data)

    def reply(self, read_length: int = 0) -> NbdReply:
        """Read one simple reply; ``read_length`` bytes of data follow a successful READ."""
        magic, error, cookie = struct.unpack(">IIQ", self.recv_exact(16))
        assert magic == p.SIMPLE_REPLY_MAGIC, hex(magic)
        data = self.recv_exact(read_length) if read_length and not error else b""
        return NbdReply(cookie, error, data)

    def read(self, offset: int, length: int) -> bytes:
        """READ and return the data (raises on an error reply)."""
        self.request(p.Cmd.READ, offset, length)
        rep = self.reply(length)
        if rep.error:
            raise OSError(rep.error, "NBD read failed")
        return rep.data

    def write(self, offset: int, data: bytes, *, flags: int = 0) -> int:
        """WRITE; return the reply's error (0 on success)."""
        self.request(p.Cmd.WRITE, offset, len(data), data=data, flags=flags)
        return self.reply().error

    def disconnect(self) -> None:
        """Send ``NBD_CMD_DISC`` and close."""
        self.request(p.Cmd.DISC, 0, 0)
        self.close()
