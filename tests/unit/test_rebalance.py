"""Queue allocation strategies (rmq.client.rebalance), plus the consumer's pure pieces:
consumeFromWhere, ProcessQueue offsets, offset stores, subscriptions and pull post-processing."""
import hashlib
import itertools
import json
import os
import zlib

import pytest

from rmq._core import commitlog as cl
from rmq.client.consumer import ConsumeFromWhere, compute_pull_from_where
from rmq.client.consumer_api import SubscriptionData, post_process_messages
from rmq.client.consumer_process_queue import ProcessQueue
from rmq.client.message import MessageQueue
from rmq.client.offset_store import LocalFileOffsetStore, ReadOffsetType, RemoteBrokerOffsetStore
from rmq.client.rebalance import (AllocateMachineRoomNearby, AllocateMessageQueueAveragely,
                                  AllocateMessageQueueAveragelyByCircle, AllocateMessageQueueByConfig,
                                  AllocateMessageQueueByMachineRoom, AllocateMessageQueueConsistentHash, md5_hash,
                                  mq_to_string, resolve_strategy)
from rmq.errors import MQBrokerError, RemotingError


def mqs(n, topic="T", broker="b"):
    return [MessageQueue(topic, broker, i) for i in range(n)]


def cids(n):
    return [f"c{i:02d}" for i in range(n)]


def allocation(strategy, n_mq, n_cid):
    all_mq, all_cid = mqs(n_mq), cids(n_cid)
    return [[mq.queue_id for mq in strategy.allocate("g", c, all_mq, all_cid)] for c in all_cid]


def averagely_reference(n_mq, n_cid, index):
    """SPEC.md §15.2, written out independently of the implementation."""
    mod = n_mq % n_cid
    if n_mq <= n_cid:
        avg = 1
    elif mod > 0 and index < mod:
        avg = n_mq // n_cid + 1
    else:
        avg = n_mq // n_cid
    start = index * avg if (mod > 0 and index < mod) else index * avg + mod
    return [(start + i) % n_mq for i in range(min(avg, n_mq - start))]


# -- AllocateMessageQueueAveragely -------------------------------------------------------------------
@pytest.mark.parametrize("n_mq,n_cid,expected", [
    (8, 3, [[0, 1, 2], [3, 4, 5], [6, 7]]),
    (10, 4, [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]),
    (8, 8, [[i] for i in range(8)]),
    (3, 5, [[0], [1], [2], [], []]),
    (16, 1, [list(range(16))]),
    (9, 2, [[0, 1, 2, 3, 4], [5, 6, 7, 8]]),
])
def test_averagely_known_cases(n_mq, n_cid, expected):
    assert allocation(AllocateMessageQueueAveragely(), n_mq, n_cid) == expected


@pytest.mark.parametrize("n_mq,n_cid", list(itertools.product(range(1, 21), range(1, 9))))
def test_averagely_is_the_exact_formula_and_a_partition(n_mq, n_cid):
    got = allocation(AllocateMessageQueueAveragely(), n_mq, n_cid)
    assert got == [averagely_reference(n_mq, n_cid, i) for i in range(n_cid)]
    flat = [q for part in got for q in part]
    assert sorted(flat) == list(range(n_mq))                         # every queue exactly once
    assert max(map(len, got)) - min(map(len, got)) <= 1              # balanced
    assert all(part == list(range(part[0], part[0] + len(part))) for part in got if part)  # contiguous


def test_averagely_edge_cases():
    s = AllocateMessageQueueAveragely()
    assert s.allocate("g", "stranger", mqs(4), cids(2)) == []         # not a member (yet)
    assert s.allocate("g", "c00", [], cids(2)) == []
    assert s.allocate("g", "c00", mqs(4), []) == []
    with pytest.raises(ValueError):
        s.allocate("g", "", mqs(4), cids(2))


