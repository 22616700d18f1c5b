"""Crash recovery: torn tails, bit flips, lost ConsumeQueues, a lost abort file (SPEC.md §5).

Each case checks that every whole record is readable (ConsumeQueue, IndexFile,
look-up by offset) and nothing else is, and that the store keeps working
(the next put takes the next queue offset).
"""
import os
import shutil

import pytest

from rmq.status import GetMessageStatus
from rmq.store.message_store import MessageStore
from tests.conftest import SMALL, crash

pytestmark = pytest.mark.fault
N = 23          # messages written before the fault; the last one is the victim


def fill(path, n=N, clean=False):
    s = MessageStore(path, **SMALL)
    offs = []
    for i in range(n):
        r = s.put_message("TopicR", b"body-%03d" % i + b"." * (i * 7 % 50), i % 2, tags="T",
                          keys=[f"key{i}"])
        assert r.ok
        offs.append((r.wrote_offset, r.append.wrote_bytes))
    s.dispatch()
    if clean:
        s.shutdown()
    else:
        s.flush()      # data in the page cache and on disk; the process then "dies"
        crash(s)
    return offs


def commitlog_file(path, phys):
    size = SMALL["mapped_file_size_commit_log"]
    return os.path.join(path, "commitlog", f"{phys - phys % size:020d}"), phys % size


def not_durable_from(path, phys):
    """Model "the damage lies above the last durable flush point": lower the checkpoint's
    flushed offset to ``phys``.  Damage below it is corruption, refused at start
    (tests/fault/test_corruption.py)."""
    from rmq.store.checkpoint import StoreCheckpoint
    cp = StoreCheckpoint(os.path.join(path, "checkpoint"))
    cp.master_flushed_offset = min(cp.master_flushed_offset, phys)
    cp.shutdown()


def check_store(path, whole):
    """Open ``path``; exactly the first ``whole`` messages must be readable; then put one more."""
    s = MessageStore(path, **SMALL)
    try:
        got = []
        for q in (0, 1):
            off = 0
            while True:
                res = s.get_messages("g", "TopicR", q, off, 32)
                if res.status is not GetMessageStatus.FOUND:
                    break
                got.extend(res.messages())
                off = res.next_begin_offset
            assert s.get_max_offset_in_queue("TopicR", q) == len([i for i in range(whole) if i % 2 == q])
        assert sorted(int(m.body[5:8]) for m in got) == list(range(whole))
        for i in (0, whole - 1, whole):
            hits = s.query_message("TopicR", f"key{i}").messages()
            assert [int(m.body[5:8]) for m in hits] == ([i] if 0 <= i < whole else [])
        r = s.put_message("TopicR", b"after", whole % 2)
        assert r.ok and r.queue_offset == len([i for i in range(whole) if i % 2 == whole % 2])
        s.dispatch()
        assert s.get_messages("g", "TopicR", whole % 2, r.queue_offset, 1).messages()[0].body == b"after"
    finally:
        s.shutdown()


@pytest.mark.parametrize("clean", [False, True], ids=["crash", "clean-shutdown"])
def test_cut_at_every_byte_of_last_record(tmp_path, clean):
    base = str(tmp_path / "base")
    offs = fill(base, clean=clean)
    last_phys, last_size = offs[-1]
    path, pos = commitlog_file(base, last_phys)
    for cut in range(last_size + 1):
        work = str(tmp_path / "w")
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(base, work)
        wpath, _ = commitlog_file(work, last_phys)
        not_durable_from(work, last_phys)
        with open(wpath, "r+b") as f:
            f.seek(pos + cut)
            f.write(b"\0" * (last_size - cut))
        check_store(work, N if cut == last_size else N - 1)


