"""Client-side worker processes of the soak tests: ``python -m tests.soak.worker '<json config>'``.

A worker talks to the test over its standard streams: it writes one event per line on stdout,
``@@ {"ev": ..., ...}`` (``ready``, ``progress`` about once a second, ``done``, and role-specific
ones), and reads commands on stdin, one per line (``go``, ``stop``, ``stall``, ``resume``,
``readback``, ``close``).  Anything else on stdout is ignored; stderr goes to a file the test
shows when a worker fails.  Large results (which sequence numbers were acknowledged or consumed,
latencies) go to files whose paths the ``done`` event names.

Roles (``"role"`` in the config):

* ``producer``: one :class:`rmq.Producer` with the default options, ``send_async`` of 100 B
  bodies (``body_of(pid, seq)``); ``rate`` msgs/s paced in 5 ms steps, or as fast as
  ``send_async`` accepts them (``rate`` 0: the capacity measurement); until ``seconds`` have
  passed or ``stop``.  Writes the bitmap of acknowledged sequence numbers.
* ``consumer``: ``n`` :class:`rmq.PushConsumer` of one group (default options, from the first
  offset), a listener that records every (pid, seq) it sees in bitmaps; ``stall`` makes the
  listener block (the consume threads wait, the process queues fill, pulling stops: a consumer
  that stops reading), ``resume`` lets it go on.
* ``connections``: ``producers`` Producers and ``consumers`` PullConsumers in this process,
  each its own connection (its own sockets), all connected at once; each producer sends
  ``msgs`` messages; on ``readback`` the consumers pull every acknowledged one back by queue
  offset; on ``close`` everything is closed.
* ``raw``: SEND_MESSAGE requests built by the producer's own code (``prepare_message`` /
  ``send_request``: the bytes a Producer sends) over one DEALER, without the Producer's
  in-flight limits (RocketMQ's async client admits 65,536 requests in flight).  ``closed``
  mode keeps ``window`` requests in flight (the capacity measurement); ``open`` mode offers
  ``rate`` requests/s whatever the answers (the overload).  Every answer's code and latency
  (handed to the socket -> answer) is recorded; SUCCESS answers' (seq, queue, offset) go to a file.
"""
from __future__ import annotations

import array
import collections
import json
import os
import struct
import sys
import threading
import time

BODY_SIZE = 100
_HEAD = struct.Struct(">IQ")            # producer id, sequence number: the first 12 bytes of a body
PROGRESS_INTERVAL_S = 1.0
PACE_STEP_S = 0.005                     # a paced producer sends what is due, then sleeps this long
CLIENT_TIMEOUT_MS = 3000                # the Producer's default send_msg_timeout_ms


def body_of(pid: int, seq: int, size: int = BODY_SIZE) -> bytes:
    head = _HEAD.pack(pid, seq)
    return head + b"s" * (size - len(head))


def id_of(body: bytes) -> tuple:
    """(pid, seq) of a body made by :func:`body_of`."""
    return _HEAD.unpack_from(body, 0)


class Bitmap:
    """A growable set of small non-negative integers (sequence numbers), one bit each."""

    def __init__(self, data: bytes = b""):
        self.bits = bytearray(data)

    def add(self, i: int) -> bool:
        """Set bit ``i``; True if it was not set."""
        byte, bit = i >> 3, 1 << (i & 7)
        if byte >= len(self.bits):
            self.bits.extend(bytes(max(byte + 1 - len(self.bits), len(self.bits))))
        if self.bits[byte] & bit:
            return False
        self.bits[byte] |= bit
        return True

    def count(self) -> int:
        return int.from_bytes(self.bits, "little").bit_count() if self.bits else 0

    def missing_from(self, other: Bitmap) -> tuple:
        """(how many members of ``other`` are not in this set, the first 20 of them)."""
        miss = int.from_bytes(other.bits, "little") & ~int.from_bytes(self.bits, "little")
        n = miss.bit_count()
        first = []
        while miss and len(first) < 20:
            first.append((miss & -miss).bit_length() - 1)
            miss &= miss - 1
        return n, first

    def save(self, path: str) -> str:
        with open(path, "wb") as f:
            f.write(self.bits)
        return path

    @classmethod
    def load(cls, path: str) -> Bitmap:
        with open(path, "rb") as f:
            return cls(f.read())


