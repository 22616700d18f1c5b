"""Drive the official RocketMQ 5 Python client (PyPI ``rocketmq-python-client==5.1.2``, module
``rocketmq.v5``, gRPC ``apache.rocketmq.v2.MessagingService``) against an endpoint (rmq proxy's
``grpcServerPort``), in a process of its own.  Prints one JSON document on stdout.

Run it only through tests/integration/grpc_helpers.py (``grpc_client(...)``): that puts the
client's ``pip install --target`` directory first on PYTHONPATH, so its top-level ``rocketmq``
package (and its grpcio / protobuf) shadow the C++ client's ``rocketmq`` in the venv, and points
HOME at a scratch directory (the client logs to ``~/logs/rocketmq_python/rocketmq_client.log``).

    python grpc_client.py version
        -> {"client_version", "grpc", "protobuf", "files": {module: path}}
    python grpc_client.py produce ENDPOINT TOPIC N
        -> {"sent": [{i, msg_id, transaction_id, offset, queue: {topic, id, broker}}], "seconds"}
    python grpc_client.py receive ENDPOINT TOPIC GROUP N [--tag-expression EXPR | --sql-expression EXPR]
                          [--invisible-s S] [--no-ack] [--timeout-s T] [--await-s A] [--batch B]
        -> {"messages": [view, ...every delivery, in order], "distinct", "seconds" (to N distinct, or null)}
           (fewer than N distinct by the timeout is no error: exit 0, the test checks "distinct"; the
           last long poll may run past the timeout by up to --await-s (default 5) + request timeout)
    python grpc_client.py push ENDPOINT TOPIC GROUP N [--fail-first] [--timeout-s T]
        -> {"messages": [view, ...every listener call], "distinct" (SUCCESS), "seconds" (start to N, or null)}
    python grpc_client.py change-invisible ENDPOINT TOPIC GROUP [--invisible-s S] [--new-invisible-s S2]
                          [--timeout-s T] [--no-watch] [--no-ack]
        -> {"first": view, "changed": {receipt_handle_before, receipt_handle_after, seconds},
            "redelivered": view | null, "redelivered_after_s", "others": [view]}
    python grpc_client.py transaction ENDPOINT TOPIC N [--unresolved] [--check-wait-s W]
        -> {"sent": [{i, msg_id, transaction_id, offset, resolution}], "checked": [{msg_id, seq, resolution}],
            "seconds"}

Options anywhere on the line: ``--request-timeout-s S`` (whole seconds, default 3: the client puts
it in ``Settings.request_timeout.seconds``, an int64), ``--access-key AK --secret-key SK``
(``Credentials(ak, sk)``; the client always sends an ``authorization`` header, with an empty AK
when none), ``--debug`` (the client's logger at DEBUG: it logs every response).

Every failure (an exception from the client) prints ``{...what was done so far, "error": "...",
"error_type", "client_log": [last lines of the client's log]}`` and exits with code 3; a bad
command line exits with code 2.  The process ends with ``os._exit`` once the JSON is written, so
a gRPC thread stuck at interpreter teardown cannot hang the test.

Messages produced (``produce``, ``transaction``): body ``grpc-<i>`` (every 100th padded past
4 KiB: the 5.x client does NOT compress, it always sends ``body_encoding=IDENTITY``), tag
``T<i % 3>``, keys ``k<i>``, user property ``seq=<i>``.  ``transaction``: even ``i`` committed,
odd ``i`` rolled back (with ``--unresolved``: odd ``i`` left open, and the TransactionChecker,
asked by the server through the Telemetry stream, answers ROLLBACK for odd and COMMIT for even).
``change-invisible``: use a topic / group holding that one message; other messages it receives
while it watches are listed in ``others`` and not acked (they come back after ``--invisible-s``).


What the client does on the wire (read from the 5.1.2 source; the server needs it in this order)
------------------------------------------------------------------------------------------------
gRPC metadata on every call (util/signature.py): ``x-mq-language: PYTHON``, ``x-mq-protocol:
GRPC_V2``, ``x-mq-client-version: 5.1.2``, ``x-mq-date-time`` (``%Y%m%dT%H%M%SZ``, local time),
``x-mq-request-id`` (uuid4), ``x-mq-client-id`` (``host@pid@index@base36(ns)``), ``x-mq-namespace``
(empty), ``authorization: MQv2-HMAC-SHA1 Credential=<ak>, SignedHeaders=x-mq-date-time,
Signature=<hex HMAC-SHA1(sk, date-time)>``.  Channel: ``grpc.aio.insecure_channel("ipv4:host:port")``
with retries off, unlimited message sizes; no TLS (``tls_enable=False``).

``start()`` (client/client.py ``startup``), both Producer and SimpleConsumer:
 1. ``QueryRoute`` to the ACCESS POINT (the ENDPOINT given), once per topic passed to the
    constructor (Producer ``topics``, SimpleConsumer ``subscription`` keys): ``topic{name,
    resource_namespace=""}``, ``endpoints`` = the access point (scheme IPv4 / DOMAIN_NAME, one
    address).  A failure is only LOGGED: ``start()`` still succeeds (the first send / receive
    queries the route again and raises ``failed to fetch topic:T route``).
 2. For each broker endpoint in the route not seen before (``message_queues[].broker.endpoints``,
    NOT the access point): open ``Telemetry`` (bidi stream, ``wait_for_ready=True``, timeout one
    year) to THAT endpoint and write one ``TelemetryCommand{settings}`` (below).  The client reads
    the stream: a reply ``TelemetryCommand{status OK, settings}`` calls ``reset_setting``;
    ``recover_orphaned_transaction_command{message, transaction_id}`` calls the producer's
    TransactionChecker, answered by ``EndTransaction(source=SOURCE_SERVER_CHECK)``.
    Producer and SimpleConsumer do NOT wait for the settings reply (only PushConsumer waits, 10 s).
 3. Schedulers: Heartbeat to every route endpoint after 1 s then every 10 s; Settings re-sent on
    the stream after 1 s then every 300 s; QueryRoute refresh (to the access point) after 10 s
    then every 30 s; idle-channel cleanup.
 ``shutdown()``: stops the schedulers, then ``NotifyClientTermination`` (synchronous, one per
 route endpoint; producer: empty request, consumer: ``group``), cancels the Telemetry stream,
 closes the channels.

Settings the client sends (``sync_setting_req``): ``client_type`` (PRODUCER=1 / SIMPLE_CONSUMER=3),
``access_point`` = the broker endpoint the stream goes to, ``request_timeout.seconds``,
``user_agent{language=PYTHON(6), version="5.1.2", platform, hostname=local IP}``, ``metric.on=false``
and: Producer ``publishing{topics=[the topics known so far], max_body_size=128 MiB,
validate_message_type=true}``; SimpleConsumer ``subscription{group, subscriptions=[{topic,
expression{type TAG(1)|SQL(2), expression}}], long_polling_timeout=await_duration}``.
What the Producer takes from the server's settings reply (``Producer.reset_setting``):
``publishing.max_body_size`` (a reply without it gives 0, and from then on EVERY send fails
client-side with "Message body size exceeds the threshold"), ``publishing.validate_message_type``,
``backoff_policy`` (only if ``exponential_backoff``).  SimpleConsumer ignores the reply's content.
If ``metric.on`` and ``metric.endpoints`` are in the reply, the client starts an OTLP exporter.

Producer ``send(message, transaction=None)`` (synchronous): the route (cached, else QueryRoute);
the queue: round-robin (from a random start) over ``message_queues`` with permission WRITE or
READ_WRITE and ``broker.id == 0``; the message type must be in the queue's ``accept_message_types``
(NORMAL=1, TRANSACTION=4, ...) or the client raises before sending (checked while
``validate_message_type``: true until a settings reply says otherwise).  ``SendMessage`` to the
queue's broker endpoints, ONE message per request: ``topic``, ``body``, ``user_properties``,
``system_properties{tag, keys[], message_id (client-made, MessageIdCodec), message_type,
born_timestamp (whole seconds), born_host, body_encoding=IDENTITY}`` (no body_digest, no queue id).
The response must carry ``status`` OK and EXACTLY one ``entries[]`` (asserted), whose
``message_id``, ``transaction_id``, ``offset``, ``recall_handle`` make the SendReceipt.  On failure
it retries (3 attempts in all, the next queue each time) unless TOO_MANY_REQUESTS.

SimpleConsumer ``receive(max_message_num, invisible_duration)`` (synchronous): NO QueryAssignment
(only PushConsumer uses it): topics round-robin; queue round-robin over the route's READ /
READ_WRITE queues with ``broker.id == 0``.  ``ReceiveMessage`` (server-streaming) to that queue's
broker endpoints: ``group``, ``message_queue`` (the route's queue, echoed whole), ``filter_expression``,
``batch_size``, ``invisible_duration`` (seconds), ``long_polling_timeout = await_duration`` (seconds,
client default 20), ``auto_renew=false``; gRPC deadline = request_timeout + await_duration.  It
reads the whole stream: ``message`` items, one ``status`` (REQUIRED: without it the client logs
"[BUG]"; MESSAGE_NOT_FOUND = an empty batch, not an error), optional ``delivery_timestamp``.  Per
message it needs ``system_properties.body_encoding`` IDENTITY or GZIP (UNSPECIFIED raises and fails
the whole receive), ``receipt_handle``, ``message_id``, ``delivery_attempt``; ``body_digest``
CRC32 / MD5 / SHA1 is checked (a mismatch sets ``corrupted``; UNSPECIFIED only logs an error).
``ack(message)``: ``AckMessage{group, topic, entries=[{message_id, receipt_handle}]}`` to the
message's queue endpoints; only ``status`` is checked.  ``change_invisible_duration(message, s)``:
``ChangeInvisibleDuration{topic, group, receipt_handle, invisible_duration, message_id}``; the
reply's ``receipt_handle`` replaces the message's (a later ack uses the new one).

Transactions: ``Producer(config, topics, checker=TransactionChecker())``;
``tx = producer.begin_transaction()``; ``producer.send(message, transaction=tx)`` sends a
TRANSACTION-type message; ``tx.commit()`` / ``tx.rollback()`` -> ``EndTransaction{topic, message_id,
transaction_id (from the send entry), resolution COMMIT=1 / ROLLBACK=2, source SOURCE_CLIENT}`` to
the queue's broker endpoints.
"""
import json
import logging
import os
import sys
import threading
import time
import traceback