@pytest.mark.parametrize("clean", [False, True], ids=["crash", "clean-shutdown"])
def test_bit_flip_in_last_record_drops_only_it(tmp_path, clean):
    base = str(tmp_path / "base")
    offs = fill(base, clean=clean)
    last_phys, last_size = offs[-1]
    _, pos = commitlog_file(base, last_phys)
    for byte in range(0, last_size, 5):
        for bit in (0, 7):
            work = str(tmp_path / "w")
            shutil.rmtree(work, ignore_errors=True)
            shutil.copytree(base, work)
            wpath, _ = commitlog_file(work, last_phys)
            not_durable_from(work, last_phys)
            with open(wpath, "r+b") as f:
                f.seek(pos + byte)
                b = f.read(1)[0]
                f.seek(pos + byte)
                f.write(bytes([b ^ (1 << bit)]))
            check_store(work, N - 1)


def test_garbage_tail_after_last_record_is_ignored(tmp_path):
    base = str(tmp_path / "base")
    offs = fill(base)
    end = offs[-1][0] + offs[-1][1]
    path, pos = commitlog_file(base, end)
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(os.urandom(64))
    check_store(base, N)


@pytest.mark.parametrize("clean", [False, True], ids=["crash", "clean-shutdown"])
def test_deleted_consume_queue_directory_is_rebuilt(tmp_path, clean):
    base = str(tmp_path / "base")
    fill(base, clean=clean)
    shutil.rmtree(os.path.join(base, "consumequeue"))
    check_store(base, N)


def test_deleted_index_directory_keeps_queues(tmp_path):
    base = str(tmp_path / "base")
    fill(base)
    shutil.rmtree(os.path.join(base, "index"))
    s = MessageStore(base, **SMALL)
    try:
        assert s.get_max_offset_in_queue("TopicR", 0) + s.get_max_offset_in_queue("TopicR", 1) == N
    finally:
        s.shutdown()


def test_deleted_abort_file_after_crash_with_torn_tail(tmp_path):
    base = str(tmp_path / "base")
    offs = fill(base)
    os.unlink(os.path.join(base, "abort"))          # normal recovery path on a crashed store
    last_phys, last_size = offs[-1]
    path, pos = commitlog_file(base, last_phys)
    not_durable_from(base, last_phys)
    with open(path, "r+b") as f:
        f.seek(pos + last_size // 2)
        f.write(b"\0" * (last_size - last_size // 2))
    check_store(base, N - 1)


def test_consume_queue_ahead_of_commitlog_is_truncated(tmp_path):
    """A CQ entry whose record never reached the CommitLog (page cache lost) must go."""
    base = str(tmp_path / "base")
    offs = fill(base)
    # drop the last two records entirely (as if their pages never reached disk)
    first_lost = offs[-2][0]
    path, pos = commitlog_file(base, first_lost)
    not_durable_from(base, first_lost)
    size = SMALL["mapped_file_size_commit_log"]
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(b"\0" * (size - pos))
    for name in os.listdir(os.path.join(base, "commitlog")):
        if int(name) > first_lost:
            os.unlink(os.path.join(base, "commitlog", name))
    check_store(base, N - 2)


def test_abort_file_marks_running_store(tmp_path):
    base = str(tmp_path / "base")
    s = MessageStore(base, **SMALL)
    assert os.path.exists(os.path.join(base, "abort"))
    s.shutdown()
    assert not os.path.exists(os.path.join(base, "abort"))
    s = MessageStore(base, **SMALL)
    assert s.last_exit_ok
    crash(s)
    s = MessageStore(base, **SMALL)
    assert not s.last_exit_ok
    s.shutdown()


def test_file_creation_cut_by_a_crash_leaves_no_short_file(tmp_path):
    """New files are allocated as FILE.tmp and renamed; a leftover .tmp is dropped on load."""
    base = str(tmp_path / "base")
    fill(base)
    size = SMALL["mapped_file_size_commit_log"]
    names = sorted(os.listdir(os.path.join(base, "commitlog")))
    nxt = int(names[-1]) + size
    with open(os.path.join(base, "commitlog", f"{nxt:020d}.tmp"), "wb") as f:
        f.write(b"\0" * 100)                     # short: fallocate never finished
    with open(os.path.join(base, "index", "20990101000000000.tmp"), "wb"):
        pass
    check_store(base, N)
    assert not [n for n in os.listdir(os.path.join(base, "commitlog")) if n.endswith(".tmp")]
    assert not [n for n in os.listdir(os.path.join(base, "index")) if n.endswith(".tmp")]
