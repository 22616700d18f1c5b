"""MessageStore end to end, in process: put -> dispatch -> get / query / look-ups."""
import json
import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq._core import commitlog as cl
from rmq.errors import StoreLockedError
from rmq.status import GetMessageStatus, PutMessageStatus
from rmq.store.message_store import MessageStore
from tests.conftest import SMALL


def put_many(store, topic="TopicA", n=50, queues=4, body=lambda i: b"m%d" % i):
    results = []
    for i in range(n):
        r = store.put_message(topic, body(i), i % queues, tags=f"T{i % 3}", keys=[f"k{i}", f"order{i}"],
                              properties={"UNIQ_KEY": f"{i:032X}"})
        assert r.status is PutMessageStatus.PUT_OK, r.remark
        results.append(r)
    return results


def read_all(store, topic, queue_id, tags=None, max_msgs=7):
    out, off = [], 0
    while True:
        res = store.get_messages("g", topic, queue_id, off, max_msgs, tags)
        if res.status not in (GetMessageStatus.FOUND, GetMessageStatus.NO_MATCHED_MESSAGE):
            return out, res
        out.extend(res.messages())
        off = res.next_begin_offset


def test_put_dispatch_get_round_trip_across_file_rolls(open_store):
    s = open_store()
    put_many(s, n=400, body=lambda i: b"x" * (i % 300))
    assert len(s.commitlog.mapped_file_queue.files) > 3          # rolled several CommitLog files
    assert s.dispatch() == 400
    for q in range(4):
        msgs, last = read_all(s, "TopicA", q)
        assert [m.queue_offset for m in msgs] == list(range(100))
        assert [m.body for m in msgs] == [b"x" * (i % 300) for i in range(q, 400, 4)]
        assert last.status is GetMessageStatus.OFFSET_OVERFLOW_ONE
        assert last.next_begin_offset == 100 and last.max_offset == 100


def test_tag_filter(open_store):
    s = open_store()
    put_many(s, n=60)
    s.dispatch()
    msgs, _ = read_all(s, "TopicA", 0, tags="T0 || T2")
    assert {m.tags for m in msgs} == {"T0", "T2"}
    assert len(msgs) == len([i for i in range(0, 60, 4) if i % 3 in (0, 2)])
    msgs, _ = read_all(s, "TopicA", 0, tags=["T1"])
    assert {m.tags for m in msgs} == {"T1"}


def test_no_matched_message_advances_offset(open_store):
    s = open_store()
    put_many(s, n=8, queues=1)
    s.dispatch()
    res = s.get_messages("g", "TopicA", 0, 0, 32, tags="nope")
    assert res.status is GetMessageStatus.NO_MATCHED_MESSAGE and res.next_begin_offset == 8


def test_a_filtered_pull_looks_past_rocketmqs_window_and_an_unfiltered_one_reads_what_it_takes(open_store):
    """A tag filter reads MIN_CQ_UNITS_PER_READ entries (RocketMQ's 16,000 bytes), so a match
    behind many others is found in one call; without a filter a pull reads only the entries it
    can return (a POP of 32 copied 800 before)."""
    from rmq.store.message_store import MIN_CQ_UNITS_PER_READ
    s = open_store()                      # SMALL: a ConsumeQueue file of 64 entries caps the window
    per_file = s.config.mapped_file_size_consume_queue // 20
    assert 40 < per_file < MIN_CQ_UNITS_PER_READ
    for i in range(per_file + 10):
        assert s.put_message("W", b"m%d" % i, 0, tags="hit" if i in (38, 39) else "miss").status \
            is PutMessageStatus.PUT_OK
    s.dispatch()
    res = s.get_messages("g", "W", 0, 0, 4, tags="hit")
    assert res.status is GetMessageStatus.FOUND and [m.body for m in res.messages()] == [b"m38", b"m39"]
    assert res.next_begin_offset == per_file                              # the window, to its file's end
    cq = s.consume_queue_table[("W", 0)]
    asked = []
    read_raw = cq.read_raw
    cq.read_raw = lambda off, n: asked.append(n) or read_raw(off, n)       # how many entries each pull reads
    res = s.get_messages("g", "W", 0, 10, 4)
    assert [m.queue_offset for m in res.messages()] == [10, 11, 12, 13] and res.next_begin_offset == 14
    s.get_messages("g", "W", 0, 0, 4, tags="hit")
    assert asked == [4, MIN_CQ_UNITS_PER_READ]


