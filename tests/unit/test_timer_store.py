"""The timer store (rmq.store.timer) in process: RocketMQ 5's byte layouts and constants, the send-side
transformation and its limits, deliver-time order within a slot, rolls beyond the roll window, TimerLog
recovery of a torn tail, and a crash after re-puts but before the checkpoint (nothing delivered twice)."""
import os
import struct
import time

import pytest

from rmq._core import commitlog as _cl
from rmq.store import timer as T
from rmq.store.config import TIMER_MAX_DELAY_SEC_LIMIT, MessageStoreConfig
from rmq.store.message_store import MessageStore


def open_stores(path, **cfg):
    cfg.setdefault("timer_precision_ms", 100)
    conf = MessageStoreConfig(store_path_root_dir=str(path), mapped_file_size_commit_log=1 << 20,
                              mapped_file_size_timer_log=8192, **cfg)
    s = MessageStore(str(path), conf)
    ts = T.TimerMessageStore(s, slots_total=3600)         # a small wheel: 2 x 6 minutes at 100 ms
    ts.load()
    return s, ts


def send_timer(s, topic, queue_id, deliver_ms, key, now=None):
    t, q, p = T.transform_timer(topic, queue_id, {"UNIQ_KEY": key, T.PROPERTY_TIMER_DELIVER_MS: str(deliver_ms)},
                                s.config.timer_precision_ms, s.config.timer_max_delay_sec, now)
    batch = _cl.encode_batch([(key.encode(), _cl.encode_properties(p), 0)])
    r = s.put_encoded(t, q, batch, None, 0, int(time.time() * 1000), None, 0, 1)
    assert r.ok
    return t


def drive(s, ts, until, timeout_s=10.0):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        s.dispatch()
        ts.run()
        s.dispatch()
        if until():
            return
        time.sleep(0.005)
    raise AssertionError("condition not met")


def real_messages(s, topic, queues=1):
    out = []
    for q in range(queues):
        off = 0
        while True:
            res = s.get_messages("probe", topic, q, off, 32)
            if not res.message_count:
                break
            out += res.messages()
            off = res.next_begin_offset
    return out


def test_layout_constants_are_rocketmqs():
    assert T.UNIT_SIZE == 52 == struct.calcsize(">iqiqiqiiq")
    assert T.SLOT_SIZE == 32 == struct.calcsize(">qqqii")
    assert T.UNIT_PRE_SIZE_FOR_MSG == 4 + 8 + 4 + 8 + 4
    # TimerLog.BLANK_MAGIC_CODE = 0xBBCCDDEE ^ 1880681586 + 8 (Java: + binds tighter than ^)
    assert T.BLANK_MAGIC_CODE == struct.unpack(">i", struct.pack(">I", 0xBBCCDDEE ^ 1880681594))[0]
    assert T.SLOTS_TOTAL == 7 * 86_400 and T.TIMER_BLANK_SLOTS == 60
    assert T.TIMER_TOPIC == "rmq_sys_wheel_timer"
    # String.hashCode: s[0]*31^(n-1) + ... + s[n-1], in int32
    want = sum(ord(ch) * 31 ** (8 - i) for i, ch in enumerate("TopicTest")) & 0xFFFFFFFF
    assert T.java_string_hash("TopicTest") == struct.unpack(">i", struct.pack(">I", want))[0]
    assert T.java_string_hash("a") == 97
    assert T.java_string_hash("") == 0 and T.java_string_hash(None) == 0


def test_store_config_defaults_and_limits():
    c = MessageStoreConfig()
    assert (c.timer_precision_ms, c.timer_max_delay_sec, c.timer_roll_window_slot, c.timer_flush_interval_ms,
            c.mapped_file_size_timer_log, c.timer_wheel_enable) == (1000, 259_200, 172_800, 1000, 100 << 20, True)
    assert MessageStoreConfig(timer_precision_ms=150).timer_precision_ms == 100     # setTimerPrecisionMs
    assert MessageStoreConfig(timer_precision_ms=700).timer_precision_ms == 500
    assert MessageStoreConfig(timer_precision_ms=5000).timer_precision_ms == 1000
    assert MessageStoreConfig(timer_precision_ms=10).timer_precision_ms == 100
    with pytest.raises(ValueError, match="timerMaxDelaySec"):
        MessageStoreConfig(timer_max_delay_sec=TIMER_MAX_DELAY_SEC_LIMIT + 1)
    with pytest.raises(ValueError, match="timerMaxDelaySec"):
        MessageStoreConfig(timer_max_delay_sec=0)
    with pytest.raises(ValueError, match="mappedFileSizeTimerLog"):
        MessageStoreConfig(mapped_file_size_timer_log=100)
    assert MessageStoreConfig.from_properties({"timerPrecisionMs": "100"}).timer_precision_ms == 100


