"""Test-only reference decoder of CommitLog records, written from SPEC.md §1.2 with
``struct`` (a differential oracle for the Cython codec; never used by rmq itself)."""
import struct
import zlib

MAGIC_V1 = 0xDAA320A7
MAGIC_V2 = 0xDAA320AB
BLANK = 0xCBD43194


def java_hash(s: str) -> int:
    """Java String.hashCode over UTF-16 code units, as a signed int32 (SPEC.md §0.2)."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i:i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def crc(data: bytes) -> int:
    return zlib.crc32(data) & 0x7FFFFFFF


def decode(buf: bytes, pos: int = 0) -> dict:
    total, magic, body_crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts = struct.unpack_from(
        ">iIiiiqqiq", buf, pos)
    assert magic in (MAGIC_V1, MAGIC_V2), hex(magic)
    p = pos + 48
    bh = 20 if sys_flag & 0x10 else 8
    born_host = buf[p:p + bh]
    p += bh
    (store_ts,) = struct.unpack_from(">q", buf, p)
    p += 8
    sh = 20 if sys_flag & 0x20 else 8
    store_host = buf[p:p + sh]
    p += sh
    reconsume, prepared = struct.unpack_from(">iq", buf, p)
    p += 12
    (body_len,) = struct.unpack_from(">i", buf, p)
    p += 4
    body = buf[p:p + body_len]
    p += body_len
    if magic == MAGIC_V1:
        tl = buf[p]
        p += 1
    else:
        (tl,) = struct.unpack_from(">H", buf, p)
        p += 2
    topic = buf[p:p + tl].decode()
    p += tl
    (pl,) = struct.unpack_from(">h", buf, p)
    p += 2
    props_raw = buf[p:p + pl]
    p += pl
    assert p - pos == total, (p - pos, total)
    props = {}
    for item in props_raw.decode().split("\x02"):
        if "\x01" in item:
            k, v = item.split("\x01", 1)
            props[k] = v
    return dict(total=total, magic=magic, body_crc=body_crc, queue_id=queue_id, flag=flag,
                queue_offset=queue_offset, physical_offset=phys, sys_flag=sys_flag, born_timestamp=born_ts,
                born_host=born_host, store_timestamp=store_ts, store_host=store_host,
                reconsume_times=reconsume, prepared_transaction_offset=prepared, body=body, topic=topic,
                properties_raw=props_raw, properties=props)