# -- plumbing -------------------------------------------------------------------------------------
_out_lock = threading.Lock()


def emit(ev: str, **fields) -> None:
    fields["ev"] = ev
    fields.setdefault("t", time.monotonic())
    line = "@@ " + json.dumps(fields) + "\n"
    with _out_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


class Commands(threading.Thread):
    """Reads stdin: each command sets an event (``go``, ``stop``, ``readback``, ``close``);
    ``stall`` / ``resume`` clear / set ``gate``.  End of input counts as ``stop``."""

    NAMES = ("go", "stop", "readback", "close")

    def __init__(self):
        super().__init__(name="soak-commands", daemon=True)
        self.events = {n: threading.Event() for n in self.NAMES}
        self.gate = threading.Event()
        self.gate.set()
        self.start()

    def run(self) -> None:
        for line in sys.stdin:
            cmd = line.strip()
            if cmd in self.events:
                self.events[cmd].set()
            elif cmd == "stall":
                self.gate.clear()
            elif cmd == "resume":
                self.gate.set()
        self.gate.set()
        self.events["stop"].set()
        self.events["close"].set()

    def wait(self, name: str) -> None:
        self.events[name].wait()


def error_key(exc: BaseException) -> str:
    code = getattr(exc, "response_code", None)
    return f"{type(exc).__name__}(code {code})" if code is not None else type(exc).__name__


def pct(sorted_vals, q: float) -> float:
    if not len(sorted_vals):
        return float("nan")
    return sorted_vals[min(len(sorted_vals) - 1, int(q * (len(sorted_vals) - 1) + 0.5))]


# -- producer ------------------------------------------------------------------------------------------
def run_producer(cfg: dict, cmds: Commands) -> None:
    from rmq import Message, Producer

    topic, pid = cfg["topic"], int(cfg["pid"])
    rate, seconds = float(cfg.get("rate", 0)), float(cfg.get("seconds", 0))
    acked = Bitmap()
    st = {"acked": 0, "errors": 0}
    errors: collections.Counter = collections.Counter()
    first_errors: list = []
    bursts: list = []                           # [monotonic s of the first error, errors] (1 s apart)

    def on_done(fut, seq):                      # in the producer's I/O thread
        exc = fut.exception()
        if exc is None:
            if acked.add(seq):
                st["acked"] += 1
        else:
            st["errors"] += 1
            errors[error_key(exc)] += 1
            now = time.monotonic()
            if bursts and now - bursts[-1][2] < 1.0:
                bursts[-1][1] += 1
                bursts[-1][2] = now
            elif len(bursts) < 50:
                bursts.append([now, 1, now])
            if len(first_errors) < 5:
                first_errors.append(f"seq {seq}: {exc!r}"[:300])

    p = Producer(cfg["namesrv"], group=cfg.get("group", "soak-producer"))
    try:
        p.send(Message(topic, body_of(pid, 0)))     # learns the route; seq 0, acknowledged
        acked.add(0)
        st["acked"] = 1
        seq = 1
        emit("ready")
        cmds.wait("go")
        t0 = time.monotonic()
        next_report = t0 + PROGRESS_INTERVAL_S
        mark = None                              # (t, acked) one second in: the capacity window
        stop = cmds.events["stop"]
        while not stop.is_set():
            now = time.monotonic()
            if seconds and now - t0 >= seconds:
                break
            if rate:
                due = 1 + int((now - t0) * rate)
                while seq < due:
                    p.send_async(Message(topic, body_of(pid, seq)), lambda f, s=seq: on_done(f, s))
                    seq += 1
                time.sleep(PACE_STEP_S)        # pacing, not synchronisation
            else:
                for _ in range(500):
                    p.send_async(Message(topic, body_of(pid, seq)), lambda f, s=seq: on_done(f, s))
                    seq += 1
            if mark is None and now - t0 >= 1.0:
                mark = (now, st["acked"])
            if now >= next_report:
                emit("progress", sent=seq, acked=st["acked"], errors=st["errors"])
                next_report += PROGRESS_INTERVAL_S
        t_end = time.monotonic()
        acked_at_end = st["acked"]
        capacity = ((acked_at_end - mark[1]) / (t_end - mark[0])) if mark and t_end > mark[0] else 0.0
        emit("offer_end", sent=seq)
        unresolved = p.flush(timeout=120)
    finally:
        try:
            p.close(timeout=30)
        except Exception as e:  # noqa: BLE001 - the failed sends are counted already
            first_errors.append(f"close: {e!r}"[:300])
    path = acked.save(os.path.join(cfg["out"], f"producer-{pid}.acked"))
    emit("done", sent=seq, acked=st["acked"], errors=st["errors"], error_kinds=dict(errors),
         first_errors=first_errors, error_bursts=[b[:2] for b in bursts], unresolved=unresolved, elapsed=t_end - t0,
         achieved_rate=(seq - 1) / (t_end - t0) if t_end > t0 else 0.0, capacity=capacity, bitmap=path)


