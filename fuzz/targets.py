"""Fuzz targets shared by the atheris entry points (fuzz/fuzz_*.py) and the hypothesis
tests (tests/fault/test_fuzz.py) — RELIABILITY.md T8.

Each target takes raw bytes and returns an outcome name; it raises only on a
real finding (an exception outside the documented ones, or a broken invariant):

* :func:`fuzz_frame` — ``rmq.protocol.decode`` of multipart parts carved from the
  bytes: only ProtocolError may come out; a decoded frame re-encodes and decodes
  to the same header bytes.
* :func:`fuzz_records` — the Cython CommitLog parser (``check_message``,
  ``decode_records``, ``scan_valid``, ``decode_properties``): only
  CorruptRecordError; whatever is accepted with CRC checking really passes its
  CRCs, lies inside the buffer and tiles it.
* :func:`fuzz_recovery` — mutations (bit flips, bytes, truncation, zeroed
  ranges, deleted files, abort file on/off) of a small real store, then
  ``MessageStore`` open: it recovers or raises StoreError (the store's
  documented error); every record it then serves passes its CRC
  (check_message with ``require_prop_crc``).
"""
from __future__ import annotations

import os
import shutil
import struct
import tempfile
import time
import zlib

from rmq import protocol as P
from rmq._core import commitlog as cl
from rmq._core.mapped_file import MappedFile
from rmq.errors import CorruptRecordError, StoreError

HANG_S = 120.0         # an execution longer than this is reported as a hang (a recovery of these tiny
                       # stores takes milliseconds; generous so a loaded machine is not a finding)


class Finding(AssertionError):
    """A broken invariant (a real bug)."""


# -- frames ------------------------------------------------------------------------------------------
PART_SEPARATOR = b"\xc1\xc1"     # 0xc1 is the one byte msgpack never uses


def frame_parts(data: bytes) -> list:
    """Multipart parts from fuzz bytes: byte 0 chooses a magic prefix and extra body parts,
    the rest is split on PART_SEPARATOR."""
    if not data:
        return []
    flags, rest = data[0], data[1:]
    parts = rest.split(PART_SEPARATOR)[:200]
    if flags & 1:
        parts.insert(0, P.PROTOCOL_MAGIC)
    if flags & 2:
        parts.extend([b"x"] * (flags >> 2))         # up to 63 more parts: around MAX_BODY_PARTS
    return parts


def check_frame(parts: list) -> str:
    """decode(parts): ProtocolError or a frame that round-trips."""
    try:
        f = P.decode(parts)
    except P.ProtocolError as e:
        if not isinstance(e.code, int) or not isinstance(e.remark, str):
            raise Finding(f"ProtocolError without code/remark: {e!r}")
        return "rejected"
    if not isinstance(f.code, int) or not isinstance(f.opaque, int) or not isinstance(f.flag, int):
        raise Finding(f"decoded non-int code/opaque/flag: {f!r}"[:500])
    if not isinstance(f.remark, str) or not isinstance(f.fields, dict) or len(f.fields) > P.MAX_FIELDS:
        raise Finding(f"decoded bad remark/fields: {f!r}"[:500])
    if len(f.bodies) > P.MAX_BODY_PARTS:
        raise Finding(f"{len(f.bodies)} bodies passed the limit")
    try:
        enc = P.encode(f)
    except P.ProtocolError:
        return "accepted"
    f2 = P.decode(enc)
    enc2 = P.encode(f2)
    if enc2[1] != enc[1] or [bytes(b) for b in enc2[2:]] != [bytes(b) for b in enc[2:]]:
        raise Finding(f"decode/encode does not round-trip: {enc[1][:200]!r} vs {enc2[1][:200]!r}")
    return "accepted"


def fuzz_frame(data: bytes) -> str:
    return check_frame(frame_parts(data))


# -- CommitLog records ---------------------------------------------------------------------------------
_SCRATCH = {}


def _scratch_file(size: int) -> MappedFile:
    """One reusable MappedFile per size (a tmp file), for scan_valid."""
    mf = _SCRATCH.get(size)
    if mf is None:
        d = tempfile.mkdtemp(prefix="rmq-fuzz-")
        mf = _SCRATCH[size] = MappedFile(os.path.join(d, "00000000000000000000"), size)
    return mf


CRC_TAIL = b"__CRC32#\x01"


