# cython: language_level=3, embedsignature=True, cdivision=True
"""IndexFile: RocketMQ's message-key hash index, byte for byte (SPEC.md §3).

A file is ``[header 40][slot table: hash_slot_num x 4][entries: index_num x 20]``
(all big-endian).  A key ``topic + "#" + key`` hashes to
``abs(String.hashCode())`` (0 for ``Integer.MIN_VALUE``); its slot holds the
number of the newest entry with that slot, and each entry links to the
previous one in the same slot.  Entry 0 is never used, so ``index_count``
starts at 1 and the file is full once ``index_count >= index_num``.

Files written here can be read by RocketMQ and the other way round.
"""
import os

from libc.stdint cimport INT32_MAX, int32_t, int64_t

from rmq._core.hton cimport load_be32, load_be64, store_be32, store_be64
from rmq._core.jhash cimport index_key_hash
from rmq._core.layout cimport (
    INDEX_BEGIN_PHY_OFFSET_OFFSET,
    INDEX_BEGIN_TIMESTAMP_OFFSET,
    INDEX_END_PHY_OFFSET_OFFSET,
    INDEX_END_TIMESTAMP_OFFSET,
    INDEX_ENTRY_KEY_HASH_OFFSET,
    INDEX_ENTRY_PHY_OFFSET_OFFSET,
    INDEX_ENTRY_PREV_INDEX_OFFSET,
    INDEX_ENTRY_SIZE,
    INDEX_ENTRY_TIME_DIFF_OFFSET,
    INDEX_HASH_SLOT_COUNT_OFFSET,
    INDEX_HASH_SLOT_SIZE,
    INDEX_HEADER_SIZE,
    INDEX_INDEX_COUNT_OFFSET,
    INDEX_MAX_HASH_SLOT_NUM_DEFAULT,
    INDEX_MAX_INDEX_NUM_DEFAULT,
)
from rmq._core.mapped_file cimport MappedFile

from rmq.errors import StoreClosedError, StoreError

# RocketMQ's IndexFile.invalidIndex: slot / prevIndex value meaning "no entry".
cdef enum:
    INVALID_INDEX = 0
# timeDiff is stored in seconds: store times are ms (SPEC.md §0.1).
cdef enum:
    MS_PER_SECOND = 1000


cdef inline bytes _utf8(object s):
    """UTF-8 bytes of ``s`` (str or bytes-like).

    Lone surrogates become ``?``, as Java's ``String.getBytes(UTF_8)`` does, so a
    key that went through a RocketMQ client hashes the same here.
    """
    if isinstance(s, str):
        return (<str>s).encode("utf-8", "replace")
    if isinstance(s, bytes):
        return <bytes>s
    return bytes(memoryview(s))    # TypeError for anything not bytes-like


def index_key_hash_py(topic, key):
    """IndexFile key hash of ``topic + "#" + key`` (SPEC.md §3.2).

    Parameters
    ----------
    topic, key : str or bytes
        ``bytes`` are taken as UTF-8.

    Returns
    -------
    int
        ``abs(("topic#key").hashCode())`` in Java, 0 when the hashCode is
        ``Integer.MIN_VALUE``; always in ``[0, 2**31 - 1]``.
    """
    cdef bytes t = _utf8(topic)
    cdef bytes k = _utf8(key)
    return index_key_hash(<const unsigned char*><char*>t, len(t),
                          <const unsigned char*><char*>k, len(k))


def index_file_size(int64_t hash_slot_num, int64_t index_num):
    """File size in bytes for the given geometry: ``40 + slots*4 + entries*20``."""
    return INDEX_HEADER_SIZE + hash_slot_num * INDEX_HASH_SLOT_SIZE + index_num * INDEX_ENTRY_SIZE