# -- ByCircle ------------------------------------------------------------------------------------------
def test_by_circle():
    s = AllocateMessageQueueAveragelyByCircle()
    assert allocation(s, 8, 3) == [[0, 3, 6], [1, 4, 7], [2, 5]]
    assert allocation(s, 2, 4) == [[0], [1], [], []]
    for n_mq, n_cid in itertools.product(range(1, 13), range(1, 6)):
        got = allocation(s, n_mq, n_cid)
        assert sorted(q for p in got for q in p) == list(range(n_mq))
        assert all(q % n_cid == i for i, p in enumerate(got) for q in p)
    assert s.allocate("g", "x", mqs(4), cids(2)) == []


# -- ConsistentHash -------------------------------------------------------------------------------------
def test_md5_hash_and_mq_string_match_rocketmq():
    assert md5_hash("abc") == int.from_bytes(hashlib.md5(b"abc").digest()[:4], "big") == 0x90015098
    assert mq_to_string(MessageQueue("T", "broker-a", 3)) == "MessageQueue [topic=T, brokerName=broker-a, queueId=3]"


def ring_owner(mq, all_cid, vnodes=10):
    """Reference: walk the sorted ring by hand."""
    nodes = sorted((md5_hash(f"{c}-{i}"), c) for c in all_cid for i in range(vnodes))
    h = md5_hash(mq_to_string(mq))
    for nh, c in nodes:
        if nh >= h:
            return c
    return nodes[0][1]


def test_consistent_hash_partition_and_ring():
    s = AllocateMessageQueueConsistentHash()
    all_mq, all_cid = mqs(32), cids(4)
    parts = {c: s.allocate("g", c, all_mq, all_cid) for c in all_cid}
    assert sorted(mq for p in parts.values() for mq in p) == all_mq
    for c, p in parts.items():
        assert all(ring_owner(mq, all_cid) == c for mq in p)


def test_consistent_hash_moves_only_queues_of_the_changed_member():
    s = AllocateMessageQueueConsistentHash(virtual_node_cnt=10)
    all_mq = mqs(64)
    before = {mq: c for c in cids(4) for mq in s.allocate("g", c, all_mq, cids(4))}
    grown = cids(5)
    after = {mq: c for c in grown for mq in s.allocate("g", c, all_mq, grown)}
    moved = [mq for mq in all_mq if before[mq] != after[mq]]
    assert moved and all(after[mq] == "c04" for mq in moved)          # only to the newcomer
    shrunk = cids(3)
    after2 = {mq: c for c in shrunk for mq in s.allocate("g", c, all_mq, shrunk)}
    assert all(after2[mq] == before[mq] for mq in all_mq if before[mq] != "c03")  # only the leaver's move


def test_consistent_hash_custom_function_and_bad_count():
    s = AllocateMessageQueueConsistentHash(virtual_node_cnt=3, hash_function=lambda k: zlib.crc32(k.encode()))
    parts = [s.allocate("g", c, mqs(10), cids(3)) for c in cids(3)]
    assert sorted(mq.queue_id for p in parts for mq in p) == list(range(10))
    with pytest.raises(ValueError):
        AllocateMessageQueueConsistentHash(virtual_node_cnt=-1)


# -- ByConfig, ByMachineRoom, MachineRoomNearby ---------------------------------------------------------
def test_by_config():
    chosen = [MessageQueue("T", "b", 5), MessageQueue("T", "b", 1)]
    s = AllocateMessageQueueByConfig(chosen)
    assert s.allocate("g", "anyone", mqs(8), cids(3)) == chosen
    s.set_message_queue_list([MessageQueue("T", "b", 2)])
    assert s.allocate("g", "x", [], []) == [MessageQueue("T", "b", 2)]