def test_transform_rounds_down_and_refuses_bad_input():
    now = 1_000_000
    t, q, p = T.transform_timer("A", 3, {"TIMER_DELIVER_MS": str(now + 5_500)}, 1000, 100, now)
    assert (t, q) == (T.TIMER_TOPIC, 0)
    assert p["TIMER_OUT_MS"] == str(now + 5_000) and p["REAL_TOPIC"] == "A" and p["REAL_QID"] == "3"
    assert p["UNIQ_KEY"]                                  # given one when missing
    # an exact multiple is lowered by one precision (transformTimerMessage)
    _, _, p = T.transform_timer("A", 0, {"TIMER_DELIVER_MS": str(now + 6_000)}, 1000, 100, now)
    assert p["TIMER_OUT_MS"] == str(now + 5_000)
    _, _, p = T.transform_timer("A", 0, {"TIMER_DELAY_MS": "2500"}, 100, 100, now)
    assert p["TIMER_OUT_MS"] == str(now + 2_500 - 100) and p["TIMER_DELIVER_MS"] == str(now + 2_500)
    _, _, p = T.transform_timer("A", 0, {"TIMER_DELAY_SEC": "3"}, 1000, 100, now)
    assert p["TIMER_OUT_MS"] == str(now + 2_000)
    # a time not ahead: stored as is, delivered at once
    assert T.transform_timer("A", 1, {"TIMER_DELIVER_MS": str(now)}, 1000, 100, now)[:2] == ("A", 1)
    # a delay level wins over the timer properties, which are dropped
    t, _, p = T.transform_timer("A", 1, {"DELAY": "2", "TIMER_DELAY_MS": "10"}, 1000, 100, now)
    assert t == "A" and "TIMER_DELAY_MS" not in p
    for bad in ({"TIMER_DELIVER_MS": "soon"}, {"TIMER_DELAY_MS": "-5"},
                {"TIMER_DELIVER_MS": str(now + 100_001)},
                {"TIMER_DELIVER_MS": str(now + 5000), "TIMER_DEL_UNIQKEY": "x"}):
        with pytest.raises(T.TimerMessageError) as e:
            T.transform_timer("A", 0, bad, 1000, 100, now)
        assert e.value.status == "WHEEL_TIMER_MSG_ILLEGAL"
    with pytest.raises(T.TimerMessageError, match="max delay 100000ms"):
        T.transform_timer("A", 0, {"TIMER_DELIVER_MS": str(now + 100_001)}, 1000, 100, now)


