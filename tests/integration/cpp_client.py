"""Drive the official RocketMQ C++ client (PyPI ``rocketmq==0.4.4``, librocketmq 1.2.x bundled)
against a NameServer address, in a process of its own: a native crash fails the calling test
instead of killing pytest.  Prints one JSON document on stdout.

    python cpp_client.py produce ADDR TOPIC N          -> {"sent": [{i, status, msg_id, offset}], "seconds"}
    python cpp_client.py pull ADDR TOPIC GROUP         -> {"messages": [...]}
    python cpp_client.py push ADDR TOPIC GROUP N TIMEOUT_S -> {"messages": [...], "seconds" (start to N, or null)}

``seconds`` (wall, time.perf_counter) is what bench/bench_proxy.py reports.

Messages produced: body ``cpp-<i>`` (every 100th padded past 4 KiB, which the client compresses),
tag ``T<i % 3>``, keys ``k<i>``, user property ``seq=<i>``.
"""
import json
import sys
import threading
import time

from rocketmq.client import Message, Producer, PullConsumer, PushConsumer

BIG_EVERY = 100
BIG_PAD = 5000


def body_of(i: int) -> bytes:
    return b"cpp-%d" % i + (b"." * BIG_PAD if i % BIG_EVERY == 0 else b"")


def view(m) -> dict:
    return {"body": m.body.decode("latin-1"), "tags": (m.tags or b"").decode(), "keys": (m.keys or b"").decode(),
            "seq": (m.get_property("seq") or b"").decode(), "msg_id": m.id, "queue_id": m.queue_id,
            "queue_offset": m.queue_offset, "topic": m.topic}


def produce(addr: str, topic: str, n: int) -> dict:
    p = Producer("PID-cpp-proxy")
    p.set_namesrv_addr(addr)
    p.start()
    sent = []
    t0 = time.perf_counter()
    try:
        for i in range(n):
            m = Message(topic)
            m.set_keys("k%d" % i)
            m.set_tags("T%d" % (i % 3))
            m.set_property("seq", str(i))
            m.set_body(body_of(i))
            r = p.send_sync(m)
            sent.append({"i": i, "status": int(r.status), "msg_id": r.msg_id, "offset": r.offset})
        seconds = time.perf_counter() - t0
    finally:
        p.shutdown()
    return {"sent": sent, "seconds": seconds}


def pull(addr: str, topic: str, group: str) -> dict:
    c = PullConsumer(group)
    c.set_namesrv_addr(addr)
    c.start()
    try:
        # read each message while its pull result is alive (the binding frees it afterwards)
        return {"messages": [view(m) for m in c.pull(topic)]}
    finally:
        c.shutdown()


def push(addr: str, topic: str, group: str, n: int, timeout_s: float) -> dict:
    got, lock = [], threading.Lock()

    def on_message(m):
        with lock:
            got.append(view(m))

    c = PushConsumer(group)
    c.set_namesrv_addr(addr)
    c.subscribe(topic, on_message)
    t0 = time.perf_counter()
    c.start()
    seconds = None
    try:
        end = time.time() + timeout_s
        while time.time() < end:
            with lock:
                if len(got) >= n:
                    seconds = time.perf_counter() - t0
                    break
            time.sleep(0.01)
        time.sleep(1.0)          # duplicates arriving after the last new message are counted too
    finally:
        c.shutdown()
    return {"messages": got, "seconds": seconds}


if __name__ == "__main__":
    mode, a = sys.argv[1], sys.argv[2:]
    if mode == "produce":
        out = produce(a[0], a[1], int(a[2]))
    elif mode == "pull":
        out = pull(a[0], a[1], a[2])
    else:
        out = push(a[0], a[1], a[2], int(a[3]), float(a[4]))
    sys.stdout.write(json.dumps(out))
    sys.stdout.flush()