# -- push consumer ------------------------------------------------------------------------------------
def run_consumer(cfg: dict, cmds: Commands) -> None:
    from rmq import PushConsumer

    lock = threading.Lock()
    seen: dict = {}                                # pid -> Bitmap
    st = {"distinct": 0, "deliveries": 0, "blocked": 0}
    gate = cmds.gate

    def listener(msgs, ctx):
        if not gate.is_set():
            with lock:
                st["blocked"] += 1
            gate.wait()                              # a consumer that stopped reading
            with lock:
                st["blocked"] -= 1
        with lock:
            for m in msgs:
                pid, seq = id_of(m.body)
                bm = seen.get(pid)
                if bm is None:
                    bm = seen[pid] = Bitmap()
                st["deliveries"] += 1
                if bm.add(seq):
                    st["distinct"] += 1
        return "CONSUME_SUCCESS"

    consumers = []
    for i in range(int(cfg.get("n", 1))):
        c = PushConsumer(cfg["namesrv"], cfg["group"], consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                         instance_name=f"{cfg['group']}-{os.getpid()}-{i}")
        c.subscribe(cfg["topic"], "*")
        c.register_message_listener(listener)
        c.start()
        consumers.append(c)
    emit("ready")
    stop = cmds.events["stop"]
    while not stop.wait(PROGRESS_INTERVAL_S):
        # queues owned: in all (a queue two consumers both think theirs counts twice) and distinct
        owned = [{mq.queue_id for mq in c.assigned_message_queues(cfg["topic"])} for c in consumers]
        with lock:
            emit("progress", distinct=st["distinct"], deliveries=st["deliveries"], blocked=st["blocked"],
                 stalled=not gate.is_set(), queues=sum(len(o) for o in owned), union=len(set().union(*owned)))
    gate.set()
    for c in consumers:
        c.shutdown()
    with lock:
        paths = {str(pid): bm.save(os.path.join(cfg["out"], f"consumer-{cfg['group']}-{pid}.seen"))
                 for pid, bm in seen.items()}
        emit("done", distinct=st["distinct"], deliveries=st["deliveries"], bitmaps=paths,
             stats=[dict(c.stats) for c in consumers])


