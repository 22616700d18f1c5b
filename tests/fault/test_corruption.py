"""T2 (f): corruption below the durable offset is never truncated away; corrupted records are
never served (RELIABILITY.md §4.2, SPEC.md §5.2).

* A bit flipped in a record in the middle of the CommitLog, below the checkpoint's flushed
  offset (the flush path writes it only after a successful msync), makes recovery raise
  StoreCorruptionError naming the file and position; nothing is truncated; a broker on that
  store exits non-zero with that message.
* The same damage above the durable offset is a torn tail: cut as before.
* A bit flipped under a running broker: the record is never served over the wire
  ("corrupted records served: 0").
"""
import hashlib
import os
import random
import subprocess
import sys

import pytest

from rmq._core import commitlog as cl
from rmq.client.remoting import RemotingClient
from rmq.errors import StoreCorruptionError
from rmq.protocol import ResponseCode
from rmq.store.checkpoint import StoreCheckpoint
from rmq.store.message_store import MessageStore
from tests.conftest import SMALL
from tests.fault.harness import (History, fault_seed, make_payload, parse_payload, pull_frame, result_line,
                                 send_frame)
from tests.integration.cluster import Cluster

pytestmark = pytest.mark.fault
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fill(path, n, rng):
    s = MessageStore(path, **SMALL)
    offs = []
    for i in range(n):
        r = s.put_message("TopicC", make_payload(0, i, rng), i % 2)
        assert r.ok
        offs.append((r.wrote_offset, r.append.wrote_bytes))
    s.shutdown()              # flushed: the checkpoint's flushed offset covers every record
    return offs


def flip(path, phys, rng, size):
    fsize = SMALL["mapped_file_size_commit_log"]
    fn = os.path.join(path, "commitlog", f"{phys - phys % fsize:020d}")
    pos = phys % fsize + rng.randrange(size)
    bit = rng.randrange(8)
    with open(fn, "r+b") as f:
        f.seek(pos)
        b = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([b ^ (1 << bit)]))
    return fn, pos


def digest(path):
    h = hashlib.sha256()
    for root, _d, files in sorted(os.walk(os.path.join(path, "commitlog"))):
        for n in sorted(files):
            with open(os.path.join(root, n), "rb") as f:
                h.update(n.encode() + f.read())
    return h.hexdigest()


def test_bit_flip_below_durable_offset_refuses_start(tmp_path):
    seed = fault_seed(7001)
    rng = random.Random(seed)
    detected = 0
    cases = 12
    for case in range(cases):
        base = str(tmp_path / f"s{case}")
        offs = fill(base, 40, rng)
        durable = StoreCheckpoint(os.path.join(base, "checkpoint"))
        flushed = durable.master_flushed_offset
        durable.shutdown()
        assert flushed == offs[-1][0] + offs[-1][1]
        victim = rng.randrange(1, len(offs) - 1)          # a middle record, not the tail
        fn, _pos = flip(base, offs[victim][0], rng, offs[victim][1])
        before = digest(base)
        with pytest.raises(StoreCorruptionError) as ei:
            MessageStore(base, **SMALL)
        e = ei.value
        assert e.file_name == fn and e.physical_offset == offs[victim][0], (seed, case, str(e))
        assert fn in str(e) and f"position {offs[victim][0] % SMALL['mapped_file_size_commit_log']}" in str(e)
        assert digest(base) == before, "nothing may be truncated or rewritten"
        detected += 1
    result_line("T2f", seed, f"mid-log corruption -> refused start: {detected}/{cases}; "
                             f"acked records lost by tail repair: 0", detected == cases,
                injected=cases, detected=detected)


def test_bit_flip_above_durable_offset_is_a_torn_tail(tmp_path):
    rng = random.Random(fault_seed(7002))
    base = str(tmp_path / "s")
    offs = fill(base, 30, rng)
    cp = StoreCheckpoint(os.path.join(base, "checkpoint"))
    cp.master_flushed_offset = offs[-3][0]       # the last three records were never made durable
    cp.shutdown()
    flip(base, offs[-2][0], rng, offs[-2][1])
    s = MessageStore(base, **SMALL)
    try:
        assert s.get_max_phy_offset() == offs[-2][0]      # cut before the damaged record
        r = s.put_message("TopicC", b"after", 0)
        assert r.ok and r.wrote_offset == offs[-2][0]
    finally:
        s.shutdown()