BIG_EVERY = 100
BIG_PAD = 5000
EXIT_CLIENT_ERROR = 3
EXIT_USAGE = 2
LOG_FILE = os.path.join(os.path.expanduser("~"), "logs", "rocketmq_python", "rocketmq_client.log")


def body_of(i: int) -> bytes:
    return b"grpc-%d" % i + (b"." * BIG_PAD if i % BIG_EVERY == 0 else b"")


class ClientFailed(Exception):
    def __init__(self, partial: dict, error: BaseException):
        super().__init__(f"{type(error).__name__}: {error}")
        self.partial = partial
        self.error = error


class Options:
    request_timeout_s = 3
    access_key = ""
    secret_key = ""


def _config(endpoint: str):
    from rocketmq import ClientConfiguration, Credentials
    return ClientConfiguration(endpoint, Credentials(Options.access_key, Options.secret_key),
                               request_timeout=Options.request_timeout_s)


def _message(topic: str, i: int):
    from rocketmq import Message
    m = Message()
    m.topic = topic
    m.body = body_of(i)
    m.tag = "T%d" % (i % 3)
    m.keys = "k%d" % i
    m.add_property("seq", str(i))
    return m


def _receipt(i: int, r) -> dict:
    q = r.message_queue
    queue = None
    if q is not None:
        pb = q.message_queue0()
        queue = {"topic": pb.topic.name, "id": pb.id, "broker": pb.broker.name}
    return {"i": i, "msg_id": r.message_id, "transaction_id": r.transaction_id or None, "offset": r.offset,
            "queue": queue}


