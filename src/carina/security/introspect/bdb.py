"""Read-only reader of Berkeley DB *hash* databases: the rpm ``Packages`` file of RHEL/CentOS <= 8.

rpm before 4.16 kept installed package headers in ``/var/lib/rpm/Packages``, a
Berkeley DB hash database: 4-byte header numbers as keys, header blobs as values
(most too large for a page, so stored "off page" in chains of overflow pages).
This reads such a file from bytes alone, without libdb: the metadata page
(magic ``0x061561``, either byte order, page size, last page), then every hash
page's key/data pairs in page order, following overflow chains. Every length,
offset and page number is checked, overflow chains are walked at most once per
page (loops end), and a file that breaks the format raises
:class:`~carina.core.errors.ModelFormatError` naming the page.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator

from carina.core.errors import ModelFormatError

__all__ = ["HASH_MAGIC", "read_hash_db"]

HASH_MAGIC = 0x061561
_P_HASH_UNSORTED, _P_OVERFLOW, _P_HASH = 2, 7, 13
_H_KEYDATA, _H_DUPLICATE, _H_OFFPAGE = 1, 2, 3
_PAGE_HEADER = 26  # lsn 8, pgno 4, prev 4, next 4, entries 2, hf_offset 2, level 1, type 1
MAX_VALUE = 64 << 20


def _meta(data: bytes, where: str) -> tuple[str, int, int, int]:
    """Byte order, page size, last page number present and last page number claimed, from the metadata page."""
    if len(data) < 512:
        raise ModelFormatError("too short for a Berkeley DB metadata page", file=where)
    for order in ("<", ">"):
        magic, _version, pagesize = struct.unpack_from(order + "III", data, 12)
        if magic == HASH_MAGIC:
            break
    else:
        raise ModelFormatError("not a Berkeley DB hash database (bad magic)", file=where)
    if pagesize < 512 or pagesize > 65536 or pagesize & (pagesize - 1):
        raise ModelFormatError(f"bad page size {pagesize}", file=where)
    (claimed,) = struct.unpack_from(order + "I", data, 32)
    # A file cut short: read the pages that are there (the caller reports the rest missing).
    return order, pagesize, min(claimed, len(data) // pagesize - 1), claimed


def _overflow(data: bytes, order: str, pagesize: int, pgno: int, tlen: int, last: int, where: str) -> bytes:
    """The value stored in the overflow chain that starts at ``pgno`` (``tlen`` bytes)."""
    if tlen > MAX_VALUE:
        raise ModelFormatError(f"off-page value of {tlen} bytes exceeds {MAX_VALUE}", file=where)
    out = bytearray()
    seen: set[int] = set()
    while pgno != 0 and len(out) < tlen:
        if pgno > last or pgno in seen:
            raise ModelFormatError(f"overflow chain reaches page {pgno} (outside the file or a loop)", file=where)
        seen.add(pgno)
        base = pgno * pagesize
        next_pgno, used, ptype = struct.unpack_from(order + "I2xHxB", data, base + 16)
        if ptype != _P_OVERFLOW or used > pagesize - _PAGE_HEADER:
            raise ModelFormatError(f"page {pgno} is not a valid overflow page", file=where)
        out += data[base + _PAGE_HEADER : base + _PAGE_HEADER + used]
        pgno = next_pgno
    if len(out) != tlen:
        raise ModelFormatError(f"overflow chain holds {len(out)} bytes, not {tlen}", file=where)
    return bytes(out)


def _items(data: bytes, order: str, pagesize: int, pgno: int, where: str) -> list[bytes]:
    """The raw items of hash page ``pgno`` (keys and data alternate)."""
    base = pgno * pagesize
    (entries,) = struct.unpack_from(order + "H", data, base + 20)
    if _PAGE_HEADER + 2 * entries > pagesize:
        raise ModelFormatError(f"page {pgno}: {entries} entries do not fit", file=where)
    offsets = struct.unpack_from(f"{order}{entries}H", data, base + _PAGE_HEADER)
    items, end = [], pagesize
    for off in offsets:
        if not _PAGE_HEADER + 2 * entries <= off < end:
            raise ModelFormatError(f"page {pgno}: item offset {off} out of order or outside the page", file=where)
        items.append(data[base + off : base + end])
        end = off
    return items


def read_hash_db(
    data: bytes, *, where: str = "<hash db>", on_error: Callable[[str], None] | None = None
) -> Iterator[tuple[bytes, bytes]]:
    """Every ``(key, value)`` pair of a Berkeley DB hash database, in page order.

    Duplicate-key sets (``H_DUPLICATE``) are not used by rpm and count as errors.

    Args:
        data: The whole file.
        where: Its name in messages.
        on_error: Called with the message of a page (or pair) that breaks the
            format, which is then skipped; None: raise instead.

    Raises:
        ModelFormatError: The metadata page is bad, or (without ``on_error``) any page is.
    """
    order, pagesize, last, claimed = _meta(data, where)
    if claimed != last:
        _report(on_error, ModelFormatError(f"file cut short: {last + 1} of {claimed + 1} pages", file=where))
    for pgno in range(1, last + 1):
        ptype = data[pgno * pagesize + 25]
        if ptype not in (_P_HASH, _P_HASH_UNSORTED):
            continue
        try:
            items = _items(data, order, pagesize, pgno, where)
        except ModelFormatError as exc:
            _report(on_error, exc)
            continue
        for k in range(0, len(items) - 1, 2):
            try:
                key, value = (_item(data, order, pagesize, it, last, f"{where} page {pgno}") for it in items[k : k + 2])
            except ModelFormatError as exc:
                _report(on_error, exc)
                continue
            yield key, value


def _report(on_error: Callable[[str], None] | None, exc: ModelFormatError) -> None:
    if on_error is None:
        raise exc
    on_error(str(exc))


def _item(data: bytes, order: str, pagesize: int, item: bytes, last: int, where: str) -> bytes:
    kind = item[0] if item else 0
    if kind == _H_KEYDATA:
        return item[1:]
    if kind == _H_OFFPAGE and len(item) >= 12:
        pgno, tlen = struct.unpack_from(order + "II", item, 4)
        return _overflow(data, order, pagesize, pgno, tlen, last, where)
    raise ModelFormatError(f"unsupported hash item type {kind}", file=where)