# -- many connections -----------------------------------------------------------------------------------
def run_connections(cfg: dict, cmds: Commands) -> None:
    from rmq import Message, Producer, PullConsumer
    from rmq.client.message import PullStatus

    wid, topic = int(cfg["wid"]), cfg["topic"]
    n_prod, n_cons, k = int(cfg["producers"]), int(cfg["consumers"]), int(cfg["msgs"])
    retries = int(cfg.get("retries", 5))
    refused: collections.Counter = collections.Counter()    # definite refusals (a response code)
    unclear: collections.Counter = collections.Counter()    # anything else (timeouts, ...)
    first_errors: list = []

    def note(exc, bucket):
        bucket[error_key(exc)] += 1
        if len(first_errors) < 5:
            first_errors.append(repr(exc)[:300])

    t0 = time.monotonic()
    producers = [Producer(cfg["namesrv"], group=f"soak-conn-p{wid}") for _ in range(n_prod)]
    consumers = [PullConsumer(cfg["namesrv"], group=f"soak-conn-c{wid}", auto_commit=False).start()
                 for _ in range(n_cons)]
    # every producer sends its messages at once, over its own I/O thread's connection
    acked: dict = {}                                 # (pid, seq) -> (queue id, queue offset)
    todo = {(i, s): 0 for i in range(n_prod) for s in range(k)}
    while todo:
        futs = {key: producers[key[0]].send_async(Message(topic, body_of(wid * 10_000 + key[0], key[1])))
                for key in todo}
        again = {}
        for key, fut in futs.items():
            try:
                r = fut.result(timeout=60)
                acked[key] = (r.message_queue.queue_id, r.queue_offset)
            except Exception as e:  # noqa: BLE001 - counted by kind
                code = getattr(e, "response_code", None)
                if code is not None and code > 0:
                    note(e, refused)
                    if todo[key] < retries:
                        again[key] = todo[key] + 1
                else:
                    note(e, unclear)
        todo = again
        if todo:
            time.sleep(0.2)                          # back-off of a refused send, not synchronisation
    # every consumer connects: the topic's queues from the NameServer, an offset from the broker
    mqs = None
    for c in consumers:
        try:
            mqs = c.fetch_subscribe_message_queues(topic)
            c.max_offset(mqs[0])
        except Exception as e:  # noqa: BLE001 - counted as unclear
            note(e, unclear)
    emit("ready", producers=n_prod, consumers=n_cons, acked=len(acked), expected=n_prod * k,
         refused=dict(refused), unclear=dict(unclear), first_errors=first_errors, setup_s=time.monotonic() - t0)
    cmds.wait("readback")
    # consumer j reads back what producers j, j + n_cons, ... sent, one pull per message
    by_queue = {mq.queue_id: mq for mq in mqs or []}
    read_ok = missing = pulls = 0
    bad: list = []
    for (i, s), (qid, qoff) in sorted(acked.items()):
        c = consumers[i % n_cons]
        want = (wid * 10_000 + i, s)
        try:
            res = c.pull(by_queue[qid], "*", offset=qoff, max_nums=1)
            pulls += 1
            got = [id_of(m.body) for m in res.msg_found_list] if res.pull_status == PullStatus.FOUND else []
            if got[:1] == [want]:
                read_ok += 1
            else:
                missing += 1
                if len(bad) < 5:
                    bad.append(f"{want} at queue {qid} offset {qoff}: {res.pull_status} {got[:1]}")
        except Exception as e:  # noqa: BLE001 - counted as unclear
            missing += 1
            note(e, unclear)
    emit("readback", read_ok=read_ok, missing=missing, pulls=pulls, bad=bad, unclear=dict(unclear))
    cmds.wait("close")
    for p in producers:
        p.close(timeout=10)
    for c in consumers:
        c.shutdown()
    emit("done")