def _check_accepted(data: bytes, pos: int, size: int, crc: bool, strict: bool) -> None:
    """Independent re-check (zlib) of a record the parser accepted."""
    if size <= 0 or pos + size > len(data):
        raise Finding(f"accepted record at {pos} of size {size} outside a {len(data)}-byte buffer")
    if not crc:
        return
    rec = bytes(data[pos:pos + size])
    (m,) = cl.decode_records(rec, True, False, False)
    if zlib.crc32(m.body or b"") & 0x7FFFFFFF != m.body_crc & 0x7FFFFFFF or m.body_crc < 0:
        raise Finding(f"record at {pos} accepted with a body CRC that does not match (zlib)")
    if strict:
        tail = rec[-20:]
        if len(rec) < 20 or tail[:9] != CRC_TAIL or tail[19:] != b"\x02" or not tail[9:19].isdigit():
            raise Finding(f"record at {pos} accepted by the strict check without a __CRC32# property")
        if int(tail[9:19][::-1]) != zlib.crc32(rec[:-20]) & 0x7FFFFFFF:
            raise Finding(f"record at {pos} accepted with a whole-record CRC that does not match (zlib)")


def fuzz_records(data: bytes) -> str:
    outcome = "rejected"
    n = len(data)
    # check_message at the start and at a few positions the bytes choose
    positions = {0}
    if n >= 4:
        positions.add(struct.unpack_from(">H", data, n - 2)[0] % (n + 1))
        positions.add(n)
    for pos in sorted(positions):
        for crc, strict in ((False, False), (True, False), (True, True)):
            res, size = cl.check_message(data, pos, crc, strict)
            if res not in ("OK", "BLANK", "TRUNCATED", "BAD_MAGIC", "BAD_LENGTH", "BAD_CRC"):
                raise Finding(f"check_message result {res!r}")
            if res == "OK":
                _check_accepted(data, pos, size, crc, strict)
                outcome = "accepted"
    # decode_records: all or CorruptRecordError; what decodes tiles the buffer
    for crc, strict in ((False, False), (True, True)):
        try:
            recs = cl.decode_records(data, True, crc, strict)
        except CorruptRecordError:
            continue
        pos = 0
        for m in recs:
            if m.store_size <= 0:
                raise Finding(f"decoded record of size {m.store_size}")
            _check_accepted(data, pos, m.store_size, crc, strict)
            # the lazily decoded parts must not crash either
            _ = (m.body, m.topic, m.tags, m.keys, m.properties, m.msg_id, m.delay_time_level)
            pos += m.store_size
        if pos != n:
            raise Finding(f"decode_records covered {pos} of {n} bytes")
        outcome = "decoded"
    try:
        cl.decode_properties(data[:4096])
    except (ValueError, UnicodeDecodeError):
        pass
    # scan_valid over a mapped file holding the bytes (zero padded)
    size = 1 << max(12, (max(n, 1) - 1).bit_length())
    if size <= 1 << 20:
        mf = _scratch_file(size)
        mf.write_at(0, data)
        mf.zero_from(n)
        for crc, strict in ((False, False), (True, True)):
            end, res, count, _ts = cl.scan_valid(mf, 0, crc, strict)
            if not 0 <= end <= size or count < 0 or (count == 0) != (end == 0):
                raise Finding(f"scan_valid returned end {end}, count {count} on a {size}-byte file")
            if crc and end:
                buf = mf.read(0, end)
                pos = 0
                for _ in range(count):
                    r, sz = cl.check_message(buf, pos, True, True)
                    if r != "OK":
                        raise Finding(f"scan_valid walked over a record that fails its check at {pos}: {r}")
                    _check_accepted(buf, pos, sz, True, True)
                    pos += sz
                if pos != end:
                    raise Finding(f"scan_valid end {end} but its {count} records end at {pos}")
    return outcome


# -- recovery of a small store -------------------------------------------------------------------------
STORE_CONF = dict(mapped_file_size_commit_log=8 * 1024, mapped_file_size_consume_queue=20 * 32,
                  max_hash_slot_num=32, max_index_num=128)
_SEED = {}


def seed_store() -> dict:
    """Files (relative path -> bytes) of a small store that was shut down cleanly:
    ~3 CommitLog files, two topics, two queues each."""
    if _SEED:
        return _SEED
    from rmq.store.message_store import MessageStore
    d = tempfile.mkdtemp(prefix="rmq-fuzz-seed-")
    try:
        s = MessageStore(d, **STORE_CONF)
        for i in range(40):
            assert s.put_message(f"Topic{i % 2}", b"body-%03d-" % i + b"x" * (i * 13 % 300), i % 4 // 2,
                                 tags=f"t{i % 3}", keys=[f"k{i}"]).ok
        s.dispatch()
        s.shutdown()
        for root, _dirs, files in os.walk(d):
            for name in files:
                path = os.path.join(root, name)
                rel = os.path.relpath(path, d)
                if rel == "lock" or rel.startswith("logs"):
                    continue
                with open(path, "rb") as f:
                    _SEED[rel] = f.read()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return _SEED