def test_broker_refuses_to_start_on_corrupted_store(tmp_path):
    rng = random.Random(fault_seed(7003))
    c = Cluster(tmp_path / "store", conf={"flushDiskType": "SYNC_FLUSH",
                                          "mappedFileSizeCommitLog": str(SMALL["mapped_file_size_commit_log"])},
                with_namesrv=False)
    offs = []
    try:
        with RemotingClient() as rc:
            for i in range(60):
                r = rc.invoke(c.broker, send_frame("TopicB", i % 2, make_payload(0, i, rng)), 10_000)
                assert r.code == ResponseCode.SUCCESS
                offs.append(cl.decode_message_id(r.fields["msgId"])[1])
        assert set(c.stop_group().values()) == {0}
    finally:
        c.close()
    victim = offs[len(offs) // 2]
    size = offs[len(offs) // 2 + 1] - victim if offs[len(offs) // 2 + 1] > victim else 64
    fn, _ = flip(c.store_path, victim, rng, min(size, 64))
    p = subprocess.run([sys.executable, "-m", "rmq.actors.broker", "--store-path", c.store_path,
                        "-c", c.conf_path, "--listen-port", "0"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert "ready" not in p.stdout
    assert "StoreCorruptionError" in out and os.path.basename(fn) in out and "durable offset" in out, out[-2000:]
    print("broker exit code on corrupted store:", p.returncode)


def test_corrupted_record_is_never_served(tmp_path):
    seed = fault_seed(7004)
    rng = random.Random(seed)
    fsize = 64 * 1024
    c = Cluster(tmp_path / "store", conf={"flushDiskType": "SYNC_FLUSH", "mappedFileSizeCommitLog": str(fsize)},
                with_namesrv=False)
    history = History()
    served_bad = flipped = 0
    try:
        with RemotingClient() as rc:
            sent = {}
            for i in range(200):
                q = i % 2
                op = history.invoke(0, i, q)
                r = rc.invoke(c.broker, send_frame("TopicS", q, make_payload(0, i, rng)), 10_000)
                assert r.code == ResponseCode.SUCCESS
                history.complete(op, "ok", r.code)
                sent[i] = cl.decode_message_id(r.fields["msgId"])[1]
            # flip one bit in 10 records (header, properties or body) under the running broker:
            # the file is MAP_SHARED, so the broker sees the damaged page
            victims = rng.sample(range(1, 199), 10)
            for v in victims:
                nxt = sent[v + 1] if sent[v + 1] > sent[v] else sent[v] + 100
                fn = os.path.join(c.store_path, "commitlog", f"{sent[v] - sent[v] % fsize:020d}")
                pos = sent[v] % fsize + rng.randrange(4, min(nxt - sent[v], 200))   # not the size field
                with open(fn, "r+b") as f:
                    f.seek(pos)
                    b = f.read(1)[0]
                    f.seek(pos)
                    f.write(bytes([b ^ (1 << rng.randrange(8))]))
                flipped += 1
            served = {}
            codes = []
            for q in (0, 1):
                off = 0
                for _ in range(400):
                    r = rc.invoke(c.broker, pull_frame("TopicS", q, off, 32), 10_000)
                    if r.code == ResponseCode.SUCCESS:
                        for m in cl.decode_records(bytes(r.bodies[0])):
                            mid = parse_payload(bytes(m.body))
                            if mid is None or mid[1] in victims:
                                served_bad += 1
                            served[mid] = m.queue_offset
                        off = r.fields["nextBeginOffset"]
                    else:
                        codes.append(r.code)
                        nxt = r.fields.get("nextBeginOffset", off)
                        if nxt <= off:
                            break
                        off = nxt
            intact_read = sum(1 for i in range(200) if i not in victims and (0, i) in served)
            # a pull stops with an error at a damaged record (it is not skipped silently): what
            # precedes the first damaged record of each queue must have been served
            first_bad = {q: min(v for v in victims if v % 2 == q) for q in (0, 1)}
            missing_before = [i for i in range(200) if i < first_bad[i % 2] and (0, i) not in served]
    finally:
        c.close()
    result_line("T2-read", seed, f"corrupted records served: {served_bad}", served_bad == 0,
                injected=flipped, served_bad=served_bad, intact_served=intact_read, pull_errors=len(codes),
                pull_error_codes=sorted(set(codes)))
    assert served_bad == 0
    assert not missing_before, f"intact records before the damage not served: {missing_before[:10]}"
    assert codes, "the damaged records must show up as pull errors"