def test_get_statuses(open_store):
    s = open_store()
    assert s.get_messages("g", "Nope", 0, 0, 1).status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
    put_many(s, n=4, queues=1)
    s.dispatch()
    assert s.get_messages("g", "TopicA", 0, 4, 1).status is GetMessageStatus.OFFSET_OVERFLOW_ONE
    r = s.get_messages("g", "TopicA", 0, 9, 1)
    assert r.status is GetMessageStatus.OFFSET_OVERFLOW_BADLY and r.next_begin_offset == 0  # min offset 0
    r = s.get_messages("g", "TopicA", 0, 2, 1)
    assert r.status is GetMessageStatus.FOUND and r.next_begin_offset == 3 and r.message_count == 1


def test_batch_limits_follow_transfer_config(open_store):
    s = open_store(max_transfer_count_on_message_in_memory=5)
    put_many(s, n=20, queues=1)
    s.dispatch()
    assert s.get_messages("g", "TopicA", 0, 0, 100).message_count == 5
    s2 = open_store(path=os.path.join(os.path.dirname(s.root), "b"), max_transfer_bytes_on_message_in_memory=300)
    put_many(s2, n=20, queues=1)
    s2.dispatch()
    res = s2.get_messages("g", "TopicA", 0, 0, 100)
    assert 1 <= res.message_count and len(res.records) <= 300


def test_query_by_key_uniq_key_msg_id_and_offset(open_store):
    s = open_store()
    results = put_many(s, n=30)
    s.dispatch()
    found = s.query_message("TopicA", "order17").messages()
    assert [m.body for m in found] == [b"m17"]
    assert [m.body for m in s.query_message("TopicA", f"{5:032X}").messages()] == [b"m5"]
    assert s.query_message("TopicA", "absent").records == []
    assert s.query_message("OtherTopic", "order17").records == []
    m = s.look_message_by_msg_id(results[9].msg_id)
    assert m.body == b"m9" and m.offset_msg_id == results[9].msg_id
    assert s.look_message_by_offset(results[3].wrote_offset).body == b"m3"
    assert s.look_message_by_offset(results[3].wrote_offset + 1) is None


def test_query_time_window(open_store):
    s = open_store()
    put_many(s, n=5)
    s.dispatch()
    now = int(time.time() * 1000)
    assert len(s.query_message("TopicA", "k1", begin_ms=now - 60_000, end_ms=now + 60_000).records) == 1
    assert s.query_message("TopicA", "k1", begin_ms=now + 3_600_000, end_ms=now + 7_200_000).records == []


def test_offset_by_time(open_store):
    s = open_store()
    stamps = []
    for i in range(6):
        r = s.put_message("TopicT", b"%d" % i, 0)
        stamps.append(r.append.store_timestamp)
        time.sleep(0.005)
    s.dispatch()
    for i, ts in enumerate(stamps):
        assert s.get_offset_in_queue_by_time("TopicT", 0, ts) == i
    assert s.get_offset_in_queue_by_time("TopicT", 0, stamps[0] - 10_000) == 0
    assert s.get_offset_in_queue_by_time("TopicT", 0, stamps[-1] + 10_000) == 5
    assert s.offset_by_time("Nope", 0, 1) == 0
    assert (s.min_offset("TopicT", 0), s.max_offset("TopicT", 0)) == (0, 6)


def test_batch_put_is_atomic_and_consecutive(open_store):
    s = open_store()
    batch = cl.encode_batch([(b"b%d" % i, cl.encode_properties({"KEYS": f"bk{i}"}), 0) for i in range(10)])
    r = s.put_messages("TopicB", 2, batch, properties={"BATCH": "1"})
    assert r.ok and r.append.msg_num == 10 and len(r.msg_ids) == 10 and r.msg_id.count(",") == 9
    s.dispatch()
    msgs = s.get_messages("g", "TopicB", 2, 0, 32).messages()
    assert [m.queue_offset for m in msgs] == list(range(10))
    assert all(m.properties["BATCH"] == "1" for m in msgs)
    assert s.query_message("TopicB", "bk4").messages()[0].body == b"b4"


def test_clean_restart_keeps_everything_and_offsets_continue(open_store, store_dir):
    s = open_store()
    put_many(s, n=40)
    s.dispatch()
    s.consumer_offset_manager.commit_offset("g", "TopicA", 1, 7)
    s.shutdown()
    assert not os.path.exists(os.path.join(store_dir, "abort"))
    s = open_store()
    assert s.last_exit_ok
    assert s.consumer_offset_manager.query_offset("g", "TopicA", 1) == 7
    r = s.put_message("TopicA", b"next", 1)
    assert r.queue_offset == 10
    s.dispatch()
    assert [m.body for m in read_all(s, "TopicA", 1)[0]][-1] == b"next"


def test_lock_refuses_second_store(open_store, store_dir):
    open_store()
    with pytest.raises(StoreLockedError, match="locked"):
        MessageStore(store_dir, **SMALL)