def mutate_store(files: dict, data: bytes) -> dict:
    """Apply up to 16 mutations, 8 fuzz bytes each: kind, file, offset (4), value (2)."""
    files = dict(files)
    for i in range(0, min(len(data), 16 * 8) - 7, 8):
        kind, fidx = data[i], data[i + 1]
        off = struct.unpack_from(">I", data, i + 2)[0]
        val = struct.unpack_from(">H", data, i + 6)[0]
        kind %= 8
        if kind == 7:                       # abort file on / off (abnormal vs normal recovery)
            if "abort" in files:
                del files["abort"]
            else:
                files["abort"] = b""
            continue
        # weighted: CommitLog files x4, ConsumeQueues x2, everything else (checkpoint, index, config) x1
        names = [n for n in sorted(files) for _ in range(4 if n.startswith("commitlog/") else
                                                         2 if n.startswith("consumequeue/") else 1)]
        if not names:
            break
        name = names[fidx % len(names)]
        b = bytearray(files[name])
        if kind == 5:
            del files[name]
            continue
        if not b:
            continue
        # prefer the CommitLog: most offsets land in its first records
        o = off % len(b) if off & 0x80000000 else (off & 0xFFFF) % len(b)
        if kind == 0:
            b[o] ^= 1 << (val % 8)
        elif kind == 1:
            b[o] = val & 0xFF
        elif kind == 2:
            del b[o:]
        elif kind == 3:
            b[o:o + 1 + val % 256] = bytes(len(b[o:o + 1 + val % 256]))
        elif kind == 4:
            chunk = struct.pack(">H", val) * 8
            b[o:o + len(chunk)] = chunk[:len(b) - o] if o + len(chunk) > len(b) else chunk
        elif kind == 6:
            b[o:o + 4] = struct.pack(">i", val - 0x8000)[:len(b[o:o + 4])]
        files[name] = bytes(b)
    return files


def write_store(files: dict, d: str) -> None:
    for rel, content in files.items():
        path = os.path.join(d, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(content)


def served_records(s) -> int:
    """Read every queue to its end; every served record must pass the strict CRC check."""
    from rmq.status import GetMessageStatus
    n = 0
    for (topic, qid) in list(s.consume_queue_table):
        off = s.get_min_offset_in_queue(topic, qid)
        for _ in range(10_000):
            try:
                r = s.get_messages("fuzz", topic, qid, off, 32)
            except CorruptRecordError:
                off += 1                     # refused to serve: fine, skip the entry
                continue
            if r.status is GetMessageStatus.FOUND:
                data = r.records
                pos = 0
                while pos < len(data):
                    res, size = cl.check_message(data, pos, True, True)
                    if res != "OK":
                        raise Finding(f"served a record failing its check ({res}) from {topic}/{qid} @ {off}")
                    _check_accepted(data, pos, size, True, True)
                    pos += size
                    n += 1
            if r.status in (GetMessageStatus.FOUND, GetMessageStatus.NO_MATCHED_MESSAGE,
                            GetMessageStatus.MESSAGE_WAS_REMOVING, GetMessageStatus.OFFSET_FOUND_NULL,
                            GetMessageStatus.OFFSET_TOO_SMALL):
                if r.next_begin_offset <= off:
                    break
                off = r.next_begin_offset
            else:
                break
    return n


def fuzz_recovery(data: bytes, workdir: str | None = None) -> str:
    """Open a mutated copy of the seed store; 'recovered' or 'refused' (StoreError)."""
    from rmq.store.message_store import MessageStore
    files = mutate_store(seed_store(), data)
    d = tempfile.mkdtemp(prefix="rmq-fuzz-store-", dir=workdir)
    try:
        write_store(files, d)
        t0 = time.monotonic()
        try:
            s = MessageStore(d, **STORE_CONF)
        except StoreError:
            outcome = "refused"
        else:
            try:
                served_records(s)
                # the recovered store keeps working: the next put lands and reads back
                r = s.put_message("TopicAfter", b"after-recovery", 0)
                if r.ok:
                    s.dispatch()
                    got = s.get_messages("fuzz", "TopicAfter", 0, s.get_min_offset_in_queue("TopicAfter", 0), 32)
                    bodies = [m.body for m in got.messages()]
                    if b"after-recovery" not in bodies:
                        raise Finding(f"a put after recovery is not readable: {got.status}")
                outcome = "recovered"
            finally:
                s.shutdown()
        if time.monotonic() - t0 > HANG_S:
            raise Finding(f"recovery took {time.monotonic() - t0:.1f} s (hang)")
        return outcome
    finally:
        shutil.rmtree(d, ignore_errors=True)