def test_slot_is_delivered_in_deliver_time_order_never_early(tmp_path):
    s, ts = open_stores(tmp_path)
    base = (int(time.time() * 1000) // 100 + 5) * 100
    ats = [base + 1 + (i * 7919) % 99 for i in range(40)]          # one 100 ms slot, shuffled
    for i, at in enumerate(ats):
        send_timer(s, "R", 0, at, f"k{i}")
    drive(s, ts, lambda: ts.stats["delivered"] >= 40)
    got = real_messages(s, "R")
    assert [int(m.properties["TIMER_DELIVER_MS"]) for m in got] == sorted(ats)
    assert all(m.store_timestamp >= int(m.properties["TIMER_DELIVER_MS"]) for m in got)
    ts.close()
    s.shutdown()


def test_filling_slot_delivers_each_timer_at_its_own_time_not_the_slots_end(tmp_path):
    """RocketMQ re-puts a slot once the write time passed it (up to timerPrecisionMs late); rmq
    re-puts each unit of the slot filling now as its exact time comes.  Driven by run(now_ms)."""
    s, ts = open_stores(tmp_path, timer_precision_ms=1000)
    slot = (int(time.time() * 1000) // 1000 + 3) * 1000
    for i, off in enumerate((900, 100, 500)):
        send_timer(s, "R", 0, slot + off, f"e{i}", now=slot - 2500)
    s.dispatch()
    ts.run(now_ms=slot - 500)
    assert ts.stats["enqueued"] == 3 and ts.stats["delivered"] == 0
    steps = [(slot + 99, []), (slot + 150, [100]), (slot + 600, [100, 500]), (slot + 950, [100, 500, 900])]
    for now, want in steps:
        for _ in range(3):
            ts.run(now_ms=now)
        s.dispatch()
        got = [int(m.properties["TIMER_DELIVER_MS"]) - slot for m in real_messages(s, "R")]
        assert got == want, (now - slot, got)
        assert ts.pending(10)["total"] == 3 - len(want)
    assert ts.next_due_ms() is None
    ts.run(now_ms=slot + 1000)                                      # the slot is over: read time moves on
    assert ts.curr_read_time_ms == slot + 1000 and ts.stats["delivered"] == 3
    ts.close()
    s.shutdown()


def test_rolled_timer_is_delivered_once_at_its_time(tmp_path):
    s, ts = open_stores(tmp_path, timer_roll_window_slot=5)        # 500 ms: a timer 1.5 s ahead rolls
    at = int(time.time() * 1000) + 1500
    send_timer(s, "R", 0, at, "roll-me")
    drive(s, ts, lambda: ts.stats["delivered"] >= 1)
    assert ts.stats["rolled"] >= 1
    got = real_messages(s, "R")
    assert len(got) == 1 and got[0].store_timestamp >= at
    assert int(got[0].properties["TIMER_ROLL_TIMES"]) == ts.stats["rolled"]
    ts.close()
    s.shutdown()


def test_crash_after_reputs_before_checkpoint_delivers_nothing_twice(tmp_path):
    s, ts = open_stores(tmp_path)
    now = int(time.time() * 1000)
    for i in range(30):
        send_timer(s, "R", i % 2, now + 300 + i * 10, f"c{i}")
    ts.flush()                                                      # checkpoint before the re-puts
    ts._last_flush = time.monotonic() + 3600                        # and none after them
    drive(s, ts, lambda: ts.stats["delivered"] >= 30)
    # kill -9: nothing flushed or closed; MAP_SHARED writes stay, as in the page cache
    s.abandon()
    ts.closed = True
    s2 = MessageStore(str(tmp_path), s.config)
    ts2 = T.TimerMessageStore(s2, slots_total=3600)
    ts2.load()
    assert len(ts2._delivered) == 30
    for _ in range(20):
        s2.dispatch()
        ts2.run()
    s2.dispatch()
    assert ts2.stats["delivered"] == 0 and ts2.stats["skippedDuplicates"] == 30
    assert len(real_messages(s2, "R", 2)) == 30
    ts2.close()
    s2.shutdown()


def test_timerlog_torn_tail_is_cut_and_timers_survive(tmp_path):
    s, ts = open_stores(tmp_path)
    at = int(time.time() * 1000) + 60_000
    for i in range(10):
        send_timer(s, "R", 0, at + i, f"t{i}")
    drive(s, ts, lambda: ts.stats["enqueued"] >= 10)
    end = ts.timer_log.max_offset()
    assert end == 10 * T.UNIT_SIZE
    mf = ts.timer_log.mfq.files[-1]
    mf.write_at(end, struct.pack(">iq", 52, 12345))                # half a unit: a torn append
    ts.close()
    s.shutdown()
    s2 = MessageStore(str(tmp_path), s.config)
    ts2 = T.TimerMessageStore(s2, slots_total=3600)
    ts2.load()
    assert ts2.timer_log.max_offset() == end
    assert ts2.pending(100)["total"] == 10
    ts2.close()
    s2.shutdown()


def test_without_timer_files_past_deliveries_are_not_repeated(tmp_path):
    """A promoted slave (or lost timer files): the replicated timer queue is enqueued from its start
    with no checkpoint; timers another broker already delivered are found and skipped."""
    import shutil
    s, ts = open_stores(tmp_path)
    now = int(time.time() * 1000)
    for i in range(10):
        send_timer(s, "R", 0, now + 200 + i, f"p{i}")
    drive(s, ts, lambda: ts.stats["delivered"] >= 10)
    ts.close()
    s.shutdown()
    for name in ("timerwheel", "timerlog", os.path.join("config", "timercheck")):
        path = os.path.join(str(tmp_path), name)
        shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
    s2 = MessageStore(str(tmp_path), s.config)
    ts2 = T.TimerMessageStore(s2, slots_total=3600)
    ts2.load()
    for _ in range(20):
        s2.dispatch()
        ts2.run()
    s2.dispatch()
    assert ts2.stats["delivered"] == 0 and ts2.stats["skippedDuplicates"] == 10
    assert len(real_messages(s2, "R")) == 10
    ts2.close()
    s2.shutdown()
