"""T4: disk full on a real (loop-mounted ext4) filesystem, and an injected msync EIO
(RELIABILITY.md §4.2 T4, §5.2).

* Disk full: a 64 MiB ext4 image mounted by the test (root needed; anything else failing is a
  test failure, not a skip).  A filler file leaves room for about one CommitLog file.  Sends
  go on until the CommitLog needs a file it cannot allocate: from then on every send is refused
  with SERVICE_NOT_AVAILABLE "[DISK_FULL] ..." ("writes accepted while full: 0"); no process
  dies (mapped files are posix_fallocate'd before mmap: "SIGBUS crashes: 0"); everything acked
  stays readable; deleting the filler lets sends succeed again without a restart.
* msync EIO: ``RMQ_FAILPOINT=msync_eio:after=N:path=/commitlog/`` makes the flush actor's
  (N+1)th CommitLog msync fail.  No SEND_OK after that: parked SYNC_FLUSH sends get
  FLUSH_DISK_TIMEOUT [FLUSH_FAILED], later ones SERVICE_NOT_AVAILABLE
  ("acks after injected fsync EIO: 0").
"""
import os
import signal
import subprocess
import sys
import time

import pytest

from rmq.client.remoting import RemotingClient
from rmq.protocol import ResponseCode
from tests.fault.harness import (History, Workload, check, fault_seed, make_payload, result_line, send_frame,
                                 wait_readable)
from tests.integration.cluster import Cluster

pytestmark = pytest.mark.fault
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MiB = 1024 * 1024


def _run(*cmd):
    p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} failed ({p.returncode}): {p.stderr.strip() or p.stdout.strip()}")