def view(m) -> dict:
    props = dict(m.properties or {})
    return {"msg_id": m.message_id, "body": (m.body or b"").decode("latin-1"), "tag": m.tag,
            "keys": sorted(m.keys or ()), "properties": props, "seq": props.get("seq"),
            "delivery_attempt": m.delivery_attempt, "topic": m.topic, "message_group": m.message_group,
            "receipt_handle": m.receipt_handle, "corrupted": m.corrupted, "born_host": m.born_host}


def _shutdown(client) -> None:
    try:
        client.shutdown()
    except Exception:  # noqa: BLE001 - the result (or the first error) is what is reported
        sys.stderr.write("shutdown failed:\n" + traceback.format_exc())


# -- modes ----------------------------------------------------------------------------------------

def version() -> dict:
    import google.protobuf
    import grpc
    import rocketmq
    import rocketmq.v5
    from rocketmq.v5.util.version import SDK_VERSION
    return {"client_version": SDK_VERSION, "grpc": grpc.__version__, "protobuf": google.protobuf.__version__,
            "files": {"rocketmq": rocketmq.__file__, "grpc": grpc.__file__,
                      "google.protobuf": google.protobuf.__file__},
            "python": sys.version.split()[0]}


def produce(endpoint: str, topic: str, n: int) -> dict:
    from rocketmq import Producer
    p = Producer(_config(endpoint), (topic,))
    sent = []
    try:
        p.startup()
        t0 = time.perf_counter()
        for i in range(n):
            r = p.send(_message(topic, i))
            sent.append(_receipt(i, r))
        seconds = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - reported with what was sent so far
        raise ClientFailed({"sent": sent}, e) from None
    finally:
        _shutdown(p)
    return {"sent": sent, "seconds": seconds}


