"""kill -9 of the whole broker group at random moments while a producer sends.

Every SEND_OK must be readable after the restart, in queue order, exactly once
per queue offset (SYNC_FLUSH).  Under ASYNC_FLUSH the store must recover to a
consistent prefix: dense queue offsets, no duplicates, every acknowledged
message present (kill -9 keeps the page cache).  Fast tier: 3 cycles; slow
tier (``-m slow``): RMQ_BROKER_KILL9_CYCLES (default 200, RELIABILITY.md T1).
"""
import random
import threading
import time

import pytest

from rmq._core import commitlog as cl
from rmq.client.remoting import RemotingClient, RemotingTimeoutError
from rmq.errors import RemotingConnectionClosedError
from rmq.protocol import ResponseCode
from tests.conftest import env_int
from tests.integration.cluster import Cluster
from tests.integration.test_broker import pull, send

pytestmark = pytest.mark.fault
QUEUES = 4
# a send's timeout: short, as the producer's last send after the kill waits this long (a stall that
# outlasts it only makes that send's outcome unknown: the producer goes on)
SEND_TIMEOUT_MS = 1000


class Producer(threading.Thread):
    """Sends until ``stop``, each body once (its own seq): an acknowledged one is recorded; one the
    broker refused, or whose answer did not come (the kill, or a stall: it may be stored or not), is
    not, and the next seq goes; only ``stop`` ends the thread."""

    def __init__(self, endpoint, start_seq):
        super().__init__(daemon=True)
        self.endpoint = endpoint
        self.seq = start_seq
        self.acks = []          # (seq, queue_id, queue_offset)
        self.indeterminate = 0  # sends with no answer
        self.stop = threading.Event()

    def run(self):
        with RemotingClient() as c:
            while not self.stop.is_set():
                q = self.seq % QUEUES
                seq, self.seq = self.seq, self.seq + 1
                try:
                    r = send(c, self.endpoint, "Crash", b"seq=%08d" % seq, q, timeout_ms=SEND_TIMEOUT_MS)
                except RemotingConnectionClosedError:   # the kill, with the send in flight
                    self.indeterminate += 1
                    self.stop.wait(30)          # the test stops the producer right after the kill
                    continue
                except RemotingTimeoutError:     # no answer in time: a stall, or the kill
                    self.indeterminate += 1
                    continue
                if r.code == ResponseCode.SUCCESS:
                    self.acks.append((seq, q, r.fields["queueOffset"]))


def read_queue(c, endpoint, q):
    out, off = [], 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        r = pull(c, endpoint, "Crash", q, off, max_nums=256)
        if r.code != ResponseCode.SUCCESS:
            return out
        out.extend(cl.decode_records(bytes(r.bodies[0])))
        off = r.fields["nextBeginOffset"]
    raise AssertionError("read did not finish")


def crash_loop(tmp_path, flush_type, cycles, seed):
    rng = random.Random(seed)
    c = Cluster(tmp_path / "store", conf={"flushDiskType": flush_type}, with_namesrv=False)
    acked = []
    seq = 0
    lost_total = 0
    unanswered = 0
    try:
        for cycle in range(cycles):
            p = Producer(c.broker, seq)
            p.start()
            # a random moment, counted in acknowledged sends (not seconds): every cycle checks something
            want = rng.randint(1, 300)
            deadline = time.monotonic() + 60
            while len(p.acks) < want and p.is_alive() and time.monotonic() < deadline:
                time.sleep(0.005)
            assert len(p.acks) >= want, f"cycle {cycle}: {len(p.acks)} of {want} sends acknowledged in 60 s"
            c.kill_group()
            p.stop.set()
            p.join(SEND_TIMEOUT_MS / 1000 + 30)
            assert not p.is_alive()
            acked.extend(p.acks)
            unanswered += p.indeterminate
            seq = p.seq + 1000
            c.start_group()
            # wait until reput caught up with what recovery kept
            with RemotingClient() as rc:
                expected = {}
                for s, q, qo in acked:
                    expected.setdefault(q, {})[qo] = s
                deadline = time.monotonic() + 60
                while True:
                    got = {q: read_queue(rc, c.broker, q) for q in range(QUEUES)}
                    if all(len(got[q]) > max(expected.get(q, {-1: 0})) for q in expected) or \
                            time.monotonic() > deadline:
                        break
                    time.sleep(0.1)
                for q in range(QUEUES):
                    msgs = got[q]
                    assert [m.queue_offset for m in msgs] == list(range(len(msgs))), "offsets dense, in order"
                    bodies = [m.body for m in msgs]
                    assert len(set(bodies)) == len(bodies), "no duplicates"
                    have = {m.queue_offset: int(m.body[4:12]) for m in msgs}
                    lost = [qo for qo, s in expected.get(q, {}).items() if have.get(qo) != s]
                    lost_total += len(lost)
                    assert not lost, f"acknowledged messages lost in queue {q}: {lost[:5]}"
        print(f"\nacked messages lost after {cycles} broker kill -9 cycles ({flush_type}, {len(acked)} acked, "
              f"{unanswered} sends unanswered): {lost_total}")
        return len(acked)
    finally:
        c.close()


@pytest.mark.parametrize("flush_type", ["SYNC_FLUSH", "ASYNC_FLUSH"])
def test_broker_kill9_fast(tmp_path, flush_type):
    assert crash_loop(tmp_path, flush_type, cycles=3, seed=7) >= 3


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("flush_type", ["SYNC_FLUSH", "ASYNC_FLUSH"])
def test_broker_kill9_slow(tmp_path, flush_type):
    cycles = env_int("RMQ_BROKER_KILL9_CYCLES", 200)
    assert crash_loop(tmp_path, flush_type, cycles=cycles, seed=env_int("RMQ_SEED", 11)) >= cycles