def test_lock_released_on_shutdown(open_store, store_dir):
    s = open_store()
    s.shutdown()
    s2 = MessageStore(store_dir, **SMALL)
    s2.shutdown()


def test_store_files_laid_out_as_rocketmq(open_store, store_dir):
    s = open_store()
    put_many(s, n=10, queues=2)
    s.dispatch()
    s.shutdown()
    names = set(os.listdir(store_dir))
    assert {"commitlog", "consumequeue", "index", "checkpoint", "lock", "config"} <= names
    assert sorted(os.listdir(os.path.join(store_dir, "consumequeue", "TopicA"))) == ["0", "1"]
    assert os.listdir(os.path.join(store_dir, "commitlog"))[0] == "0" * 20
    assert os.path.getsize(os.path.join(store_dir, "checkpoint")) == 4096
    assert all(len(n) == 17 and n.isdigit() for n in os.listdir(os.path.join(store_dir, "index")))


def test_config_json_written_atomically_with_bak_and_recovered(open_store, store_dir):
    s = open_store()
    tcm = s.topic_config_manager
    tcm.update_topic_config(tcm.new_topic_config("TopicA", 4, 4))
    tcm.update_topic_config(tcm.new_topic_config("TopicB", 2, 2))
    path = os.path.join(store_dir, "config", "topics.json")
    with open(path) as f:
        assert set(json.load(f)["topicConfigTable"]) == {"TopicA", "TopicB"}
    with open(path + ".bak") as f:
        assert set(json.load(f)["topicConfigTable"]) == {"TopicA"}
    s.shutdown()
    with open(path, "w") as f:
        f.write("{torn")                      # a torn main file: the .bak is used
    s = open_store()
    assert "TopicA" in s.topic_config_manager.topic_config_table


def test_sync_flush_put_is_durable_before_return(open_store):
    s = open_store(flush_disk_type="SYNC_FLUSH")
    r = s.put_message("TopicS", b"durable", 0)
    assert r.status is PutMessageStatus.PUT_OK
    assert s.commitlog.flushed_offset == s.commitlog.get_max_offset()
    # under SYNC_FLUSH reput dispatches only what is flushed
    assert s.reput_end_offset() == s.commitlog.flushed_offset


def test_slave_store_refuses_writes(open_store):
    s = open_store(broker_role="SLAVE")
    r = s.put_message("TopicA", b"x", 0)
    assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE


def test_shut_down_store_refuses(open_store):
    s = open_store()
    s.shutdown()
    assert s.put_message("TopicA", b"x", 0).status is PutMessageStatus.SERVICE_NOT_AVAILABLE


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["TopicA", "T_b", "%RETRY%grp", "x" * 127]),
                          st.integers(0, 3),
                          st.binary(max_size=2000),
                          st.one_of(st.none(), st.text(alphabet="abcXY|", min_size=1, max_size=6)),
                          st.lists(st.text(alphabet="kK09-_é", min_size=1, max_size=8), max_size=3),
                          st.dictionaries(st.text(alphabet="pq", min_size=1, max_size=3),
                                          st.text(alphabet="vw 1", min_size=1, max_size=5), max_size=2)),
                min_size=1, max_size=60))
def test_hypothesis_round_trip_encode_append_scan_get(tmp_path_factory, msgs):
    d = str(tmp_path_factory.mktemp("hyp"))
    s = MessageStore(d, mapped_file_size_commit_log=8192, mapped_file_size_consume_queue=100,
                     max_hash_slot_num=16, max_index_num=64)
    try:
        expected = {}
        for topic, q, body, tags, keys, props in msgs:
            r = s.put_message(topic, body, q, tags=tags, keys=keys, properties=props)
            assert r.ok, r.remark
            expected.setdefault((topic, q), []).append((body, tags, keys, props, r.msg_id))
        assert s.dispatch() == len(msgs)
        s.shutdown()
        s = MessageStore(d, mapped_file_size_commit_log=8192, mapped_file_size_consume_queue=100,
                         max_hash_slot_num=16, max_index_num=64)
        for (topic, q), exp in expected.items():
            got, _ = read_all(s, topic, q, max_msgs=5)
            assert len(got) == len(exp)
            for m, (body, tags, keys, props, msg_id) in zip(got, exp):
                assert m.body == body and m.topic == topic and m.queue_id == q
                assert m.tags == (tags or None)
                assert m.keys == keys
                assert m.offset_msg_id == msg_id
                for k, v in props.items():
                    assert m.properties[k] == v
            for body, tags, keys, props, msg_id in exp:
                for k in keys:
                    assert any(m.body == body for m in s.query_message(topic, k).messages())
    finally:
        s.shutdown()