def _consumer(endpoint: str, topic: str, group: str, expr: str, sql: bool, await_s: int):
    from rocketmq import FilterExpression, SimpleConsumer
    from rocketmq.grpc_protocol import FilterType
    fe = FilterExpression(expr, FilterType.SQL if sql else FilterType.TAG)
    return SimpleConsumer(_config(endpoint), group, {topic: fe}, await_duration=await_s)


def receive(endpoint: str, topic: str, group: str, n: int, expr: str = "*", sql: bool = False,
            invisible_s: int = 30, ack: bool = True, timeout_s: float = 60.0, await_s: int = 5,
            batch: int = 16) -> dict:
    c = _consumer(endpoint, topic, group, expr, sql, await_s)
    got, ids, seconds = [], set(), None
    try:
        c.startup()
        t0 = time.perf_counter()
        end = time.monotonic() + timeout_s
        while len(ids) < n and time.monotonic() < end:
            for m in c.receive(batch, invisible_s):
                got.append(view(m))
                ids.add(m.message_id)
                if ack:
                    c.ack(m)
        if len(ids) >= n:
            seconds = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - reported with what was received so far
        raise ClientFailed({"messages": got, "distinct": len(ids)}, e) from None
    finally:
        _shutdown(c)
    return {"messages": got, "distinct": len(ids), "seconds": seconds}


def push(endpoint: str, topic: str, group: str, n: int, timeout_s: float = 60.0, fail_first: bool = False) -> dict:
    """PushConsumer (QueryAssignment, then ReceiveMessage on the assigned queues; the listener's
    SUCCESS acks).  ``fail_first``: the listener answers FAILURE to each message's first delivery,
    so every message comes back (delivery_attempt 2)."""
    from rocketmq import FilterExpression
    from rocketmq.v5.consumer.push.message_listener import ConsumeResult, MessageListener
    from rocketmq.v5.consumer.push.push_consumer import PushConsumer

    got, ids, lock = [], set(), threading.Lock()

    class Listener(MessageListener):
        def consume(self, message):
            with lock:
                got.append(view(message))
                if fail_first and (message.delivery_attempt or 1) < 2:
                    return ConsumeResult.FAILURE
                ids.add(message.message_id)
            return ConsumeResult.SUCCESS

    c = PushConsumer(_config(endpoint), group, Listener(), {topic: FilterExpression("*")},
                     consumption_thread_count=4)
    seconds = None
    try:
        t0 = time.perf_counter()
        c.startup()
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with lock:
                if len(ids) >= n:
                    seconds = time.perf_counter() - t0
                    break
            time.sleep(0.05)
    except Exception as e:  # noqa: BLE001
        raise ClientFailed({"messages": got, "distinct": len(ids)}, e) from None
    finally:
        _shutdown(c)
    with lock:
        return {"messages": list(got), "distinct": len(ids), "seconds": seconds}


