"""Shared fault harness (RELIABILITY.md §4.1): seeded workload over the wire, a history of
invoke / ok / fail / info per send, the §2.2 checker, and the power-cut simulator (T1b).

Everything random comes from one seed: ``RMQ_FAULT_SEED`` (env) or the test's default, so a
failing run replays with ``RMQ_FAULT_SEED=<seed printed in its result line> pytest ...``.

* :class:`Workload`: K producer threads x Q queues sending SEND_MESSAGE frames to a broker
  address.  Message id = ``(producer, seq)``; payload = id + seeded random bytes + CRC32.
* :class:`History`: ``invoke`` / ``ok`` / ``fail`` / ``info`` events with monotonic timestamps
  (Jepsen's model); ``info`` = indeterminate (timeout, connection loss, or a reply saying the
  record was written but not made durable / replicated in time).
* :func:`read_all` + :func:`check`: read every queue back (pull over the wire) and count
  lost / unexpected / aborted reads / duplicates / reorders / indeterminate-later-visible.
* :func:`power_cut`: rewrite a (dead) store as a power cut could have left it, driven by the
  durable-offset journal ``STORE/.durable`` that the sync wrapper (rmq/_core/mapped_file.pyx)
  writes under ``RMQ_DURABILITY_TRACE=1`` only after a sync call returned 0.
* :func:`result_line`: the one-line JSON result (RELIABILITY.md §4.4) plus the headline.
"""
from __future__ import annotations

import json
import os
import random
import struct
import threading
import time
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Optional

from rmq._core import commitlog as cl
from rmq._core.layout import CHECKPOINT_MASTER_FLUSHED_OFFSET_OFFSET
from rmq.client.remoting import RemotingClient
from rmq.errors import RemotingError
from rmq.protocol import Frame, RequestCode, ResponseCode

PAGE = 4096
CHECKPOINT_FLUSHED_AT = CHECKPOINT_MASTER_FLUSHED_OFFSET_OFFSET      # the checkpoint's flushed CommitLog offset
_ID = struct.Struct(">II")           # producer, seq
# replies meaning "written, but not durable / not replicated in time": the outcome is unknown
INDETERMINATE_CODES = {ResponseCode.FLUSH_DISK_TIMEOUT, ResponseCode.FLUSH_SLAVE_TIMEOUT,
                       ResponseCode.SLAVE_NOT_AVAILABLE}


def fault_seed(default: int) -> int:
    """The run's seed: ``RMQ_FAULT_SEED`` if set, else ``default``."""
    v = os.environ.get("RMQ_FAULT_SEED")
    return int(v) if v not in (None, "") else default


# -- payloads ------------------------------------------------------------------------------------
def make_payload(producer: int, seq: int, rng: random.Random, max_random: int = 200) -> bytes:
    """id (8 bytes) + 16..max_random seeded random bytes + CRC32 of everything before it (4 bytes)."""
    head = _ID.pack(producer, seq) + rng.randbytes(rng.randint(16, max_random))
    return head + struct.pack(">I", zlib.crc32(head))


def parse_payload(body: bytes) -> Optional[tuple[int, int]]:
    """The ``(producer, seq)`` of a payload, None when it is too short or its CRC fails."""
    if len(body) < _ID.size + 4:
        return None
    head, crc = body[:-4], struct.unpack(">I", body[-4:])[0]
    if zlib.crc32(head) != crc:
        return None
    return _ID.unpack(head[:_ID.size])


# -- history -------------------------------------------------------------------------------------
@dataclass
class Op:
    producer: int
    seq: int
    queue: int
    invoke_t: float
    status: str = "invoke"          # invoke (no outcome yet: counts as info) / ok / fail / info
    end_t: float = 0.0
    code: int = -1
    detail: str = ""
    phys_offset: int = -1           # CommitLog offset of an acknowledged message (its reply's msgId)


