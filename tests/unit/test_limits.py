"""Every limit is a named constant with a test; bad input changes nothing (SPEC.md §1.9)."""
import os
import resource
import signal

import pytest

from rmq._core import commitlog as cl
from rmq._core.layout import MAX_MESSAGE_SIZE_DEFAULT, PROPERTIES_MAX_LENGTH, TOPIC_MAX_LENGTH, TOPIC_MAX_LENGTH_SYSTEM
from rmq.errors import StoreDiskFullError
from rmq.status import PutMessageStatus
from rmq.store.config import MessageStoreConfig
from rmq.store.validators import GROUP_MAX_LENGTH, MAX_QUEUE_NUMS, check_group


def unchanged(store, before):
    return store.commitlog.get_max_offset() == before


@pytest.mark.parametrize("topic,ok", [
    ("a" * TOPIC_MAX_LENGTH, True),
    ("a" * (TOPIC_MAX_LENGTH + 1), False),
    ("%RETRY%" + "g" * (TOPIC_MAX_LENGTH_SYSTEM - 7), True),
    ("%RETRY%" + "g" * (TOPIC_MAX_LENGTH_SYSTEM - 6), False),
    ("", False),
    ("bad topic", False),
    ("../etc", False),
    ("a/b", False),
    ("tópico", False),
    ("ok_topic-1|%", True),
])
def test_topic_rules(open_store, topic, ok):
    s = open_store()
    before = s.commitlog.get_max_offset()
    r = s.put_message(topic, b"x", 0)
    assert (r.status is PutMessageStatus.PUT_OK) == ok, r.remark
    if not ok:
        assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and r.remark and unchanged(s, before)


def test_topic_must_be_str(open_store):
    s = open_store()
    assert s.put_message(b"bytes-topic", b"x", 0).status is PutMessageStatus.MESSAGE_ILLEGAL


@pytest.mark.parametrize("queue_id,ok", [(0, True), (MAX_QUEUE_NUMS - 1, True), (MAX_QUEUE_NUMS, False),
                                         (-1, False), ("1", False), (True, False)])
def test_queue_id_range(open_store, queue_id, ok):
    s = open_store()
    before = s.commitlog.get_max_offset()
    r = s.put_message("T", b"x", queue_id)
    assert (r.status is PutMessageStatus.PUT_OK) == ok
    if not ok:
        assert "queue id" in r.remark and unchanged(s, before)


def test_max_message_size_default_and_configured(open_store):
    assert MessageStoreConfig().max_message_size == MAX_MESSAGE_SIZE_DEFAULT
    s = open_store(max_message_size=1000, mapped_file_size_commit_log=64 * 1024)
    before = s.commitlog.get_max_offset()
    assert s.put_message("T", b"x" * 1000, 0).status is PutMessageStatus.PUT_OK
    before = s.commitlog.get_max_offset()
    r = s.put_message("T", b"x" * 1001, 0)
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and "maxMessageSize" in r.remark
    assert unchanged(s, before)


def test_default_max_message_size_is_accepted_and_exceeded(open_store):
    s = open_store(mapped_file_size_commit_log=8 * 1024 * 1024)
    assert s.put_message("T", b"x" * MAX_MESSAGE_SIZE_DEFAULT, 0).ok
    before = s.commitlog.get_max_offset()
    r = s.put_message("T", b"x" * (MAX_MESSAGE_SIZE_DEFAULT + 1), 0)
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and unchanged(s, before)


def test_properties_length_limit(open_store):
    s = open_store(mapped_file_size_commit_log=256 * 1024)
    # stored properties = user properties + the 20-byte __CRC32# property
    room = PROPERTIES_MAX_LENGTH - 20 - len("k\x01\x02")
    assert s.put_message("T", b"x", 0, properties={"k": "v" * room}).ok
    before = s.commitlog.get_max_offset()
    r = s.put_message("T", b"x", 0, properties={"k": "v" * (room + 1)})
    assert r.status is PutMessageStatus.PROPERTIES_SIZE_EXCEEDED and unchanged(s, before)
    r = s.put_message("T", b"x", 0, properties={"k": "v" * (PROPERTIES_MAX_LENGTH + 5)})
    assert r.status is PutMessageStatus.PROPERTIES_SIZE_EXCEEDED and unchanged(s, before)


def test_property_separators_refused(open_store):
    s = open_store()
    before = s.commitlog.get_max_offset()
    r = s.put_message("T", b"x", 0, properties={"a": "b\x01c"})
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and unchanged(s, before)


def test_body_must_be_bytes(open_store):
    s = open_store()
    r = s.put_message("T", "text", 0)
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL


def test_malformed_batch_changes_nothing(open_store):
    s = open_store()
    good = cl.encode_batch([(b"a", b"", 0), (b"b", b"", 0)])
    before = s.commitlog.get_max_offset()
    r = s.put_messages("T", 0, good[:-3])           # second element truncated
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and unchanged(s, before)
    assert s.topic_queue_table.get(("T", 0), 0) == 0


