"""MappedFileQueue.refresh, the reader side of a queue another process writes: it maps the files
the writer created and forgets head files another process deleted, looking for those at most
every HEAD_CHECK_INTERVAL_S (one stat per refresh was 2-5 % of the broker's profile under POP)."""
import os

from rmq.store import mapped_file_queue as M

SIZE = 4096


def writer_with_files(path, n):
    w = M.MappedFileQueue(str(path), SIZE)
    for _ in range(n):
        mf = w.get_last_mapped_file(0, need_create=True)
        mf.wrote_position = SIZE                # full: the next call creates the next file
    return w


def test_refresh_maps_new_files_and_drops_deleted_heads_at_most_every_interval(tmp_path, monkeypatch):
    w = writer_with_files(tmp_path, 3)
    r = M.MappedFileQueue(str(tmp_path), SIZE)
    clock = [1000.0]
    monkeypatch.setattr(M.time, "monotonic", lambda: clock[0])
    r.refresh(3 * SIZE)
    assert [mf.file_from_offset for mf in r.files] == [0, SIZE, 2 * SIZE]
    os.unlink(w.files[0].file_name)             # the cleaner (another process) deletes the head
    r.refresh(3 * SIZE)                         # first look: dropped at once
    assert [mf.file_from_offset for mf in r.files] == [SIZE, 2 * SIZE]
    w.files[1].write_at(0, b"still here")
    os.unlink(w.files[1].file_name)
    clock[0] += M.HEAD_CHECK_INTERVAL_S / 2
    r.refresh(3 * SIZE)                         # within the interval: not looked for yet
    assert [mf.file_from_offset for mf in r.files] == [SIZE, 2 * SIZE]
    assert bytes(r.files[0].read(0, 10)) == b"still here"   # its mapping still reads (an unlinked file lives)
    clock[0] += M.HEAD_CHECK_INTERVAL_S
    r.refresh(3 * SIZE)
    assert [mf.file_from_offset for mf in r.files] == [2 * SIZE]
    r.refresh(3 * SIZE)                         # the last file is never dropped
    assert len(r.files) == 1
    for q in (r, w):
        q.shutdown()


def test_load_leaves_a_file_being_created_to_its_writer(tmp_path):
    """NAME.tmp is a file its writer is creating (allocated, then renamed): a reader's load maps
    only the real files and leaves it; the writer's own load at its start deletes it as a creation
    a crash cut short."""
    w = writer_with_files(tmp_path, 2)
    tmp = os.path.join(str(tmp_path), M.offset_to_file_name(2 * SIZE) + M.TMP_SUFFIX)
    with open(tmp, "wb") as f:
        f.write(b"\0" * SIZE)
    r = M.MappedFileQueue(str(tmp_path), SIZE)
    r.load(drop_tmp=False)
    assert [mf.file_from_offset for mf in r.files] == [0, SIZE] and os.path.exists(tmp)
    os.rename(tmp, tmp[:-len(M.TMP_SUFFIX)])        # the writer's rename still finds it
    os.rename(tmp[:-len(M.TMP_SUFFIX)], tmp)
    r2 = M.MappedFileQueue(str(tmp_path), SIZE)
    r2.load()                                       # the writer at its start: dropped
    assert [mf.file_from_offset for mf in r2.files] == [0, SIZE] and not os.path.exists(tmp)
    for q in (r, r2, w):
        q.shutdown()


def test_a_consume_queue_first_seen_while_running_keeps_reputs_file_in_creation(open_store):
    """The broker maps a ConsumeQueue reput writes the first time a request or an announcement
    names it; if reput is creating one of its files right then (NAME.tmp), the broker must not
    delete it (reput's rename failed and reput died in a CI run)."""
    s = open_store()
    qdir = os.path.join(s.consume_queue_dir, "Fresh", "3")
    os.makedirs(qdir)
    size = s.config.mapped_file_size_consume_queue
    tmp = os.path.join(qdir, M.offset_to_file_name(0) + M.TMP_SUFFIX)
    with open(tmp, "wb") as f:
        f.write(b"\0" * size)
    cq = s.find_consume_queue("Fresh", 3)
    assert os.path.exists(tmp) and not cq.mapped_file_queue.files
    os.rename(tmp, tmp[:-len(M.TMP_SUFFIX)])        # reput's creation completes


def test_a_store_restarted_alone_keeps_reputs_file_in_creation(open_store, store_dir):
    """The broker restarted by the supervisor while reput runs: its recovery loads every
    ConsumeQueue directory and must leave a NAME.tmp reput is creating; the store's own dispatch
    still creates that file later (over the stale .tmp) when it needs it."""
    s = open_store()
    assert s.put_message("T", b"first", 0).ok
    s.dispatch()
    qdir = os.path.join(s.consume_queue_dir, "T", "0")
    size = s.config.mapped_file_size_consume_queue
    s.shutdown()
    tmp = os.path.join(qdir, M.offset_to_file_name(size) + M.TMP_SUFFIX)
    with open(tmp, "wb") as f:
        f.write(b"\0" * 16)
    s2 = open_store()
    assert os.path.exists(tmp)
    assert s2.get_messages("g", "T", 0, 0, 1).messages()[0].body == b"first"
    mfq = s2.find_consume_queue("T", 0).mapped_file_queue
    mfq.files[-1].wrote_position = size          # as if full: the writer creates the next file
    mfq.get_last_mapped_file(0, need_create=True)
    assert os.path.exists(tmp[:-len(M.TMP_SUFFIX)]) and not os.path.exists(tmp)