@pytest.fixture
def ext4_mount(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: the test mounts a loop ext4 image (tmpfs cannot give real ENOSPC/fsync)")
    img, mnt = tmp_path / "disk.img", tmp_path / "mnt"
    mnt.mkdir()
    _run("truncate", "-s", "64M", str(img))
    _run("mkfs.ext4", "-q", "-F", str(img))
    _run("mount", "-o", "loop", str(img), str(mnt))
    try:
        yield str(mnt)
    finally:
        p = subprocess.run(["umount", str(mnt)], capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=120)


def _free_bytes(path):
    st = os.statvfs(path)
    return st.f_bfree * st.f_frsize        # root may use the reserved blocks too


def _dead(c):
    """Processes of the group that died, with their exit codes (negative: signal)."""
    return {n: p.proc.returncode for n, p in c.procs.items() if p.proc.poll() is not None}


def test_disk_full_refuses_then_resumes(ext4_mount):
    seed = fault_seed(4004)
    import random
    rng = random.Random(seed)
    store = os.path.join(ext4_mount, "store")
    conf = {"flushDiskType": "SYNC_FLUSH", "mappedFileSizeCommitLog": str(MiB),
            "mappedFileSizeConsumeQueue": str(20 * 4000), "maxHashSlotNum": "500", "maxIndexNum": "4000"}
    c = Cluster(store, conf=conf, with_namesrv=False)
    history = History()
    filler = os.path.join(ext4_mount, "filler")
    full_refusals = accepted_while_full = 0
    first_refusal = ""
    resumed_after_s = None
    try:
        with RemotingClient() as rc:
            seq = 0

            def send_one():
                nonlocal seq
                q = seq % 4
                op = history.invoke(0, seq, q)
                r = rc.invoke(c.broker, send_frame("DiskFull", q, make_payload(0, seq, rng, 3000)), 20_000)
                seq += 1
                history.complete(op, "ok" if r.code == ResponseCode.SUCCESS else "fail", r.code, r.remark or "")
                return r

            for _ in range(20):
                assert send_one().code == ResponseCode.SUCCESS
            time.sleep(0.5)     # the allocator pre-creates the next CommitLog file
            room = int(1.6 * MiB)
            with open(filler, "wb") as f:
                size = max(_free_bytes(ext4_mount) - room, 0)
                while size > 0:
                    try:
                        os.posix_fallocate(f.fileno(), 0, size)
                        break
                    except OSError:
                        size -= MiB // 4
            # produce until the CommitLog cannot get a new file
            for _ in range(5000):
                r = send_one()
                if r.code != ResponseCode.SUCCESS:
                    first_refusal = f"{r.code} {r.remark}"
                    break
            assert first_refusal, "the disk never filled up"
            assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE and "[DISK_FULL]" in r.remark, first_refusal
            full_refusals = 1
            for _ in range(50):
                r = send_one()
                if r.code == ResponseCode.SUCCESS:
                    accepted_while_full += 1
                else:
                    assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE and "[DISK_FULL]" in r.remark, r.remark
                    full_refusals += 1
            assert not _dead(c), f"processes died while the disk was full: {_dead(c)}"
            full_read = check(history, wait_readable(c.broker, "DiskFull", 4, history, 60))
            # space returns: sends succeed again, no restart
            os.unlink(filler)
            t0 = time.monotonic()
            deadline = t0 + 60
            while time.monotonic() < deadline:
                if send_one().code == ResponseCode.SUCCESS:
                    resumed_after_s = time.monotonic() - t0
                    break
                time.sleep(0.2)
            for _ in range(20):
                send_one()
        final = check(history, wait_readable(c.broker, "DiskFull", 4, history, 60))
        dead = _dead(c)
    finally:
        c.close()
        if os.path.exists(filler):
            os.unlink(filler)
    sigbus = sum(1 for code in dead.values() if code == -signal.SIGBUS)
    ok = (sigbus == 0 and not dead and accepted_while_full == 0 and full_read["lost"] == 0
          and final["lost"] == 0 and resumed_after_s is not None)
    result_line("T4", seed, f"SIGBUS crashes: {sigbus}\nwrites accepted while full: {accepted_while_full}; "
                            f"rejected with DISK_FULL: {full_refusals}", ok,
                acked=final["acked"], lost=final["lost"], lost_while_full=full_read["lost"],
                unexpected=final["unexpected"], sigbus=sigbus, dead=dead, accepted_while_full=accepted_while_full,
                rejected_disk_full=full_refusals, first_refusal=first_refusal[:160],
                resume_ms=round(resumed_after_s * 1000) if resumed_after_s is not None else None)
    assert sigbus == 0 and not dead, dead
    assert accepted_while_full == 0
    assert full_read["lost"] == 0 and final["lost"] == 0, (full_read, final)
    assert resumed_after_s is not None, "sends did not resume after space was freed"


def test_msync_eio_stops_acknowledgements(tmp_path, monkeypatch):
    seed = fault_seed(4005)
    monkeypatch.setenv("RMQ_FAILPOINT", "msync_eio:after=40:path=/commitlog/")
    c = Cluster(tmp_path / "store", conf={"flushDiskType": "SYNC_FLUSH", "syncFlushTimeout": "5000"},
                with_namesrv=False)
    history = History()
    work = Workload(history, "EioTopic", producers=4, queues=4, seed=seed, timeout_ms=10_000)
    try:
        work.start(c.broker)
        deadline = time.monotonic() + 60
        failed_at = None
        while time.monotonic() < deadline:
            bad = [op for op in list(history.ops.values())
                   if op.status in ("fail", "info") and ("FLUSH_FAILED" in op.detail or "flush failed" in op.detail)]
            if bad:
                failed_at = min(op.end_t for op in bad)
                break
            time.sleep(0.05)
        assert failed_at is not None, "the injected msync EIO never surfaced to a sender"
        time.sleep(2.0)          # keep sending: every one of these must be refused
        work.stop()
        dead = _dead(c)
    finally:
        work.stop()
        c.close()
    ops = list(history.ops.values())
    # exact, race-free: a send invoked after a failure reply was received reached a broker that
    # already knew; none of them may be acknowledged
    acks_after = sum(1 for op in ops if op.status == "ok" and op.invoke_t > failed_at)
    refused_after = sum(1 for op in ops if op.invoke_t > failed_at and op.status != "ok")
    codes = sorted({op.code for op in ops if op.invoke_t > failed_at})
    result_line("T4-eio", seed, f"acks after injected fsync EIO: {acks_after}", acks_after == 0,
                acked_before=sum(1 for op in ops if op.status == "ok"), acks_after=acks_after,
                refused_after=refused_after, codes_after=codes, dead=dead)
    assert acks_after == 0
    assert refused_after > 0
    assert set(codes) <= {ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.FLUSH_DISK_TIMEOUT}, codes


def test_failed_msync_moves_no_durable_offset(tmp_path):
    """In-process check of the wrapper: after an (injected) EIO nothing is journaled as durable,
    ``durable_position`` and ``flushed_position`` stay, and the failure is sticky."""
    code = r'''
import os, sys
from rmq._core.mapped_file import MappedFile
from rmq.errors import StoreError
d = sys.argv[1]
open(os.path.join(d, "lock"), "w").close()
mf = MappedFile(os.path.join(d, "00000000000000000000"), 65536)
mf.append(b"a" * 5000); mf.flush()
assert mf.durable_position == 5000, mf.durable_position
mf.append(b"b" * 5000)
try:
    mf.flush(); raise SystemExit("no error")
except StoreError as e:
    assert "Input/output error" in str(e), e
assert mf.durable_position == 5000 and mf.flushed_position == 5000 and mf.write_error
try:
    mf.flush(); raise SystemExit("not sticky")
except StoreError:
    pass
print("ok")
'''
    env = {**os.environ, "RMQ_DURABILITY_TRACE": "1", "RMQ_FAILPOINT": "msync_eio:after=1"}
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr
    with open(tmp_path / ".durable") as f:
        lines = f.read().split("\n")
    path = os.path.abspath(tmp_path / "00000000000000000000")
    assert f"R {path} 0 5000" in lines
    assert not [ln for ln in lines if ln.startswith(f"R {path}") and not ln.endswith(" 0 5000")]
    assert f"C {path}" in lines and f"D {os.path.abspath(tmp_path)}" in lines