# -- raw sends ----------------------------------------------------------------------------------------------
def run_raw(cfg: dict, cmds: Commands) -> None:
    import zmq

    from rmq import Message
    from rmq import protocol as P
    from rmq.client.producer import ProducerOptions, prepare_message, send_request
    from rmq.protocol import ResponseCode

    sid, topic, queues = int(cfg["sid"]), cfg["topic"], int(cfg.get("queues", 8))
    mode, seconds = cfg["mode"], float(cfg["seconds"])
    rate = float(cfg.get("rate", 0))
    window = int(cfg.get("window", 65_536))
    timeout_s = float(cfg.get("timeout_ms", CLIENT_TIMEOUT_MS)) / 1000.0
    grace_s = float(cfg.get("grace_s", 30))
    opts = ProducerOptions()
    ctx = zmq.Context(io_threads=1)
    sock = P.dealer(ctx, cfg["broker"])
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)

    def request(seq: int) -> list:
        prep = prepare_message(Message(topic, body_of(sid, seq)), opts)
        f = send_request([prep], seq % queues, "soak-raw", batch=False)
        f.opaque = seq
        return P.encode(f)

    inflight: dict = {}                              # opaque (= seq) -> monotonic s handed to the socket
    codes: collections.Counter = collections.Counter()
    late: collections.Counter = collections.Counter()   # answered after the client's timeout, by code
    ok_lat = array.array("d")
    busy_lat = array.array("d")
    acked = array.array("q")                         # seq, queue id, queue offset
    remarks: dict = {}
    emit("ready")
    cmds.wait("go")
    t0 = time.monotonic()
    end = t0 + seconds
    seq = 0                                          # requests handed to the socket
    offered = 0                                      # requests due (open mode)
    held = 0                                         # times the socket refused (its queue full)
    pending_parts = None
    next_report = t0 + PROGRESS_INTERVAL_S
    offering = True
    t_offer_end = None
    t_last = None                                    # the last answer
    while True:
        now = time.monotonic()
        if offering and (now >= end or cmds.events["stop"].is_set()):
            offering = False
            t_offer_end = now
            emit("offer_end", sent=seq, offered=offered if mode == "open" else seq)
        if not offering and (not inflight or now >= t_offer_end + grace_s):
            break
        if offering:
            if mode == "open":
                offered = int((now - t0) * rate)
                want = offered
            else:
                want = seq + max(0, window - len(inflight))
            while seq < want and len(inflight) < window:
                if pending_parts is None:
                    pending_parts = request(seq)
                try:
                    sock.send_multipart(pending_parts, flags=zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    held += 1
                    break
                inflight[seq] = time.monotonic()
                pending_parts = None
                seq += 1
        if poller.poll(1 if offering else 50):
            for _ in range(4096):
                try:
                    parts = sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                r = P.decode(parts)
                t_sent = inflight.pop(r.opaque, None)
                if t_sent is None:
                    continue
                t_last = time.monotonic()
                lat = t_last - t_sent
                codes[r.code] += 1
                if lat > timeout_s:
                    late[r.code] += 1
                if r.code == ResponseCode.SUCCESS:
                    ok_lat.append(lat)
                    acked.extend((r.opaque, int(r.fields["queueId"]), int(r.fields["queueOffset"])))
                else:
                    if r.code == ResponseCode.SYSTEM_BUSY:
                        busy_lat.append(lat)
                    remarks.setdefault(r.code, (r.remark or "")[:160])
        if now >= next_report:
            emit("progress", sent=seq, offered=offered, inflight=len(inflight), ok=codes[0],
                 busy=codes[ResponseCode.SYSTEM_BUSY])
            next_report += PROGRESS_INTERVAL_S
    sock.close(0)
    ctx.term()
    out = cfg["out"]
    base = os.path.join(out, f"raw-{cfg.get('phase', mode)}-{sid}")
    with open(base + ".acked", "wb") as f:
        acked.tofile(f)
    with open(base + ".oklat", "wb") as f:
        ok_lat.tofile(f)
    with open(base + ".busylat", "wb") as f:
        busy_lat.tofile(f)
    emit("done", sid=sid, sent=seq, offered=offered if mode == "open" else seq, held=held,
         codes={str(k): v for k, v in codes.items()}, late={str(k): v for k, v in late.items()},
         unanswered=len(inflight), remarks={str(k): v for k, v in remarks.items()},
         offer_seconds=(t_offer_end or time.monotonic()) - t0, t_offer_end=t_offer_end, t_last_answer=t_last,
         acked=base + ".acked", oklat=base + ".oklat", busylat=base + ".busylat")


ROLES = {"producer": run_producer, "consumer": run_consumer, "connections": run_connections, "raw": run_raw}


def main() -> int:
    cfg = json.loads(sys.argv[1])
    cmds = Commands()
    try:
        ROLES[cfg["role"]](cfg, cmds)
    except BaseException as e:
        emit("error", error=repr(e)[:1000])
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