def test_by_machine_room():
    all_mq = sorted([MessageQueue("T", f"{room}@broker-{room}", q) for room in ("r1", "r2", "r3") for q in range(4)])
    s = AllocateMessageQueueByMachineRoom(["r1", "r2"])
    parts = [s.allocate("g", c, all_mq, cids(3)) for c in cids(3)]
    pre = [mq for mq in all_mq if mq.broker_name.split("@")[0] in ("r1", "r2")]    # 8 queues
    # mod = 8 // 3 = 2 each, remainder 2 -> consumers 0 and 1 take pre[6], pre[7]
    assert parts == [pre[0:2] + [pre[6]], pre[2:4] + [pre[7]], pre[4:6]]
    assert all(mq.broker_name.startswith(("r1@", "r2@")) for p in parts for mq in p)


def test_machine_room_nearby():
    all_mq = sorted([MessageQueue("T", f"{room}-broker", q) for room in ("r1", "r2", "r3") for q in range(4)])
    consumers = sorted(["r1-a", "r1-b", "r2-a"])
    s = AllocateMachineRoomNearby(AllocateMessageQueueAveragely(), lambda mq: mq.broker_name.split("-")[0],
                                  lambda cid: cid.split("-")[0])
    parts = {c: s.allocate("g", c, all_mq, consumers) for c in consumers}
    flat = [mq for p in parts.values() for mq in p]
    assert sorted(flat) == all_mq                                     # a partition
    assert all(mq.broker_name.startswith(("r2", "r3")) for mq in parts["r2-a"])
    assert [mq for mq in parts["r2-a"] if mq.broker_name.startswith("r2")] == mqs(4, broker="r2-broker")
    r1 = parts["r1-a"] + parts["r1-b"]
    assert sorted(mq for mq in r1 if mq.broker_name.startswith("r1")) == mqs(4, broker="r1-broker")
    # r3 has no consumer: its queues are shared by everyone
    assert {c for c, p in parts.items() if any(mq.broker_name.startswith("r3") for mq in p)} == set(consumers)
    with pytest.raises(ValueError):
        AllocateMachineRoomNearby("AVG", lambda mq: "", lambda cid: "x").allocate("g", "c", mqs(2), ["c"])


def test_resolve_strategy():
    assert isinstance(resolve_strategy(None), AllocateMessageQueueAveragely)
    assert isinstance(resolve_strategy("AVG"), AllocateMessageQueueAveragely)
    assert isinstance(resolve_strategy("avg_by_circle"), AllocateMessageQueueAveragelyByCircle)
    assert isinstance(resolve_strategy("AllocateMessageQueueConsistentHash"), AllocateMessageQueueConsistentHash)
    f = lambda g, c, m, a: m[:1]  # noqa: E731
    assert resolve_strategy(f) is f
    with pytest.raises(ValueError):
        resolve_strategy("nope")
    with pytest.raises(TypeError):
        resolve_strategy(42)


# -- consumeFromWhere -----------------------------------------------------------------------------------
@pytest.mark.parametrize("where,topic,last,expected", [
    ("CONSUME_FROM_LAST_OFFSET", "T", 7, 7),              # a stored offset always wins
    ("CONSUME_FROM_FIRST_OFFSET", "T", 7, 7),
    ("CONSUME_FROM_LAST_OFFSET", "T", -1, 100),           # max offset
    ("CONSUME_FROM_LAST_OFFSET", "%RETRY%g", -1, 0),       # retry topics start at 0
    ("CONSUME_FROM_MAX_OFFSET", "T", -1, 100),            # deprecated names act as LAST
    ("CONSUME_FROM_FIRST_OFFSET", "T", -1, 0),
    ("CONSUME_FROM_TIMESTAMP", "T", -1, 42),              # searchOffset(timestamp)
    ("CONSUME_FROM_TIMESTAMP", "%RETRY%g", -1, 100),       # retry topics: max offset
    ("CONSUME_FROM_LAST_OFFSET", "T", -2, -1),            # store unreadable: retry later
])
def test_compute_pull_from_where(where, topic, last, expected):
    asked = []

    def search(mq, ts):
        asked.append(ts)
        return 42
    got = compute_pull_from_where(ConsumeFromWhere(where), last, MessageQueue(topic, "b", 0), lambda mq: 100,
                                  search, 123456)
    assert got == expected
    if expected == 42:
        assert asked == [123456]


