"""Drive the official RocketMQ C++ client (PyPI ``rocketmq==0.4.4``, librocketmq 1.2.x bundled)
against a NameServer address, in a process of its own: a native crash fails the calling test
instead of killing pytest.  Prints one JSON document on stdout.

    python cpp_client.py produce ADDR TOPIC N          -> {"sent": [{i, status, msg_id, offset}], "seconds"}
    python cpp_client.py pull ADDR TOPIC GROUP         -> {"messages": [...]}
    python cpp_client.py push ADDR TOPIC GROUP N TIMEOUT_S -> {"messages": [...], "seconds" (start to N, or null)}
    python cpp_client.py push-ids ...                  -> the same, each message only {"msg_id"}

``seconds`` (wall, time.perf_counter) is what bench/bench_proxy.py reports.

``--access-key AK --secret-key SK`` anywhere on the line: the client signs its requests (RocketMQ
ACL 1.0, ``set_session_credentials(AK, SK, "")``).  A send or pull that raises prints
``{"sent" | "messages": [...so far], "error": "..."}`` and exits with code 3.

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


CREDENTIALS: list = []          # [access key, secret key] from --access-key / --secret-key
EXIT_CLIENT_ERROR = 3


class ClientFailed(Exception):
    def __init__(self, partial: dict, error: BaseException):
        super().__init__(str(error))
        self.partial = partial


def _credentials(client) -> None:
    if CREDENTIALS:
        client.set_session_credentials(CREDENTIALS[0], CREDENTIALS[1], "")


def produce(addr: str, topic: str, n: int) -> dict:
    p = Producer("PID-cpp-proxy")
    p.set_namesrv_addr(addr)
    _credentials(p)
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
            try:
                r = p.send_sync(m)
            except Exception as e:  # noqa: BLE001 - reported with what was sent so far
                raise ClientFailed({"sent": sent}, e) from None
            sent.append({"i": i, "status": int(r.status), "msg_id": r.msg_id, "offset": r.offset})
        seconds = time.perf_counter() - t0
    finally:
        p.shutdown()
    return {"sent": sent, "seconds": seconds}


def pull(addr: str, topic: str, group: str) -> dict:
    c = PullConsumer(group)
    c.set_namesrv_addr(addr)
    _credentials(c)
    c.start()
    got = []
    try:
        # read each message while its pull result is alive (the binding frees it afterwards)
        for m in c.pull(topic):
            got.append(view(m))
        return {"messages": got}
    except Exception as e:  # noqa: BLE001 - reported with what was read so far
        raise ClientFailed({"messages": got}, e) from None
    finally:
        c.shutdown()


def push(addr: str, topic: str, group: str, n: int, timeout_s: float, ids_only: bool = False) -> dict:
    """``ids_only`` (mode ``push-ids``): the listener reads only each message's id, as a benchmark's
    listener that counts (every field read is a ctypes call into the client)."""
    got, lock = [], threading.Lock()

    def on_message(m):
        v = {"msg_id": m.id} if ids_only else view(m)
        with lock:
            got.append(v)

    c = PushConsumer(group)
    c.set_namesrv_addr(addr)
    _credentials(c)
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


def _take_option(argv: list, name: str):
    if name in argv:
        i = argv.index(name)
        value = argv[i + 1]
        del argv[i:i + 2]
        return value
    return None


if __name__ == "__main__":
    argv = sys.argv[1:]
    ak, sk = _take_option(argv, "--access-key"), _take_option(argv, "--secret-key")
    if ak is not None or sk is not None:
        CREDENTIALS[:] = [ak or "", sk or ""]
    mode, a = argv[0], argv[1:]
    code = 0
    try:
        if mode == "produce":
            out = produce(a[0], a[1], int(a[2]))
        elif mode == "pull":
            out = pull(a[0], a[1], a[2])
        else:
            out = push(a[0], a[1], a[2], int(a[3]), float(a[4]), ids_only=(mode == "push-ids"))
    except ClientFailed as e:
        out, code = dict(e.partial, error=str(e)), EXIT_CLIENT_ERROR
        sys.stderr.write(f"C++ client {mode} failed: {e}\n")
    sys.stdout.write(json.dumps(out))
    sys.stdout.flush()
    sys.exit(code)
