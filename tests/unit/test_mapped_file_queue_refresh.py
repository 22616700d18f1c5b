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