def test_compute_pull_from_where_broker_failure():
    def boom(mq):
        raise RemotingError("down")
    assert compute_pull_from_where(ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, -1, MessageQueue("T", "b", 0), boom,
                                   boom, 0) == -1


# -- ProcessQueue -------------------------------------------------------------------------------------
class FakeMsg:
    def __init__(self, off, body=b"x"):
        self.queue_offset = off
        self.body = body


def test_process_queue_commits_lowest_in_flight_offset():
    pq = ProcessQueue()
    msgs = [FakeMsg(i) for i in range(10, 20)]
    assert pq.put_message(msgs) is True and pq.msg_count == 10 and pq.msg_size == 10
    assert pq.max_span() == 9
    assert pq.remove_message(msgs[3:5]) == 10          # 10 still in flight: commit stays at 10
    assert pq.remove_message(msgs[0:3]) == 15          # 10..14 done -> next in flight is 15
    assert pq.remove_message(msgs[5:]) == 20           # all done -> max + 1
    assert pq.remove_message(msgs[5:]) == -1           # nothing held
    assert pq.msg_count == 0 and pq.msg_size == 0
    pq.put_message([FakeMsg(20)])
    pq.put_message([FakeMsg(20)])                       # duplicates are ignored
    assert pq.msg_count == 1


def test_process_queue_orderly_take_commit_and_put_back():
    pq = ProcessQueue()
    pq.put_message([FakeMsg(i) for i in range(5)])
    batch = pq.take_messages(2)
    assert [m.queue_offset for m in batch] == [0, 1]
    assert pq.commit() == 2 and pq.msg_count == 3
    batch = pq.take_messages(2)
    pq.make_message_to_consume_again(batch)            # failed: back in front, in order
    assert [m.queue_offset for m in pq.take_messages(10)] == [2, 3, 4]
    assert pq.commit() == 5
    assert pq.take_messages(1) == [] and pq.consuming is False
    assert pq.put_message([FakeMsg(5)]) is True         # a new task must be dispatched
    assert pq.put_message([FakeMsg(6)]) is False        # one is already running


def test_process_queue_reads_message_ext_fields_in_c_and_turns_ordered_on_first_orderly_use():
    """The same bookkeeping with rmq._core.commitlog.MessageExt (whose fields tree_put /
    tree_remove read as C fields) and other objects mixed in; the plain in-flight map becomes an
    OrderedDict at the first orderly operation, keeping its order."""
    from collections import OrderedDict

    from rmq._core.commitlog import MessageExt

    def ext(off, body=b"xy"):
        m = MessageExt()
        m.queue_offset, m.body = off, body
        return m

    pq = ProcessQueue()
    msgs = [ext(i) for i in range(100, 110)] + [FakeMsg(110, b"abc"), ext(111, None)]
    assert pq.put_message(msgs) is True
    assert (pq.msg_count, pq.msg_size, pq.queue_offset_max, pq.max_span()) == (12, 23, 111, 11)
    assert type(pq.msg_tree_map) is dict
    assert pq.put_message([ext(105), ext(112)]) is False                  # 105 is held already
    assert (pq.msg_count, pq.msg_size, pq.first_offset()) == (13, 25, 100)
    assert pq.remove_message(msgs[1:4] + [FakeMsg(999)]) == 100           # 100 still in flight
    assert pq.remove_message(msgs[:1]) == 104 and pq.msg_size == 25 - 8
    batch = pq.take_messages(3)                                         # orderly from here on
    assert type(pq.msg_tree_map) is OrderedDict
    assert [m.queue_offset for m in batch] == [104, 105, 106]
    pq.make_message_to_consume_again(batch[1:])
    assert [m.queue_offset for m in pq.take_messages(4)] == [105, 106, 107, 108]
    pq.put_message([ext(113)])
    assert [m.queue_offset for m in pq.take_messages(10)] == [109, 110, 111, 112, 113]
    assert pq.commit() == 114 and pq.msg_count == 0 and pq.msg_size == 0