def change_invisible(endpoint: str, topic: str, group: str, invisible_s: int = 30, new_invisible_s: int = 2,
                     timeout_s: float = 60.0, watch: bool = True, ack: bool = True, await_s: int = 5) -> dict:
    c = _consumer(endpoint, topic, group, "*", False, await_s)
    out = {"first": None, "changed": None, "redelivered": None, "redelivered_after_s": None, "others": []}
    try:
        c.startup()
        end = time.monotonic() + timeout_s
        first = None
        while first is None and time.monotonic() < end:
            batch = c.receive(1, invisible_s)
            if batch:
                first = batch[0]
                out["first"] = view(first)
                for m in batch[1:]:
                    out["others"].append(view(m))
        if first is None:
            raise TimeoutError(f"no message received in {timeout_s} s")
        before = first.receipt_handle
        t0 = time.perf_counter()
        c.change_invisible_duration(first, new_invisible_s)
        changed_at = time.monotonic()
        out["changed"] = {"receipt_handle_before": before, "receipt_handle_after": first.receipt_handle,
                          "seconds": time.perf_counter() - t0, "new_invisible_s": new_invisible_s}
        while watch and out["redelivered"] is None and time.monotonic() < end:
            for m in c.receive(16, invisible_s):
                if m.message_id == first.message_id and out["redelivered"] is None:
                    out["redelivered"] = view(m)
                    out["redelivered_after_s"] = time.monotonic() - changed_at
                    if ack:
                        c.ack(m)
                else:
                    out["others"].append(view(m))
    except Exception as e:  # noqa: BLE001 - reported with what happened so far
        raise ClientFailed(out, e) from None
    finally:
        _shutdown(c)
    return out


def transaction(endpoint: str, topic: str, n: int, unresolved: bool = False, check_wait_s: float = 30.0) -> dict:
    from rocketmq import Producer, TransactionChecker, TransactionResolution

    checked, lock = [], threading.Lock()

    class ParityChecker(TransactionChecker):
        def check(self, message) -> int:
            seq = (message.properties or {}).get("seq")
            even = seq is not None and int(seq) % 2 == 0
            res = TransactionResolution.COMMIT if even else TransactionResolution.ROLLBACK
            with lock:
                checked.append({"msg_id": message.message_id, "seq": seq,
                                "resolution": TransactionResolution.Name(res)})
            return res

    p = Producer(_config(endpoint), (topic,), checker=ParityChecker())
    sent = []
    out = {"sent": sent, "checked": checked}
    try:
        p.startup()
        t0 = time.perf_counter()
        for i in range(n):
            tx = p.begin_transaction()
            r = p.send(_message(topic, i), transaction=tx)
            rec = _receipt(i, r)
            if i % 2 == 0:
                tx.commit()
                rec["resolution"] = "COMMIT"
            elif not unresolved:
                tx.rollback()
                rec["resolution"] = "ROLLBACK"
            else:
                rec["resolution"] = None
            sent.append(rec)
        out["seconds"] = time.perf_counter() - t0
        if unresolved:
            want = {r["msg_id"] for r in sent if r["resolution"] is None}
            end = time.monotonic() + check_wait_s
            while time.monotonic() < end:
                with lock:
                    if want <= {c["msg_id"] for c in checked}:
                        break
                time.sleep(0.1)
            time.sleep(0.5)       # the checker's EndTransaction goes out on another thread
    except Exception as e:  # noqa: BLE001 - reported with what was sent so far
        raise ClientFailed(out, e) from None
    finally:
        _shutdown(p)
    return out


# -- command line ---------------------------------------------------------------------------------