class History:
    """Every send, in invocation order, with monotonic timestamps (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.ops: dict[tuple[int, int], Op] = {}
        self.events: list[tuple[float, str, int, int, int, int]] = []   # (t, type, producer, seq, queue, code)

    def invoke(self, producer: int, seq: int, queue: int) -> Op:
        t = time.monotonic()
        op = Op(producer, seq, queue, t)
        with self._lock:
            self.ops[(producer, seq)] = op
            self.events.append((t, "invoke", producer, seq, queue, -1))
        return op

    def complete(self, op: Op, status: str, code: int = -1, detail: str = "") -> None:
        t = time.monotonic()
        with self._lock:
            op.status, op.end_t, op.code, op.detail = status, t, code, detail
            self.events.append((t, status, op.producer, op.seq, op.queue, code))

    def max_acked_offset(self) -> int:
        """The highest CommitLog offset of an acknowledged send (-1: none)."""
        with self._lock:
            return max((op.phys_offset for op in self.ops.values() if op.status == "ok"), default=-1)

    def count(self, status: str) -> int:
        with self._lock:
            return sum(1 for op in self.ops.values() if op.status == status)

    def dump(self, path: str) -> None:
        """The history as tab-separated lines: t, type, producer, seq, queue, code."""
        with self._lock, open(path, "w") as f:
            for e in self.events:
                f.write("\t".join(str(x) for x in e) + "\n")


# -- workload ------------------------------------------------------------------------------------
def send_frame(topic: str, queue: int, body: bytes) -> Frame:
    return Frame(RequestCode.SEND_MESSAGE, fields={
        "producerGroup": "fault-pg", "topic": topic, "queueId": queue, "properties": {},
        "bornTimestamp": int(time.time() * 1000)}, bodies=[body])


class Workload:
    """K producer threads x Q queues sending to ``addr`` until :meth:`stop`.

    Producer ``p`` draws its queues and payload bytes from ``Random(f"{seed}/{p}/{epoch}")``;
    sequence numbers continue across :meth:`start` calls (``epoch`` = how many runs so far).
    Sends are strictly sequential per producer (a new send only after the last one's outcome),
    so "send order" per producer and queue is the seq order.
    """

    def __init__(self, history: History, topic: str = "FaultTopic", producers: int = 4, queues: int = 4,
                 seed: int = 0, timeout_ms: int = 3000, max_random: int = 200):
        self.history = history
        self.topic = topic
        self.producers = producers
        self.queues = queues
        self.seed = seed
        self.timeout_ms = timeout_ms
        self.max_random = max_random
        self.next_seq = [0] * producers
        self.epoch = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self, addr: str) -> None:
        self._stop.clear()
        self._threads = [threading.Thread(target=self._run, args=(p, addr, self.epoch), daemon=True,
                                          name=f"fault-producer-{p}") for p in range(self.producers)]
        self.epoch += 1
        for t in self._threads:
            t.start()

    def stop(self, join_s: float = 30.0) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(join_s)
        self._threads = []

    def _run(self, p: int, addr: str, epoch: int) -> None:
        rng = random.Random(f"{self.seed}/{p}/{epoch}")
        with RemotingClient() as c:
            while not self._stop.is_set():
                seq = self.next_seq[p]
                self.next_seq[p] = seq + 1
                q = rng.randrange(self.queues)
                body = make_payload(p, seq, rng, self.max_random)
                op = self.history.invoke(p, seq, q)
                try:
                    r = c.invoke(addr, send_frame(self.topic, q, body), self.timeout_ms)
                except RemotingError as e:          # timeout / connection loss: indeterminate
                    self.history.complete(op, "info", -1, type(e).__name__)
                    time.sleep(0.05)
                    continue
                if r.code == ResponseCode.SUCCESS:
                    # the offset msgId ends with the record's CommitLog offset (16 hex digits, SPEC.md §1.8)
                    op.phys_offset = int(str(r.fields.get("msgId", ""))[-16:] or "-1", 16)
                    self.history.complete(op, "ok", r.code)
                elif r.code in INDETERMINATE_CODES:
                    self.history.complete(op, "info", r.code, r.remark or "")
                else:
                    self.history.complete(op, "fail", r.code, r.remark or "")
                    time.sleep(0.01)


# -- reading back --------------------------------------------------------------------------------
def pull_frame(topic: str, queue: int, offset: int, max_nums: int = 256) -> Frame:
    return Frame(RequestCode.PULL_MESSAGE, fields={
        "consumerGroup": "fault-cg", "topic": topic, "queueId": queue, "queueOffset": offset,
        "maxMsgNums": max_nums, "sysFlag": 0, "suspendTimeoutMillis": 0, "subscription": "*",
        "commitOffset": -1})


def read_queue(c: RemotingClient, addr: str, topic: str, queue: int, deadline_s: float = 60.0):
    """Every message of one queue from offset 0: list of (queue_offset, body); plus the pull
    replies that were neither FOUND nor the end (codes, for the report)."""
    out, off, odd = [], 0, []
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        r = c.invoke(addr, pull_frame(topic, queue, off), 10_000)
        if r.code == ResponseCode.SUCCESS:
            for m in cl.decode_records(bytes(r.bodies[0])):
                out.append((m.queue_offset, bytes(m.body)))
            off = r.fields["nextBeginOffset"]
        elif r.code == ResponseCode.PULL_RETRY_IMMEDIATELY:
            if r.fields.get("nextBeginOffset", off) == off:
                odd.append(r.code)
                return out, odd
            off = r.fields["nextBeginOffset"]
        elif r.code == ResponseCode.PULL_OFFSET_MOVED and r.fields.get("nextBeginOffset", off) > off:
            odd.append(r.code)
            off = r.fields["nextBeginOffset"]
        else:
            if r.code != ResponseCode.PULL_NOT_FOUND:
                odd.append(r.code)
            return out, odd
    raise AssertionError(f"reading queue {queue} of {topic} did not finish in {deadline_s} s")


def read_all(addr: str, topic: str, queues: int, deadline_s: float = 60.0) -> dict[int, list]:
    """``{queue: [(queue_offset, body), ...]}`` for every queue."""
    with RemotingClient() as c:
        return {q: read_queue(c, addr, topic, q, deadline_s)[0] for q in range(queues)}


def wait_readable(addr: str, topic: str, queues: int, history: History, timeout_s: float = 60.0) -> dict:
    """Read until every acked send is visible or ``timeout_s`` passed (reput catches up after a
    restart); returns the last read.  The checker judges what is missing."""
    end = time.monotonic() + timeout_s
    while True:
        reads = read_all(addr, topic, queues)
        ids = {parse_payload(b) for msgs in reads.values() for _, b in msgs}
        missing = sum(1 for k, op in history.ops.items() if op.status == "ok" and k not in ids)
        if not missing or time.monotonic() > end:
            return reads
        time.sleep(0.2)


# -- checker (RELIABILITY.md §2.2) ---------------------------------------------------------------
def check(history: History, reads: dict[int, list]) -> dict:
    """Counts over one history and one full read of every queue.

    lost: acked, never read.  unexpected: never sent, bad CRC, or read from another queue than
    it was sent to.  aborted_reads: read although its send definitely failed.
    dup_acked / dup_indeterminate: ids read more than once whose send was acked / indeterminate.
    reordered: per producer and queue, acked ids read out of send order.
    inconsistent_offsets: one queue offset holding two different ids (never possible in one read,
    kept for multi-read use).  indeterminate_visible: "X/Y" info sends later read.
    """
    ops = history.ops
    seen: Counter = Counter()
    unexpected = 0
    per_pq: dict[tuple[int, int], list[int]] = defaultdict(list)     # (producer, queue) -> seqs read
    offsets: dict[tuple[int, int], tuple] = {}
    inconsistent = 0
    for q, msgs in reads.items():
        for qo, body in msgs:
            mid = parse_payload(body)
            op = ops.get(mid) if mid is not None else None
            prev = offsets.setdefault((q, qo), mid)
            if prev != mid:
                inconsistent += 1
            if op is None or op.queue != q:
                unexpected += 1
                continue
            seen[mid] += 1
            per_pq[(op.producer, q)].append(op.seq)
    lost = [k for k, op in ops.items() if op.status == "ok" and seen[k] == 0]
    aborted = sum(1 for k, op in ops.items() if op.status == "fail" and seen[k] > 0)
    dup_acked = sum(1 for k, op in ops.items() if op.status == "ok" and seen[k] > 1)
    indet = [k for k, op in ops.items() if op.status in ("info", "invoke")]
    dup_indet = sum(1 for k in indet if seen[k] > 1)
    indet_visible = sum(1 for k in indet if seen[k] > 0)
    reordered = 0
    for (p, q), seqs in per_pq.items():
        hi = -1
        first = set()
        for s in seqs:
            if s in first or ops[(p, s)].status != "ok":
                continue
            first.add(s)
            if s < hi:
                reordered += 1
            hi = max(hi, s)
    return {"invoked": len(ops), "acked": sum(1 for op in ops.values() if op.status == "ok"),
            "failed": sum(1 for op in ops.values() if op.status == "fail"),
            "indeterminate": len(indet), "read": sum(len(m) for m in reads.values()),
            "lost": len(lost), "lost_ids": sorted(lost)[:10], "unexpected": unexpected,
            "aborted_reads": aborted, "dup_acked": dup_acked, "dup_indeterminate": dup_indet,
            "reordered": reordered, "inconsistent_offsets": inconsistent,
            "indeterminate_visible": f"{indet_visible}/{len(indet)}"}


def result_line(test: str, seed: int, headline: str, verdict_ok: bool, **fields) -> dict:
    """Print the one-line JSON result (RELIABILITY.md §4.4) and the headline figure."""
    rec = {"test": test, "seed": seed, **fields, "verdict": "PASS" if verdict_ok else "FAIL"}
    print(json.dumps(rec, sort_keys=False, default=str), flush=True)
    print(headline, flush=True)
    return rec


# -- power-cut simulator (T1b) -------------------------------------------------------------------
JOURNAL = ".durable"


@dataclass
class Durability:
    """What the journal says survives a power cut."""
    durable: dict[str, int] = field(default_factory=dict)      # file -> bytes durable from 0
    whole: set = field(default_factory=set)                      # files fsync'd whole
    created: dict[str, int] = field(default_factory=dict)       # file -> journal line of its creation
    dir_synced: dict[str, int] = field(default_factory=dict)    # dir -> journal line of its last fsync


def read_journal(store: str) -> Durability:
    d = Durability()
    path = os.path.join(store, JOURNAL)
    if not os.path.exists(path):
        return d
    ranges: dict[str, list[tuple[int, int]]] = defaultdict(list)
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        for n, line in enumerate(f):
            parts = line.rstrip("\n").split(" ")
            if len(parts) < 2:
                continue          # a line cut by the kill
            kind = parts[0]
            if kind == "R" and len(parts) == 4:
                try:
                    ranges[parts[1]].append((int(parts[2]), int(parts[3])))
                except ValueError:
                    continue
            elif kind == "F":
                d.whole.add(parts[1])
            elif kind == "C":
                d.created[parts[1]] = n
                ranges.pop(parts[1], None)       # a new file under an old name starts from nothing
                d.whole.discard(parts[1])
            elif kind == "D":
                d.dir_synced[parts[1]] = n
    for name, rs in ranges.items():
        end = 0
        for a, b in sorted(rs):
            if a <= end:
                end = max(end, b)
        d.durable[name] = end
    return d


def _store_files(store: str):
    for root, _dirs, files in os.walk(store):
        for n in files:
            if n == JOURNAL or n.endswith(".ipc") or n == "broker.conf":
                continue
            yield os.path.join(root, n)


def acked_commitlog_end(store: str, history: History, file_size: int) -> int:
    """The CommitLog offset below which every byte is durable by what the *test* saw: under
    SYNC_FLUSH a SEND_OK comes only once the CommitLog is flushed past its record (flushes are
    sequential), so the end of the highest acknowledged record bounds what a power cut may not
    touch.  The record's length is read from the (dead) store before any damage.  0 with no ack."""
    top = history.max_acked_offset()
    if top < 0:
        return 0
    path = os.path.join(store, "commitlog", "%020d" % (top - top % file_size))
    with open(path, "rb") as f:
        f.seek(top % file_size)
        size = struct.unpack(">i", f.read(4))[0]
    assert size > 0, f"acknowledged record at {top} has size {size}"
    return top + size


def power_cut(store: str, rng: random.Random, snapshots: Optional[dict] = None,
              garble_paths: tuple = ("commitlog",), commitlog_durable: Optional[int] = None) -> dict:
    """Rewrite a dead store as a power cut could have left it (every process must be dead).

    What is durable is bounded independently of the code under test where the test can: with
    ``commitlog_durable`` (:func:`acked_commitlog_end`), every CommitLog page at or above it is
    fair game whatever the journal says, and bytes below it are kept only as far as the journal
    saw them synced (so an ack sent before its fsync still loses data here).  Files the journal never
    heard of (nothing synced them through the wrapper) are fair game on every page.  Other files
    follow the journal (``STORE/.durable``, written by the sync wrapper only after a sync returned
    0): bytes below the durable offset kept, whole-file fsync'd files (JSON metadata, markers)
    kept, a file created since the last fsync of its directory removed (never a CommitLog file
    holding acknowledged bytes).  Fair-game pages are independently kept, zeroed, reverted (to
    ``snapshots[file]`` if given, else zero) or, for files under one of ``garble_paths``, filled
    with random bytes; one page (over all files) is torn: half old content, half new.  The journal
    is then reset to "everything on disk is durable" (the disk is what it is now).

    JSON config files and the epoch file are the exception: written atomically (old or new
    whole), a cut may revert them to their ``snapshots`` version; their ``.bak`` copies are fair
    game.

    Returns counts of what was done.
    """
    d = read_journal(store)
    stats = Counter()
    if commitlog_durable is not None:
        # the checkpoint records a flushed offset; a cut that loses CommitLog bytes up to it loses
        # the checkpoint write that followed that flush too: it goes back to its previous version
        # (the snapshot), and what that version records stays (it survived the previous cut)
        ckpt = os.path.abspath(os.path.join(store, "checkpoint"))
        prev = (snapshots or {}).get(ckpt)
        if prev is None:
            with open(ckpt, "rb") as f:
                prev = f.read()
        else:
            with open(ckpt, "wb") as f:
                f.write(prev)
            stats["checkpoint_reverted"] += 1
        flushed = struct.unpack(">q", prev[CHECKPOINT_FLUSHED_AT:CHECKPOINT_FLUSHED_AT + 8])[0]
        commitlog_durable = max(commitlog_durable, flushed)
    torn_candidates = []
    for path in sorted(_store_files(store)):
        ap = os.path.abspath(path)
        size = os.path.getsize(path)
        in_commitlog = os.path.basename(os.path.dirname(ap)) == "commitlog" and os.path.basename(ap).isdigit()
        acked_here = 0
        if in_commitlog and commitlog_durable is not None:
            acked_here = max(0, min(commitlog_durable - int(os.path.basename(ap)), size))
        created_at = d.created.get(ap)
        if acked_here == 0 and created_at is not None and d.dir_synced.get(os.path.dirname(ap), -1) < created_at:
            os.unlink(path)
            stats["files_removed"] += 1
            continue
        if ap == os.path.abspath(os.path.join(store, "checkpoint")) and commitlog_durable is not None:
            continue                                   # handled above
        if (ap.endswith(".json") and os.path.basename(os.path.dirname(ap)) == "config") or \
                os.path.basename(ap) == "epochFileCheckpoint":
            # written old-or-new by construction (rmq.store.config_manager.write_file_atomically,
            # rmq.store.epoch.EpochFile: fsync'd FILE.tmp renamed over FILE, the directory
            # fsync'd; the journal cannot follow the rename): a cut leaves the previous version or
            # this one, never a mix
            prev = (snapshots or {}).get(ap)
            if prev is not None and rng.random() < 0.5:
                with open(path, "wb") as f:
                    f.write(prev)
                stats["config_files_reverted"] += 1
            continue
        if in_commitlog and commitlog_durable is not None:
            # the lower of two bounds: what the test saw acknowledged (pages past it are fair game
            # whatever the journal says) and what the sync journal saw made durable (an ack that
            # came before its fsync leaves acknowledged bytes unprotected, as a real cut would)
            durable = min(acked_here, d.durable.get(ap, 0))
            stats["commitlog_pages_past_acked"] += max(0, size - acked_here) // PAGE
        elif ap in d.whole:
            continue
        elif ap not in d.durable and ap not in d.created:
            durable = 0                                # the journal knows nothing of it: every page
            stats["untracked_files_damaged"] += 1
        else:
            durable = min(d.durable.get(ap, 0), size)
        if durable >= size:
            continue
        garble = any(f"/{g}/" in ap or ap.endswith("/" + g) for g in garble_paths)
        old = (snapshots or {}).get(ap)
        with open(path, "r+b") as f:
            first = durable - durable % PAGE
            if durable % PAGE:
                # the page holding the durable offset: bytes below it stay, the rest is fate
                f.seek(first)
                page = bytearray(f.read(PAGE))
                keep = durable - first
                choice = rng.randrange(3)
                if choice == 1:
                    page[keep:] = bytes(len(page) - keep)
                elif choice == 2 and garble:
                    page[keep:] = rng.randbytes(len(page) - keep)
                f.seek(first)
                f.write(page)
                first += PAGE
            for pos in range(first, size, PAGE):
                n = min(PAGE, size - pos)
                f.seek(pos)
                cur = f.read(n)
                if not any(cur) and not (old and any(old[pos:pos + n])):
                    continue        # never written (preallocated zeros): nothing can change
                torn_candidates.append((path, pos, n))
                choice = rng.randrange(4 if garble else 3)
                if choice == 0:
                    stats["pages_kept"] += 1
                    continue
                if choice == 1:
                    new = bytes(n)
                    stats["pages_zeroed"] += 1
                elif choice == 2:
                    new = old[pos:pos + n] if old and len(old) >= pos + n else bytes(n)
                    stats["pages_reverted"] += 1
                else:
                    new = rng.randbytes(n)
                    stats["pages_garbled"] += 1
                f.seek(pos)
                f.write(new)
    if torn_candidates:
        path, pos, n = rng.choice(torn_candidates)
        with open(path, "r+b") as f:
            f.seek(pos)
            cur = f.read(n)
            old = (snapshots or {}).get(os.path.abspath(path))
            prev = old[pos:pos + n] if old and len(old) >= pos + n else bytes(n)
            half = n // 2
            # torn write: one half made it, the other did not (which half: seeded)
            new = cur[:half] + prev[half:] if rng.random() < 0.5 else prev[:half] + cur[half:]
            f.seek(pos)
            f.write(new)
        stats["pages_torn"] += 1
    # what is on disk now is durable: a later cut cannot take it away
    with open(os.path.join(store, JOURNAL), "w") as f:
        for path in _store_files(store):
            f.write(f"R {os.path.abspath(path)} 0 {os.path.getsize(path)}\n")
        for root, _dirs, _files in os.walk(store):
            f.write(f"D {os.path.abspath(root)}\n")
    return dict(stats)


def snapshot(store: str) -> dict:
    """Contents of every store file (the "old" state a later cut may revert pages to)."""
    out = {}
    for path in _store_files(store):
        with open(path, "rb") as f:
            out[os.path.abspath(path)] = f.read()
    return out