cdef class IndexFile:
    """One IndexFile (RocketMQ ``IndexFile`` + ``IndexHeader``).

    Parameters
    ----------
    file_name : str
        Path of the file; IndexService names it ``yyyyMMddHHmmssSSS``
        (SPEC.md §0.4).  An existing file is mapped and its header loaded; a new
        one is created and fully allocated.
    hash_slot_num : int
        Slots (default 5,000,000).  Must match the file's geometry.
    index_num : int
        Entry capacity including the unused entry 0 (default 20,000,000).
    end_phy_offset : int
        When > 0, the begin and end phy offsets of the header start at this
        value (the previous file's end, SPEC.md §3.4).
    end_timestamp : int
        When > 0 (ms), the begin and end timestamps start at this value.

    Raises
    ------
    ValueError
        A geometry value is out of range.
    StoreError
        The file cannot be created or mapped, or its size does not match the
        geometry (``StoreDiskFullError`` when the disk is full).

    Concurrency: one writer thread (``put_hash``/``put_key``); readers may call
    ``select_phy_offsets`` concurrently and, as in RocketMQ, see either the old
    or the new chain head.  Durability: entries are in the page cache once
    written; durable after ``flush()``.
    """

    def __cinit__(self, file_name, int64_t hash_slot_num=INDEX_MAX_HASH_SLOT_NUM_DEFAULT,
                  int64_t index_num=INDEX_MAX_INDEX_NUM_DEFAULT,
                  int64_t end_phy_offset=0, int64_t end_timestamp=0):
        if hash_slot_num <= 0 or hash_slot_num > INT32_MAX:
            raise ValueError(f"hash_slot_num must be in [1, {INT32_MAX}], got {hash_slot_num}")
        if index_num <= 0 or index_num > INT32_MAX:
            raise ValueError(f"index_num must be in [1, {INT32_MAX}], got {index_num}")
        self.hash_slot_num = <int32_t>hash_slot_num
        self.index_num = <int32_t>index_num
        self.entries_pos = INDEX_HEADER_SIZE + hash_slot_num * INDEX_HASH_SLOT_SIZE
        self.begin_timestamp = 0
        self.end_timestamp = 0
        self.begin_phy_offset = 0
        self.end_phy_offset = 0
        self.hash_slot_count = 0
        self.index_count = 1
        file_name = os.fsdecode(os.fspath(file_name))
        cdef bint existed = os.path.exists(file_name)
        self.mapped_file = MappedFile(file_name, index_file_size(hash_slot_num, index_num), True)
        # The whole file is "written" from MappedFile's point of view: slots are
        # updated anywhere in it, so a flush always covers all of it.
        self.mapped_file.wrote_position = self.mapped_file.file_size
        if existed:
            self._read_header()
        if end_phy_offset > 0:
            self.begin_phy_offset = end_phy_offset
            self.end_phy_offset = end_phy_offset
        if end_timestamp > 0:
            self.begin_timestamp = end_timestamp
            self.end_timestamp = end_timestamp
        self._write_header(self.mapped_file.base)

    # -- header ------------------------------------------------------------------
    cdef unsigned char* _base(self) except NULL:
        cdef unsigned char* base = self.mapped_file.base
        if base == NULL:
            raise StoreClosedError(f"index file {self.mapped_file.file_name} is closed")
        return base

    cdef void _write_header(self, unsigned char* base) noexcept nogil:
        store_be64(base + INDEX_BEGIN_TIMESTAMP_OFFSET, self.begin_timestamp)
        store_be64(base + INDEX_END_TIMESTAMP_OFFSET, self.end_timestamp)
        store_be64(base + INDEX_BEGIN_PHY_OFFSET_OFFSET, self.begin_phy_offset)
        store_be64(base + INDEX_END_PHY_OFFSET_OFFSET, self.end_phy_offset)
        store_be32(base + INDEX_HASH_SLOT_COUNT_OFFSET, self.hash_slot_count)
        store_be32(base + INDEX_INDEX_COUNT_OFFSET, self.index_count)

    cdef int _read_header(self) except -1:
        cdef unsigned char* base = self._base()
        self.begin_timestamp = load_be64(base + INDEX_BEGIN_TIMESTAMP_OFFSET)
        self.end_timestamp = load_be64(base + INDEX_END_TIMESTAMP_OFFSET)
        self.begin_phy_offset = load_be64(base + INDEX_BEGIN_PHY_OFFSET_OFFSET)
        self.end_phy_offset = load_be64(base + INDEX_END_PHY_OFFSET_OFFSET)
        self.hash_slot_count = load_be32(base + INDEX_HASH_SLOT_COUNT_OFFSET)
        self.index_count = load_be32(base + INDEX_INDEX_COUNT_OFFSET)
        if self.index_count <= 0:      # never written (or torn): RocketMQ resets to 1
            self.index_count = 1
        return 0

    def load(self):
        """Re-read the header from the mapping (RocketMQ ``IndexHeader.load``).

        A stored ``indexCount <= 0`` is reset to 1.

        Raises
        ------
        StoreClosedError
            The file is closed.
        """
        self._read_header()

    # -- insert ------------------------------------------------------------------
    cdef int put_hash(self, int32_t key_hash, int64_t phy_offset,
                      int64_t store_timestamp) noexcept nogil:
        cdef unsigned char* base = self.mapped_file.base
        cdef int32_t index_count = self.index_count
        cdef int32_t slot_value
        cdef int64_t time_diff
        cdef unsigned char* slot
        cdef unsigned char* entry
        if base == NULL or key_hash < 0:
            return -1
        if index_count >= self.index_num:
            return 0
        slot = base + INDEX_HEADER_SIZE + <int64_t>(key_hash % self.hash_slot_num) * INDEX_HASH_SLOT_SIZE
        slot_value = load_be32(slot)
        if slot_value <= INVALID_INDEX or slot_value > index_count:
            slot_value = INVALID_INDEX
        # Relative to the header's begin time *before* this put: for the first
        # entry of a rolled file that is the previous file's end (RocketMQ does
        # the same; the header begin is reset just below).
        time_diff = (store_timestamp - self.begin_timestamp) // MS_PER_SECOND
        if self.begin_timestamp <= 0:
            time_diff = 0
        elif time_diff > INT32_MAX:
            time_diff = INT32_MAX
        elif time_diff < 0:
            time_diff = 0
        entry = base + self.entries_pos + <int64_t>index_count * INDEX_ENTRY_SIZE
        store_be32(entry + INDEX_ENTRY_KEY_HASH_OFFSET, key_hash)
        store_be64(entry + INDEX_ENTRY_PHY_OFFSET_OFFSET, phy_offset)
        store_be32(entry + INDEX_ENTRY_TIME_DIFF_OFFSET, <int32_t>time_diff)
        store_be32(entry + INDEX_ENTRY_PREV_INDEX_OFFSET, slot_value)
        store_be32(slot, index_count)
        if index_count <= 1:
            self.begin_phy_offset = phy_offset
            self.begin_timestamp = store_timestamp
        if slot_value == INVALID_INDEX:
            self.hash_slot_count += 1
        self.index_count = index_count + 1
        self.end_phy_offset = phy_offset
        self.end_timestamp = store_timestamp
        self._write_header(base)
        return 1

    def put_key(self, topic, key, int64_t phy_offset, int64_t store_timestamp):
        """Index ``topic + "#" + key`` for the message at ``phy_offset``.

        Parameters
        ----------
        topic, key : str or bytes
            ``bytes`` are taken as UTF-8.
        phy_offset : int
            CommitLog physical offset of the message (bytes).
        store_timestamp : int
            Store time of the message (ms since epoch).

        Returns
        -------
        bool
            True when stored, False when the file is full.

        Raises
        ------
        StoreClosedError
            The file is closed.
        """
        self._base()
        cdef int rc = self.put_hash(index_key_hash_py(topic, key), phy_offset, store_timestamp)
        return rc == 1

    def put_hashes(self, const int32_t[::1] key_hashes, const int64_t[::1] phy_offsets,
                   const int64_t[::1] store_timestamps):
        """Insert a batch of precomputed key hashes without the GIL.

        Parameters
        ----------
        key_hashes : int32 buffer, length n, values >= 0
        phy_offsets : int64 buffer, length n (bytes)
        store_timestamps : int64 buffer, length n (ms)

        Returns
        -------
        int
            How many were stored; fewer than n when the file became full.

        Raises
        ------
        ValueError
            The three buffers differ in length, or a hash is negative.
        StoreClosedError
            The file is closed.
        """
        cdef Py_ssize_t n = key_hashes.shape[0]
        cdef Py_ssize_t i
        cdef Py_ssize_t stored = 0
        cdef int rc = 1
        if phy_offsets.shape[0] != n or store_timestamps.shape[0] != n:
            raise ValueError(f"batch lengths differ: {n}, {phy_offsets.shape[0]}, "
                             f"{store_timestamps.shape[0]}")
        self._base()
        with nogil:
            for i in range(n):
                rc = self.put_hash(key_hashes[i], phy_offsets[i], store_timestamps[i])
                if rc != 1:
                    break
                stored += 1
        if rc == -1:
            if self.mapped_file.base == NULL:
                raise StoreClosedError(f"index file {self.mapped_file.file_name} is closed")
            raise ValueError(f"negative key hash {key_hashes[stored]} at batch position {stored}")
        return stored

    # -- query -------------------------------------------------------------------
    cdef int select_hash(self, int32_t key_hash, list out, int max_num,
                         int64_t begin, int64_t end) except -1:
        cdef unsigned char* base = self._base()
        cdef int32_t index_count = self.index_count
        cdef int32_t slot_value, next_index, prev_index, key_hash_read
        cdef int64_t phy_offset_read, time_diff, time_read
        cdef unsigned char* entry
        cdef int found = 0
        if key_hash < 0:
            return 0
        slot_value = load_be32(base + INDEX_HEADER_SIZE
                               + <int64_t>(key_hash % self.hash_slot_num) * INDEX_HASH_SLOT_SIZE)
        # ">= index_num" guards a corrupt header whose indexCount overshoots the
        # file: RocketMQ would throw out of bounds there; we stop the chain.
        if (slot_value <= INVALID_INDEX or slot_value > index_count or index_count <= 1
                or slot_value >= self.index_num):
            return 0
        next_index = slot_value
        while len(out) < max_num:
            entry = base + self.entries_pos + <int64_t>next_index * INDEX_ENTRY_SIZE
            key_hash_read = load_be32(entry + INDEX_ENTRY_KEY_HASH_OFFSET)
            phy_offset_read = load_be64(entry + INDEX_ENTRY_PHY_OFFSET_OFFSET)
            time_diff = load_be32(entry + INDEX_ENTRY_TIME_DIFF_OFFSET)
            prev_index = load_be32(entry + INDEX_ENTRY_PREV_INDEX_OFFSET)
            if time_diff < 0:
                break
            time_read = self.begin_timestamp + time_diff * MS_PER_SECOND
            if key_hash == key_hash_read and begin <= time_read <= end:
                out.append(phy_offset_read)
                found += 1
            if (prev_index <= INVALID_INDEX or prev_index > index_count
                    or prev_index == next_index or time_read < begin
                    or prev_index >= self.index_num):
                break
            next_index = prev_index
        return found

    def select_phy_offsets(self, topic, key, int max_num, int64_t begin, int64_t end,
                           list phy_offsets=None):
        """CommitLog offsets indexed under ``topic + "#" + key`` in ``[begin, end]``.

        Follows the slot chain newest to oldest (SPEC.md §3.5).  Only the hash
        and the time window are compared: keys whose hashes collide are all
        returned (the client re-checks the key).

        Parameters
        ----------
        topic, key : str or bytes
        max_num : int
            Stop once the result list holds this many offsets.
        begin, end : int
            Store-time window, ms, inclusive.  Entry times have second
            resolution: ``begin_timestamp + timeDiff * 1000``.
        phy_offsets : list, optional
            Append to this list (RocketMQ shares one list across files; its
            length counts towards ``max_num``).

        Returns
        -------
        list[int]
            ``phy_offsets`` (or a new list), newest entry first.

        Raises
        ------
        StoreClosedError
            The file is closed.
        """
        if phy_offsets is None:
            phy_offsets = []
        self.select_hash(index_key_hash_py(topic, key), phy_offsets, max_num, begin, end)
        return phy_offsets

    def select_phy_offsets_by_hash(self, int32_t key_hash, int max_num, int64_t begin,
                                   int64_t end, list phy_offsets=None):
        """Like ``select_phy_offsets`` for a precomputed key hash (>= 0)."""
        if phy_offsets is None:
            phy_offsets = []
        self.select_hash(key_hash, phy_offsets, max_num, begin, end)
        return phy_offsets

    def is_time_matched(self, int64_t begin, int64_t end):
        """True when ``[begin, end]`` (ms) intersects the file's time range."""
        cdef int64_t fb = self.begin_timestamp
        cdef int64_t fe = self.end_timestamp
        return ((begin < fb and end > fe)
                or (fb <= begin <= fe)
                or (fb <= end <= fe))

    def is_write_full(self):
        """True once ``index_count >= index_num`` (no entry left)."""
        return self.index_count >= self.index_num

    # -- lifecycle ---------------------------------------------------------------
    @property
    def file_name(self):
        """Path of the file, as given to the constructor."""
        return self.mapped_file.file_name

    @property
    def closed(self):
        """True once ``close()`` or ``destroy()`` ran."""
        return self.mapped_file.base == NULL

    def flush(self):
        """Write the header, then msync the whole file (GIL released).

        Raises
        ------
        StoreClosedError
            The file is closed.
        StoreError
            msync failed now or earlier (sticky ``mapped_file.write_error``).
        """
        cdef unsigned char* base = self._base()
        cdef MappedFile mf = self.mapped_file
        if mf.write_error:
            raise StoreError(f"{mf.file_name} had a failed flush; no more flushes until recovery")
        self._write_header(base)
        mf._flush_range(0, mf.file_size)
        mf.flushed_position = mf.file_size

    def close(self):
        """Unmap and close the file (no flush)."""
        self.mapped_file.close()

    def destroy(self):
        """Close and delete the file.  Returns True."""
        self.mapped_file.destroy()
        return True

    def __repr__(self):
        return (f"IndexFile({self.mapped_file.file_name!r}, slots={self.hash_slot_num}, "
                f"entries={self.index_num}, index_count={self.index_count}, "
                f"time=[{self.begin_timestamp}, {self.end_timestamp}], "
                f"phy=[{self.begin_phy_offset}, {self.end_phy_offset}])")
