"""ConfigWriter: the JSON config files written off the broker's main thread (persist_soon), in
the order they were handed over, durable when persist() returns, and everything queued written
by a clean store shutdown."""
import json
import os
import threading
import time

import pytest

from rmq.store.config_manager import ConfigWriter, ConsumerOffsetManager, TopicConfigManager
from rmq.store.message_store import MessageStore
from tests.conftest import SMALL


def read(path):
    with open(path) as f:
        return f.read()


def test_the_newest_text_of_a_path_wins_and_wait_returns_once_it_is_written(tmp_path):
    w = ConfigWriter()
    p = str(tmp_path / "a.json")
    seqs = [w.submit(p, json.dumps({"n": i})) for i in range(50)]
    w.wait(p, seqs[-1])
    assert json.loads(read(p)) == {"n": 49}
    assert seqs == sorted(seqs)
    w.flush()
    assert json.loads(read(p)) == {"n": 49}       # no older text written after the newest
    assert not os.path.exists(p + ".tmp")
    w.close()


def test_a_failed_write_is_raised_to_its_waiter_and_the_next_one_succeeds(tmp_path):
    w = ConfigWriter()
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    bad = str(blocker / "x.json")                 # its directory is a file: makedirs fails
    seq = w.submit(bad, "{}")
    with pytest.raises(OSError):
        w.wait(bad, seq)
    good = str(tmp_path / "ok.json")
    w.wait(good, w.submit(good, "{}"))
    assert read(good) == "{}"
    w.close()


def test_close_writes_what_is_queued_and_refuses_more(tmp_path):
    w = ConfigWriter()
    paths = [str(tmp_path / f"{i}.json") for i in range(20)]
    for i, p in enumerate(paths):
        w.submit(p, str(i))
    w.close()
    assert [read(p) for p in paths] == [str(i) for i in range(20)]
    with pytest.raises(RuntimeError, match="closed"):
        w.submit(paths[0], "late")
    assert read(paths[0]) == "0"


def test_no_thread_until_the_first_submit(tmp_path):
    before = {t.name for t in threading.enumerate()}
    w = ConfigWriter("cw-test")
    assert "cw-test" not in {t.name for t in threading.enumerate()} - before
    w.submit(str(tmp_path / "a.json"), "{}")
    assert "cw-test" in {t.name for t in threading.enumerate()}
    w.close()
    assert "cw-test" not in {t.name for t in threading.enumerate()}


def test_persist_after_persist_soon_leaves_the_newest_table(tmp_path):
    w = ConfigWriter()
    m = ConsumerOffsetManager(str(tmp_path))
    m.writer = w
    m.commit_offset("g", "T", 0, 5)
    m.persist_soon()
    m.commit_offset("g", "T", 0, 7)
    m.persist()                                    # durable on return, after the queued text
    again = ConsumerOffsetManager(str(tmp_path))
    again.load()
    assert again.query_offset("g", "T", 0) == 7
    w.close()


def test_clamp_to_queue_ends_lowers_only_offsets_past_their_queue_end(tmp_path):
    """A promoted slave's committed offsets past its queues' ends (the old master's unreplicated
    tail) are lowered to the ends; the others, and the data version when none moved, are kept."""
    m = ConsumerOffsetManager(str(tmp_path))
    m.commit_offset("g", "T", 0, 5)
    m.commit_offset("g", "T", 1, 9)
    m.commit_offset("g", "%RETRY%g", 0, 4)
    m.commit_offset("h", "Gone", 0, 7)
    ends = {("T", 0): 5, ("T", 1): 6, ("%RETRY%g", 0): 2}
    lowered = m.clamp_to_queue_ends(lambda topic, q: ends.get((topic, q), 0))
    assert sorted(lowered) == [("%RETRY%g@g", 0, 4, 2), ("Gone@h", 0, 7, 0), ("T@g", 1, 9, 6)]
    assert [m.query_offset("g", "T", 0), m.query_offset("g", "T", 1), m.query_offset("g", "%RETRY%g", 0),
            m.query_offset("h", "Gone", 0)] == [5, 6, 2, 0]
    version = m.data_version.to_json()
    assert m.clamp_to_queue_ends(lambda topic, q: ends.get((topic, q), 0)) == []
    assert m.data_version.to_json() == version


def test_without_a_writer_persist_soon_writes_at_once(tmp_path):
    m = TopicConfigManager(str(tmp_path))
    m.topic_config_table["T"] = m.new_topic_config("T")
    m.persist_soon()
    again = TopicConfigManager(str(tmp_path))
    again.load()
    assert "T" in again.topic_config_table


def test_a_store_shutdown_writes_the_persist_soon_texts(tmp_path):
    s = MessageStore(str(tmp_path), **SMALL)
    for i in range(30):
        s.consumer_offset_manager.commit_offset("g", "T", 0, i)
        s.consumer_offset_manager.persist_soon()
    s.consumer_offset_manager.commit_offset("g", "T", 1, 3)    # not handed to the writer: shutdown's own
    s.shutdown()
    s2 = MessageStore(str(tmp_path), **SMALL)
    assert s2.consumer_offset_manager.query_offset("g", "T", 0) == 29
    assert s2.consumer_offset_manager.query_offset("g", "T", 1) == 3
    s2.shutdown()