def test_batch_too_large_to_store_whole_says_the_largest_body_taken(open_store):
    """Over maxMessageSize, or more than one CommitLog file would take: MESSAGE_ILLEGAL, nothing
    written, and ``max_body`` (bytes) says how large a batch may be (what the broker answers a
    producer, which splits the batch to it); a batch of that body size is then stored."""
    s = open_store(mapped_file_size_commit_log=64 * 1024, max_message_size=100 * 1024)
    msgs = [(b"m" * 100, b"", 0)] * 700                  # ~84 KB of body, ~150 KB in the CommitLog
    batch = cl.encode_batch(msgs)
    before = s.commitlog.get_max_offset()
    r = s.put_messages("T", 0, batch)
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and "mappedFileSizeCommitLog" in r.remark
    assert 0 < r.max_body < 32 * 1024 and unchanged(s, before)
    per = len(cl.encode_batch(msgs[:1]))
    fits = cl.encode_batch(msgs[:r.max_body // per])
    assert s.put_messages("T", 0, fits).ok
    big = cl.encode_batch([(b"m" * 100, b"", 0)] * 1000)   # ~120 KB: over maxMessageSize first
    r = s.put_messages("T", 0, big)
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and r.max_body == 100 * 1024
    assert s.put_message("T", b"ok", 0).ok              # a refusal changes nothing after it
    before = s.commitlog.get_max_offset()
    r = s.put_message("T", os.urandom(70 * 1024), 0)    # one message larger than a file: no retry helps
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and "mappedFileSizeCommitLog" in r.remark
    assert unchanged(s, before)


def test_group_name_rules():
    assert check_group("g" * GROUP_MAX_LENGTH)
    for bad in ("", "g" * (GROUP_MAX_LENGTH + 1), "a b", "../x"):
        with pytest.raises(ValueError):
            check_group(bad)


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="flushDiskType"):
        MessageStoreConfig(flush_disk_type="SOMETIMES")
    with pytest.raises(ValueError, match="brokerRole"):
        MessageStoreConfig(broker_role="BOSS")
    with pytest.raises(ValueError, match="mappedFileSizeCommitLog"):
        MessageStoreConfig(mapped_file_size_commit_log=100)
    with pytest.raises(ValueError, match="fileReservedTime"):
        MessageStoreConfig.from_properties({"fileReservedTime": "soon"})
    assert MessageStoreConfig(mapped_file_size_consume_queue=30).mapped_file_size_consume_queue == 40


class FileSizeLimit:
    """RLIMIT_FSIZE makes file allocation fail as a full disk does (EFBIG), without root."""

    def __init__(self, limit):
        self.limit = limit

    def __enter__(self):
        self.old = resource.getrlimit(resource.RLIMIT_FSIZE)
        self.old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.limit, self.old[1]))

    def __exit__(self, *exc):
        resource.setrlimit(resource.RLIMIT_FSIZE, self.old)
        signal.signal(signal.SIGXFSZ, self.old_handler)


def test_disk_full_while_creating_a_file(open_store):
    s = open_store(mapped_file_size_commit_log=64 * 1024)
    assert s.put_message("T", b"first", 0).ok
    s.dispatch()
    with FileSizeLimit(1024):
        # the allocator may have pre-allocated the next file: writes go on until a
        # new file is needed, then fail cleanly
        allocator = s.commitlog.mapped_file_queue.allocator
        for _ in range(100):
            # the pre-allocation thread may be renaming NAME.tmp -> NAME right now: list when it is idle
            assert allocator.wait_idle(60)
            files_before = sorted(os.listdir(s.commitlog_dir))
            n_before = s.topic_queue_table[("T", 0)]
            r = s.put_message("T", b"w" * 9000, 0)
            if not r.ok:
                break
        assert r.status is PutMessageStatus.CREATE_MAPPED_FILE_FAILED
        assert "no space" in r.remark
        # nothing half-created, no queue offset consumed, everything still readable
        assert allocator.wait_idle(60)
        assert sorted(os.listdir(s.commitlog_dir)) == files_before
        assert s.topic_queue_table[("T", 0)] == n_before
        assert s.get_messages("g", "T", 0, 0, 1).messages()[0].body == b"first"
    # space is back: the same put now succeeds, without a restart
    r = s.put_message("T", b"w" * 9000, 0)
    assert r.ok and r.queue_offset == n_before
    s.dispatch()
    msgs = []
    off = 0
    while off < n_before + 1:
        res = s.get_messages("g", "T", 0, off, 32)
        msgs += res.messages()
        off = res.next_begin_offset
    assert [m.queue_offset for m in msgs] == list(range(n_before + 1))


def test_mapped_file_disk_full_error_is_typed(tmp_path):
    from rmq._core.mapped_file import MappedFile
    with FileSizeLimit(4096):
        with pytest.raises(StoreDiskFullError):
            MappedFile(str(tmp_path / "00000000000000000000"), 1024 * 1024)
    assert not os.path.exists(tmp_path / "00000000000000000000")