def test_delayed_message_is_delivered_after_its_level(open_store):
    s = open_store(message_delay_level="100ms 200ms 1s")
    r = s.put_message("TopicD", b"later", 2, properties={"DELAY": "2"}, keys=["dk"])
    assert r.ok
    s.dispatch()
    assert s.get_max_offset_in_queue("TopicD", 2) == 0           # parked in SCHEDULE_TOPIC_XXXX queue 1
    assert s.get_max_offset_in_queue("SCHEDULE_TOPIC_XXXX", 1) == 1
    stored = s.get_messages("g", "SCHEDULE_TOPIC_XXXX", 1, 0, 1).messages()[0].store_timestamp
    assert s.deliver_delayed(now_ms=stored) == 0                 # not due yet (level 2: 200 ms)
    assert s.deliver_delayed(now_ms=stored + 199) == 0
    assert s.deliver_delayed(now_ms=stored + 200) == 1
    s.dispatch()
    m = s.get_messages("g", "TopicD", 2, 0, 1).messages()[0]
    assert m.body == b"later" and "DELAY" not in m.properties and m.properties["REAL_TOPIC"] == "TopicD"
    assert s.deliver_delayed() == 0                              # offsets advanced: nothing twice
    s.shutdown()
    s = open_store(message_delay_level="100ms 200ms 1s")
    assert s.delay_offset_manager.offset_table[2] == 1


def test_delay_levels_parse():
    from rmq.store.schedule import parse_delay_levels
    assert parse_delay_levels()[:3] == [1000, 5000, 10000] and parse_delay_levels()[-1] == 7_200_000
    assert len(parse_delay_levels()) == 18
    with pytest.raises(ValueError, match="bad token"):
        parse_delay_levels("1s 5x")


def test_store_timestamp_from_skips_a_files_end_padding(open_store):
    """CommitLog.store_timestamp_from (the master's HA lag in ms): at a file's BLANK end record the
    next file's first record answers, where pickup_store_timestamp has no figure."""
    s = open_store()
    results = put_many(s, n=200, body=lambda i: b"y" * 200)
    size = SMALL["mapped_file_size_commit_log"]
    ends = [r.wrote_offset + r.append.wrote_bytes for r in results]
    blank = max(e for e in ends if e < size)                     # where file 0's padding starts
    first_of_next = next(r for r in results if r.wrote_offset >= size)
    clog = s.commitlog
    assert blank < size and clog.pickup_store_timestamp(blank) == -1
    assert clog.store_timestamp_from(blank) == clog.pickup_store_timestamp(first_of_next.wrote_offset) > 0
    assert clog.store_timestamp_from(results[3].wrote_offset) == clog.pickup_store_timestamp(results[3].wrote_offset)
    assert clog.store_timestamp_from(clog.get_max_offset()) == -1    # nothing there yet


def test_consume_queue_min_follows_commitlog_files_deleted_after_the_cleaners_announcement(open_store):
    """The cleaner (another process) deletes CommitLog files and announces its min offset; the
    broker's store may handle an announcement after more files went.  The ConsumeQueues' min
    offsets follow the CommitLog's min offset then, and on the next announcement (which finds
    no file to drop), so a pull from a queue's min offset finds a stored message.  (One
    ConsumeQueue file, as in a broker: reput deletes ConsumeQueue files wholly below the min.)"""
    s = open_store(mapped_file_size_consume_queue=20 * 1024)
    put_many(s, n=400, queues=1, body=lambda i: b"x" * 200)
    assert s.dispatch() == 400
    files = s.commitlog.mapped_file_queue.files
    assert len(files) >= 5
    first_announced = files[1].file_from_offset        # the cleaner deleted file 0 and said so ...
    for mf in files[:3]:                                # ... then deleted files 1 and 2 as well
        os.remove(mf.file_name)
    assert s.drop_deleted_commit_log_files(first_announced) == 3
    lo = s.get_min_offset_in_queue("TopicA", 0)
    res = s.get_messages("g", "TopicA", 0, lo, 1)
    assert res.status is GetMessageStatus.FOUND, res.status
    assert res.messages()[0].commitlog_offset >= s.commitlog.get_min_offset()
    # the stale announcement again, and the one for file 2: nothing to drop, nothing moves back
    assert s.drop_deleted_commit_log_files(first_announced) == 0
    assert s.get_min_offset_in_queue("TopicA", 0) == lo
    os.remove(s.commitlog.mapped_file_queue.files[0].file_name)   # one more file goes ...
    s.commitlog.mapped_file_queue.drop_missing_head()             # ... and is dropped by another path
    assert s.drop_deleted_commit_log_files(s.commitlog.get_min_offset()) == 0
    lo2 = s.get_min_offset_in_queue("TopicA", 0)
    assert lo2 > lo
    assert s.get_messages("g", "TopicA", 0, lo2, 1).status is GetMessageStatus.FOUND