def test_an_auto_created_group_is_written_by_the_writer_thread(tmp_path):
    from rmq.store.config_manager import SubscriptionGroupManager
    w = ConfigWriter()
    m = SubscriptionGroupManager(str(tmp_path))
    m.writer = w
    m.update_subscription_group_config(m.new_group_config("auto"), wait=False)
    assert "auto" in m.subscription_group_table               # served at once, from memory
    w.flush()
    again = SubscriptionGroupManager(str(tmp_path))
    again.load()
    assert "auto" in again.subscription_group_table
    w.close()


class HeldWrite:
    """The config writer's next write waits until :meth:`release` (write_file_atomically patched);
    :meth:`wait_started` returns once the thread is held and lets later writes through."""

    def __init__(self, monkeypatch):
        import rmq.store.config_manager as cm
        self.cm, self.mp = cm, monkeypatch
        self.real = cm.write_file_atomically
        self.started, self.released = threading.Event(), threading.Event()
        monkeypatch.setattr(cm, "write_file_atomically", self._held)

    def _held(self, path, text):
        self.started.set()
        assert self.released.wait(30)
        self.real(path, text)

    def wait_started(self) -> None:
        assert self.started.wait(30)
        self.mp.setattr(self.cm, "write_file_atomically", self.real)

    def release(self) -> None:
        self.released.set()

    def release_once_closed(self, w: ConfigWriter) -> threading.Thread:
        """A thread that releases the held write once ``w`` is being closed (its queue settled)."""
        def go():
            end = time.monotonic() + 30
            while not w._closed and time.monotonic() < end:
                time.sleep(0.001)
            self.release()
        t = threading.Thread(target=go)
        t.start()
        return t


def hold_one_and_queue_one(s: MessageStore, monkeypatch) -> HeldWrite:
    """Offset 5 being written (held), offset 9 queued behind it."""
    hold = HeldWrite(monkeypatch)
    s.consumer_offset_manager.commit_offset("g", "T", 0, 5)
    s.consumer_offset_manager.persist_soon()
    hold.wait_started()
    s.consumer_offset_manager.commit_offset("g", "T", 0, 9)
    s.consumer_offset_manager.persist_soon()
    return hold


def test_an_abandoned_store_writes_nothing_it_had_queued(tmp_path, monkeypatch):
    """MessageStore.abandon (a kill -9 in-process): the write under way ends, what was queued behind
    it is dropped and the thread ends, so a store reopened on the same directory is never
    overwritten by the old one's texts."""
    s = MessageStore(str(tmp_path), **SMALL)
    w = s.config_writer
    t = hold_one_and_queue_one(s, monkeypatch).release_once_closed(w)
    s.abandon()
    t.join()
    assert not w._thread.is_alive()
    s2 = MessageStore(str(tmp_path), **SMALL)
    assert s2.consumer_offset_manager.query_offset("g", "T", 0) == 5
    s2.shutdown()


def test_close_for_handoff_writes_what_persist_soon_queued_before_it_returns(tmp_path, monkeypatch):
    """The broker's stop (close_for_handoff): a text still queued behind a slow write is on disk
    when the store is closed, not at some later moment of a daemon thread."""
    s = MessageStore(str(tmp_path), **SMALL)
    t = hold_one_and_queue_one(s, monkeypatch).release_once_closed(s.config_writer)
    s.close_for_handoff()
    t.join()
    again = ConsumerOffsetManager(os.path.join(str(tmp_path), "config"))
    again.load()
    assert again.query_offset("g", "T", 0) == 9


def test_close_with_drop_forgets_the_queue_and_a_waiter_is_told(tmp_path, monkeypatch):
    w = ConfigWriter()
    p = str(tmp_path / "a.json")
    w.wait(p, w.submit(p, "1"))
    hold = HeldWrite(monkeypatch)
    w.submit(p, "2")                               # under way
    hold.wait_started()
    seq = w.submit(p, "3")                         # queued behind it
    t = hold.release_once_closed(w)
    w.close(drop=True)
    t.join()
    assert read(p) == "2"                          # the write under way ended; "3" was dropped
    with pytest.raises(RuntimeError, match="without writing"):
        w.wait(p, seq)


def test_a_snapshot_handed_to_the_writer_is_written_byte_for_byte_as_persist_writes_it(tmp_path, monkeypatch):
    """ConsumerOffsetManager.encode builds new containers (encode_is_snapshot): persist_soon hands
    the dict over and the writer's thread does the JSON; the file is the one persist() writes, and
    a commit after the hand-off does not leak into it."""
    from rmq.store.config_manager import DataVersion
    assert ConsumerOffsetManager.encode_is_snapshot
    w = ConfigWriter()
    direct, handed = ConsumerOffsetManager(str(tmp_path / "a")), ConsumerOffsetManager(str(tmp_path / "b"))
    handed.writer = w
    for m in (direct, handed):
        for g in range(50):
            m.commit_offset(f"g{g}", "T", g % 4, g * 10)
    handed.data_version = DataVersion(direct.data_version.timestamp, direct.data_version.counter)
    direct.persist()
    hold = HeldWrite(monkeypatch)
    handed.persist_soon()
    hold.wait_started()                            # the dict is in the writer's hands, unwritten
    handed.commit_offset("late", "T", 0, 1)
    hold.release()
    w.flush()
    assert read(handed.path) == read(direct.path)
    w.close()