# -- offset stores ------------------------------------------------------------------------------------
def test_remote_offset_store_reads_broker_and_persists_changes():
    stored = {}
    calls = []

    def query(group, mq):
        if mq.queue_id == 9:
            raise MQBrokerError("nope", 1)
        if mq.queue_id == 8:
            raise RemotingError("timeout")
        return stored.get(mq, -1)

    def update(group, mq, off):
        calls.append((mq.queue_id, off))
        stored[mq] = off
    s = RemoteBrokerOffsetStore("g", query, update)
    a, b = MessageQueue("T", "b", 0), MessageQueue("T", "b", 1)
    assert s.read_offset(a, ReadOffsetType.READ_FROM_STORE) == -1
    assert s.read_offset(MessageQueue("T", "b", 9), ReadOffsetType.READ_FROM_STORE) == -1
    assert s.read_offset(MessageQueue("T", "b", 8), ReadOffsetType.READ_FROM_STORE) == -2
    s.update_offset(a, 5)
    s.update_offset(a, 3, increase_only=True)
    assert s.read_offset(a, ReadOffsetType.READ_FROM_MEMORY) == 5
    s.update_offset(b, 7)
    s.persist_all([a])                                  # only assigned queues
    assert calls == [(0, 5)]
    s.persist_all([a, b])
    assert calls == [(0, 5), (1, 7)]                    # unchanged ones are not re-sent
    s.forget_persisted(a)                               # a pull carried an older commitOffset
    s.persist_all([a, b])
    assert calls == [(0, 5), (1, 7), (0, 5)]
    s.persist_all([a, b], force=True)                   # shutdown: every one
    assert calls == [(0, 5), (1, 7), (0, 5), (0, 5), (1, 7)]
    s.remove_offset(a)
    assert s.read_offset(a, ReadOffsetType.READ_FROM_MEMORY) == -1
    assert s.read_offset(a) == 5                        # memory first, then the broker


def test_remote_offset_store_never_writes_back_an_offset_it_only_read():
    """A member that took a queue over (offset read from the broker) and shuts down or drops it
    before moving it writes nothing: the previous owner may have committed more meanwhile.  Once
    it moved the offset, a forced persist (shutdown) writes it even when already persisted."""
    calls = []
    s = RemoteBrokerOffsetStore("g", lambda g, mq: 199, lambda g, mq, off: calls.append(off))
    a = MessageQueue("T", "b", 3)
    assert s.read_offset(a, ReadOffsetType.READ_FROM_STORE) == 199
    s.persist_all([a], force=True)
    s.persist(a)
    assert calls == []
    s.update_offset(a, 200)
    s.persist_all([a])
    s.persist_all([a], force=True)
    s.persist(a)
    assert calls == [200, 200, 200]
    s.remove_offset(a)
    s.update_offset(a, 199)                             # read again later: nothing "loaded" any more
    s.persist_all([a], force=True)
    assert calls == [200, 200, 200, 199]


