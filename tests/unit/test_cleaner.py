"""Expiry and disk protection (SPEC.md §8) on a real store with tiny files."""
import os
import time

from rmq.status import GetMessageStatus, PutMessageStatus
from rmq.store.cleaner import StoreCleaner, is_time_to_delete, space_decision


def fill(s, n=300):
    for i in range(n):
        assert s.put_message("TopicC", b"c" * 200, i % 2, keys=[f"k{i}"]).ok
    s.dispatch()


def quiet(s):
    """Wait for the CommitLog's pre-allocation thread: it renames NAME.tmp -> NAME under our feet."""
    assert s.commitlog.mapped_file_queue.allocator.wait_idle(60)


def age_files(path, hours):
    t = time.time() - hours * 3600
    for name in os.listdir(path):
        os.utime(os.path.join(path, name), (t, t))


def test_time_and_space_rules():
    now = time.mktime((2026, 1, 1, 4, 30, 0, 0, 0, -1))
    assert is_time_to_delete("04", now) and is_time_to_delete("03;04", now)
    assert not is_time_to_delete("05;16", now)
    assert space_decision(0.5, 75).space_to_delete is False
    assert space_decision(0.8, 75).space_to_delete and not space_decision(0.8, 75).clean_immediately
    assert space_decision(0.86, 75).clean_immediately and not space_decision(0.86, 75).disk_full
    assert space_decision(0.91, 75).disk_full
    assert space_decision(-1, 75).space_to_delete


def test_expired_files_deleted_and_reads_below_min_offset_move(open_store):
    s = open_store(delete_when="99", file_reserved_time=1)      # never time-up: only age + space
    fill(s)
    files = [os.path.basename(mf.file_name) for mf in s.commitlog.mapped_file_queue.files]
    assert len(files) > 4
    cleaner = StoreCleaner(s, usage=lambda p: 0.80)              # above 75%: space to delete
    age_files(s.commitlog_dir, 2)                                # older than fileReservedTime (1 h)
    os.utime(os.path.join(s.commitlog_dir, files[-1]))
    deleted_cl, deleted_cq, _ = cleaner.run()
    assert deleted_cl == len(files) - 1                          # all but the last file
    assert [os.path.basename(mf.file_name) for mf in s.commitlog.mapped_file_queue.files] == files[-1:]
    assert not set(files[:-1]) & set(os.listdir(s.commitlog_dir))
    assert s.commitlog.get_min_offset() == int(files[-1])
    assert deleted_cq >= 1
    res = s.get_messages("g", "TopicC", 0, 0, 8)
    assert res.status is GetMessageStatus.OFFSET_TOO_SMALL
    assert res.next_begin_offset == s.get_min_offset_in_queue("TopicC", 0) > 0
    got = s.get_messages("g", "TopicC", 0, res.next_begin_offset, 8)
    assert got.status is GetMessageStatus.FOUND


def test_young_files_kept_unless_disk_nearly_full(open_store):
    s = open_store(delete_when="99", file_reserved_time=72)
    fill(s)
    n = len(os.listdir(s.commitlog_dir))
    assert StoreCleaner(s, usage=lambda p: 0.80).run()[0] == 0            # young, not forced
    assert len(os.listdir(s.commitlog_dir)) == n
    deleted = StoreCleaner(s, usage=lambda p: 0.87).run()[0]            # > 85%: clean forcibly
    assert 0 < deleted <= 10


def test_disk_full_refuses_writes_until_space_returns(open_store):
    s = open_store()
    level = {"v": 0.95}
    c = StoreCleaner(s, usage=lambda p: level["v"])
    c.check_space()
    r = s.put_message("TopicC", b"x", 0)
    assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and "DISK_FULL" in r.remark
    level["v"] = 0.5
    c.check_space()
    assert s.put_message("TopicC", b"x", 0).ok


def test_undispatched_files_are_never_deleted(open_store):
    s = open_store(delete_when="99", file_reserved_time=0)
    for i in range(300):
        assert s.put_message("TopicC", b"c" * 200, 0).ok
    quiet(s)
    n = len(os.listdir(s.commitlog_dir))
    age_files(s.commitlog_dir, 5)
    assert StoreCleaner(s, usage=lambda p: 0.80).run()[0] == 0      # nothing dispatched yet
    assert len(os.listdir(s.commitlog_dir)) == n
    s.dispatch()
    assert StoreCleaner(s, usage=lambda p: 0.80).run()[0] > 0


def test_manual_delete(open_store):
    s = open_store(delete_when="99", file_reserved_time=72)
    fill(s)
    c = StoreCleaner(s, usage=lambda p: 0.1)
    assert c.run()[0] == 0
    c.request_manual_delete()
    assert c.run()[0] > 0
