"""rmq.proxy.transaction: the check-back body (a half message's record with its real topic and
queue restored, RocketMQ's ``MessageDecoder.encode`` v1 layout) and the bounded route table."""
import struct

import pytest

from rmq._core import commitlog as _cl
from rmq.proxy.transaction import (BORNHOST_V6_FLAG, MAGIC_V1, MAGIC_V2, MAX_TRACKED_TRANSACTIONS,
                                   STOREHOST_V6_FLAG, TransactionRoutes, check_message_body, uniq_key)

HALF = "RMQ_SYS_TRANS_HALF_TOPIC"


def record(topic=HALF, props=None, body=b"payload", magic=MAGIC_V1, sys_flag=4, queue_id=0):
    """A CommitLog record built field by field from SPEC.md's layout (independent of the code under test)."""
    props = {"REAL_TOPIC": "Orders", "REAL_QID": "3", "UNIQ_KEY": "U1", "TRAN_MSG": "true", "PGROUP": "PG"} \
        if props is None else props
    p = "".join(f"{k}\x01{v}\x02" for k, v in props.items()).encode()
    born = b"\x7f\x00\x00\x01" + struct.pack(">i", 5000) if not sys_flag & BORNHOST_V6_FLAG else b"\x00" * 16 + \
        struct.pack(">i", 5000)
    store = b"\x7f\x00\x00\x01" + struct.pack(">i", 10911) if not sys_flag & STOREHOST_V6_FLAG else b"\x00" * 15 + \
        b"\x01" + struct.pack(">i", 10911)
    t = topic.encode()
    tlen = bytes((len(t),)) if magic == MAGIC_V1 else struct.pack(">h", len(t))
    rest = (struct.pack(">iiiqqiq", 1234, queue_id, 0, 17, 4096, sys_flag, 1_700_000_000_000) + born +
            struct.pack(">q", 1_700_000_000_500) + store + struct.pack(">iq", 0, 0) +
            struct.pack(">i", len(body)) + body + tlen + t + struct.pack(">h", len(p)) + p)
    return struct.pack(">iI", 8 + len(rest), magic) + rest


@pytest.mark.parametrize("magic", [MAGIC_V1, MAGIC_V2], ids=["v1", "v2"])
@pytest.mark.parametrize("sys_flag", [4, 4 | BORNHOST_V6_FLAG | STOREHOST_V6_FLAG], ids=["ipv4", "ipv6"])
def test_check_body_restores_the_real_topic_and_queue(magic, sys_flag):
    out = check_message_body(record(magic=magic, sys_flag=sys_flag))
    assert struct.unpack_from(">iI", out) == (len(out), MAGIC_V1)
    (m,) = _cl.decode_records(out)
    assert (m.topic, m.queue_id, bytes(m.body), m.queue_offset, m.commitlog_offset) == ("Orders", 3, b"payload", 17,
                                                                                          4096)
    assert m.properties["UNIQ_KEY"] == "U1" and m.properties["REAL_TOPIC"] == "Orders"


@pytest.mark.parametrize("bad, why", [
    (record(props={"UNIQ_KEY": "U1"}), "REAL_TOPIC"),
    (record()[:60], "truncated"),
    (struct.pack(">iI", 8, 0x12345678) + b"\x00" * 120, "magic"),
    (record(props={"REAL_TOPIC": "T" * 300}), "v1 layout"),
])
def test_check_body_refuses_what_it_cannot_restore(bad, why):
    with pytest.raises(ValueError, match=why):
        check_message_body(bad)


def test_routes_keep_the_newest_max_tracked_transactions():
    r = TransactionRoutes()
    assert r.capacity == MAX_TRACKED_TRANSACTIONS
    for i in range(MAX_TRACKED_TRANSACTIONS + 10):
        r.remember(f"t{i}", f"127.0.0.1:{i % 2}")
    assert len(r) == MAX_TRACKED_TRANSACTIONS
    assert r.lookup("t0") is None and r.lookup("t9") is None                 # the oldest forgotten
    assert r.lookup("t10") == "127.0.0.1:0" and r.lookup("missing", f"t{MAX_TRACKED_TRANSACTIONS + 9}") == \
        "127.0.0.1:1"
    r.forget("t10")
    assert r.lookup("t10") is None
    r.remember("", "x")                                                       # no id: nothing kept
    assert r.lookup("") is None


def test_uniq_key_of_a_properties_string():
    assert uniq_key("TRAN_MSG\x01true\x02UNIQ_KEY\x01ABC\x02") == "ABC"
    assert uniq_key("KEYS\x01k\x02") is None and uniq_key("") is None