def test_remote_offset_store_persist_gives_up_on_a_silent_broker_group_for_the_round():
    """A broker group that does not answer costs one timeout per persist round, not one per queue
    (the push consumer's service thread persists, and must go on to refresh routes and rebalance);
    its offsets stay in memory and go in the next round; a refusal (MQBrokerError) skips only its queue."""
    calls, down = [], {"dead"}

    def update(group, mq, off):
        calls.append((mq.broker_name, mq.queue_id))
        if mq.broker_name in down:
            raise RemotingError("no response in time")
        if mq.queue_id == 9:
            raise MQBrokerError("refused", 1, "addr")
    s = RemoteBrokerOffsetStore("g", lambda g, mq: -1, update)
    queues = mqs(4, broker="dead") + mqs(2, broker="alive") + [MessageQueue("T", "alive", 9)]
    for mq in queues:
        s.update_offset(mq, 10 + mq.queue_id)
    s.persist_all(queues)
    assert calls == [("dead", 0), ("alive", 0), ("alive", 1), ("alive", 9)]
    down.clear()
    calls.clear()
    s.persist_all(queues)                      # the group is back: its queues go now, the others are done
    assert calls == [("dead", 0), ("dead", 1), ("dead", 2), ("dead", 3), ("alive", 9)]


def test_local_offset_store_round_trip_and_bak(tmp_path):
    s = LocalFileOffsetStore("g", "10.0.0.1@inst/x", str(tmp_path))
    assert s.store_path == os.path.join(str(tmp_path), "10.0.0.1@inst_x", "g", "offsets.json")
    a, b = MessageQueue("T", "b", 0), MessageQueue("%RETRY%g", "b", 0)
    s.update_offset(a, 10)
    s.update_offset(b, 2)
    s.persist_all([a])
    s.update_offset(a, 11)
    s.persist(a)
    with open(s.store_path) as f:
        assert json.load(f) == {"offsetTable": {"%RETRY%g/b/0": 2, "T/b/0": 11}}
    assert os.path.exists(s.store_path + ".bak")
    s2 = LocalFileOffsetStore("g", "10.0.0.1@inst/x", str(tmp_path))
    s2.load()
    assert s2.read_offset(a) == 11 and s2.read_offset(b) == 2
    s2.remove_offset(a)                                  # broadcasting keeps offsets
    assert s2.read_offset(a) == 11
    with open(s.store_path, "w") as f:
        f.write("{torn")
    s3 = LocalFileOffsetStore("g", "10.0.0.1@inst/x", str(tmp_path))
    s3.load()                                            # falls back to the .bak
    assert s3.read_offset(a) == 10


# -- subscriptions and pulled messages -----------------------------------------------------------------
def test_subscription_parse():
    assert SubscriptionData.build("T", "*").is_all
    assert SubscriptionData.build("T", "").is_all
    s = SubscriptionData.build("T", " b ||a||  b ")
    assert s.tags_set == {"a", "b"} and s.sub_string == "a || b"
    assert s.matches("a") and not s.matches("c") and not s.matches(None)
    assert s.to_wire()["subString"] == "a || b"


def records(*msgs):
    out = []
    for i, (body, props) in enumerate(msgs):
        m = cl.MessageExt()
        m.topic, m.body, m.properties, m.queue_offset = "T", body, dict(props), i
        m.store_host = bytes([127, 0, 0, 1, 0, 0, 0x2a, 0x9f])
        out.append(m)
    return out


def test_post_process_filters_exact_tags_and_restores_retry_topic():
    msgs = records((b"1", {"TAGS": "a"}), (b"2", {"TAGS": "b"}), (b"3", {}), (b"4", {"TAGS": "a", "RETRY_TOPIC": "T"}))
    for m in msgs:
        m.topic = "%RETRY%g"
    out = post_process_messages(msgs, SubscriptionData.build("%RETRY%g", "a"), "%RETRY%g")
    assert [m.body for m in out] == [b"1", b"4"]
    assert [m.topic for m in out] == ["%RETRY%g", "T"]


def test_post_process_inflates_compressed_bodies():
    msgs = records((zlib.compress(b"hello" * 50), {}), (b"not-compressed", {}), (b"garbage", {}))
    msgs[0].sys_flag |= 0x1
    msgs[2].sys_flag |= 0x1 | 0x300                      # zlib type, but not zlib: left as stored
    out = post_process_messages(msgs)
    assert [m.body for m in out] == [b"hello" * 50, b"not-compressed", b"garbage"]