def _take_option(argv: list, name: str, flag: bool = False):
    if name not in argv:
        return False if flag else None
    i = argv.index(name)
    if flag:
        del argv[i]
        return True
    value = argv[i + 1]
    del argv[i:i + 2]
    return value


def _client_log_tail(lines: int = 40) -> list:
    try:
        with open(LOG_FILE, encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()[-lines:]
    except OSError:
        return []


def main(argv: list) -> tuple:
    rt = _take_option(argv, "--request-timeout-s")
    if rt is not None:
        Options.request_timeout_s = int(rt)
    Options.access_key = _take_option(argv, "--access-key") or ""
    Options.secret_key = _take_option(argv, "--secret-key") or ""
    debug = _take_option(argv, "--debug", flag=True)
    if not argv:
        raise SystemExit(__doc__.split("\n\n")[1])
    mode, a = argv[0], argv[1:]
    if mode != "version":
        import rocketmq.v5.log  # noqa: F401 - configures the client's logger (and makes ~/logs/...)
        logging.getLogger("rocketmq-python-client").setLevel(logging.DEBUG if debug else logging.INFO)
    if mode == "version":
        return version()
    if mode == "produce":
        return produce(a[0], a[1], int(a[2]))
    if mode == "receive":
        tag = _take_option(a, "--tag-expression")
        sql = _take_option(a, "--sql-expression")
        kw = dict(expr=sql if sql is not None else (tag if tag is not None else "*"), sql=sql is not None,
                  ack=not _take_option(a, "--no-ack", flag=True))
        for opt, key, conv in (("--invisible-s", "invisible_s", int), ("--timeout-s", "timeout_s", float),
                               ("--await-s", "await_s", int), ("--batch", "batch", int)):
            v = _take_option(a, opt)
            if v is not None:
                kw[key] = conv(v)
        return receive(a[0], a[1], a[2], int(a[3]), **kw)
    if mode == "push":
        kw = dict(fail_first=_take_option(a, "--fail-first", flag=True))
        v = _take_option(a, "--timeout-s")
        if v is not None:
            kw["timeout_s"] = float(v)
        return push(a[0], a[1], a[2], int(a[3]), **kw)
    if mode == "change-invisible":
        kw = dict(watch=not _take_option(a, "--no-watch", flag=True), ack=not _take_option(a, "--no-ack", flag=True))
        for opt, key, conv in (("--invisible-s", "invisible_s", int), ("--new-invisible-s", "new_invisible_s", int),
                               ("--timeout-s", "timeout_s", float), ("--await-s", "await_s", int)):
            v = _take_option(a, opt)
            if v is not None:
                kw[key] = conv(v)
        return change_invisible(a[0], a[1], a[2], **kw)
    if mode == "transaction":
        kw = dict(unresolved=_take_option(a, "--unresolved", flag=True))
        v = _take_option(a, "--check-wait-s")
        if v is not None:
            kw["check_wait_s"] = float(v)
        return transaction(a[0], a[1], int(a[2]), **kw)
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    code = 0
    try:
        out = main(sys.argv[1:])
    except ClientFailed as e:
        out, code = dict(e.partial, error=str(e), error_type=type(e.error).__name__,
                         client_log=_client_log_tail()), EXIT_CLIENT_ERROR
        sys.stderr.write(f"rocketmq 5.x client {sys.argv[1]} failed: {e}\n")
    except SystemExit as e:
        out, code = {"error": f"usage: {e.code}"}, EXIT_USAGE
    except (IndexError, ValueError) as e:
        out, code = {"error": f"usage: {type(e).__name__}: {e}"}, EXIT_USAGE
    except BaseException as e:  # noqa: BLE001 - even an import error is one JSON document
        out, code = {"error": f"{type(e).__name__}: {e}", "error_type": type(e).__name__,
                     "traceback": traceback.format_exc(), "client_log": _client_log_tail()}, EXIT_CLIENT_ERROR
        sys.stderr.write(traceback.format_exc())
    sys.stdout.write(json.dumps(out))
    sys.stdout.write("\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
