# cython: language_level=3, embedsignature=True
"""MappedFile: one fixed-size, fully allocated, MAP_SHARED file (SPEC.md §1.1, §6.7).

The file is ``posix_fallocate``\\ d to its full size *before* it is mapped, so a
full disk is a clear :class:`rmq.errors.StoreDiskFullError` at creation and
never a SIGBUS on a later write into a hole.  ``flush()`` is the one place in
rmq that calls ``msync``; it moves ``flushed_position`` only after the call
returned 0, and a failure is sticky (``write_error``).

This module is also the one place that makes anything durable: ``fsync_file``
and ``fsync_dir`` are the only other sync calls of the store (JSON metadata,
marker files, directory entries), so a lint test can check that nothing else
syncs (tests/fault/test_sync_lint.py).

Test-only hooks, read once at import (production pays one branch per sync):

* ``RMQ_DURABILITY_TRACE``: ``1`` appends a line to ``STORE/.durable`` (the
  nearest ancestor directory holding the store ``lock`` file) after every sync
  that returned 0: ``R path start end`` (msync of ``[start, end)``), ``F path``
  (whole file fsync'd), ``C path`` (a file got its final name), ``D dir``
  (directory fsync'd).  Any other value is the journal's path itself.  The
  power-cut simulator (tests/fault/harness.py) reads it to know what a power
  cut cannot take away.
* ``RMQ_FAILPOINT=msync_eio:after=N[:path=SUBSTR]``: the first N msyncs of
  the process (of files whose path contains SUBSTR) succeed, the next one
  reports EIO as a failing disk would.
"""
import os

from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_FillInfo
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.errno cimport errno
from libc.stdint cimport int64_t
from libc.string cimport memcpy, memset

from rmq._core.layout cimport OS_PAGE_SIZE

from rmq.errors import StoreClosedError, StoreDiskFullError, StoreError


cdef extern from "<sys/mman.h>" nogil:
    void* mmap(void* addr, size_t length, int prot, int flags, int fd, long offset)
    int munmap(void* addr, size_t length)
    int msync(void* addr, size_t length, int flags)
    int madvise(void* addr, size_t length, int advice)
    int mlock(const void* addr, size_t length)
    int munlock(const void* addr, size_t length)
    int PROT_READ, PROT_WRITE, MAP_SHARED, MS_SYNC, MADV_WILLNEED
    void* MAP_FAILED

cdef extern from "<fcntl.h>" nogil:
    int open(const char* path, int flags, int mode)
    int posix_fallocate(int fd, long offset, long length)
    int O_RDWR, O_CREAT, O_CLOEXEC, O_TRUNC

TMP_SUFFIX = ".tmp"      # a file being created; never loaded

cdef extern from "<unistd.h>" nogil:
    int close(int fd)

cdef extern from "<sys/stat.h>" nogil:
    cdef struct stat:
        long st_size
    int fstat(int fd, stat* buf)

cdef extern from "<string.h>" nogil:
    char* strerror(int errnum)

cdef extern from "<errno.h>":
    int ENOSPC, EDQUOT, EFBIG, EIO

cdef extern from "<unistd.h>" nogil:
    int fsync(int fd)


# -- durability journal and fail point (test-only, see the module docstring) -----------------
cdef object _TRACE = os.environ.get("RMQ_DURABILITY_TRACE") or None
cdef dict _journal_fds = {}       # journal path -> fd (O_APPEND)
cdef dict _journal_for_dir = {}   # directory -> journal path or None


def _parse_failpoint(str spec):
    after, sub = -1, ""
    for item in (spec or "").split(","):
        parts = item.strip().split(":")
        if parts[0] != "msync_eio":
            continue
        for kv in parts[1:]:
            k, _, v = kv.partition("=")
            if k == "after":
                after = int(v)
            elif k == "path":
                sub = v
    return after, sub


_fp_after, _fp_path = _parse_failpoint(os.environ.get("RMQ_FAILPOINT", ""))
cdef long long _FP_AFTER = _fp_after      # -1: no fail point
cdef str _FP_PATH = _fp_path
cdef long long _fp_count = 0
cdef bint _fp_fired = False


cdef bint _failpoint_hit(str path):
    """True when this msync must report EIO (RMQ_FAILPOINT)."""
    global _fp_count, _fp_fired
    if _FP_AFTER < 0 or _fp_fired or (_FP_PATH and _FP_PATH not in path):
        return False
    _fp_count += 1
    if _fp_count > _FP_AFTER:
        _fp_fired = True
        return True
    return False


def _journal_path(str path):
    """The journal of the store holding ``path`` (None: not traced)."""
    if _TRACE is None:
        return None
    if _TRACE != "1":
        return _TRACE
    d = os.path.dirname(os.path.abspath(path))
    if d in _journal_for_dir:
        return _journal_for_dir[d]
    found = None
    cur = d
    for _ in range(6):
        if os.path.isfile(os.path.join(cur, "lock")):
            found = os.path.join(cur, ".durable")
            break
        parent = os.path.dirname(cur)
        if parent == cur:
            break
        cur = parent
    _journal_for_dir[d] = found
    return found


def durability_journal(str line, str path):
    """Append ``line`` to the journal of the store holding ``path`` (no-op unless traced)."""
    if _TRACE is None:
        return
    j = _journal_path(path)
    if j is None:
        return
    fd = _journal_fds.get(j)
    if fd is None:
        fd = os.open(j, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        _journal_fds[j] = fd
    os.write(fd, (line + "\n").encode("utf-8", "surrogateescape"))


def fsync_file(fd_or_path, str name=None):
    """fsync a whole regular file (an open fd, or a path opened for it); journals ``F``.

    Raises OSError as ``os.fsync`` does.
    """
    cdef int rc
    cdef int cfd
    if isinstance(fd_or_path, int):
        cfd = fd_or_path
        with nogil:
            rc = fsync(cfd)
        if rc != 0:
            raise OSError(errno, os.strerror(errno), name)
        if _TRACE is not None and name:
            durability_journal("F " + os.path.abspath(name), name)
        return
    path = os.fspath(fd_or_path)
    f = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fsync_file(f, path)
    finally:
        os.close(f)


def fsync_dir(str path):
    """fsync a directory so the entries created / renamed / deleted in it are durable; journals ``D``."""
    cdef int rc
    cdef int cfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with nogil:
            rc = fsync(cfd)
        if rc != 0:
            raise OSError(errno, os.strerror(errno), path)
    finally:
        os.close(cfd)
    if _TRACE is not None:
        durability_journal("D " + os.path.abspath(path), os.path.join(path, "x"))


cdef class MappedFile:
    """A fixed-size file mapped read/write (RocketMQ ``MappedFile``).

    Parameters
    ----------
    file_name : str
        Path of the file.  Its base name is the 20-digit, zero-padded start
        offset in its queue (SPEC.md §0.4).
    file_size : int
        Size in bytes.  A new file is fully allocated to this size; an
        existing file must have exactly this size.
    create : bool
        Create the file if it does not exist (else a missing file raises).

    Raises
    ------
    StoreDiskFullError
        The file could not be allocated (ENOSPC, EDQUOT, or EFBIG from a file
        size limit); nothing is left behind.
    StoreError
        Any other failure to open, allocate or map, or a size mismatch.

    Concurrency: one writer (the owning actor); readers in other processes map
    the same file.  Durability: bytes are durable once ``flushed_position``
    passes them.
    """

    def __cinit__(self, str file_name, int64_t file_size, bint create=True):
        self.fd = -1
        self.base = NULL
        self.exports = 0
        self.write_error = False
        self.file_name = file_name
        self.file_size = file_size
        self.wrote_position = 0
        self.flushed_position = 0
        self.durable_position = 0
        self.store_timestamp_last = 0
        if file_size <= 0:
            raise StoreError(f"mapped file size must be > 0, got {file_size} for {file_name}")
        base_name = os.path.basename(file_name)
        try:
            self.file_from_offset = int(base_name)
        except ValueError:
            self.file_from_offset = 0
        # A new file is made as FILE.tmp, fully allocated, then renamed: a crash
        # never leaves a short file under a real name (loaders drop *.tmp).
        cdef bint existed = os.path.exists(file_name)
        if not existed and not create:
            raise StoreError(f"mapped file {file_name} does not exist")
        cdef str open_name = file_name if existed else file_name + TMP_SUFFIX
        cdef bytes path = os.fsencode(open_name)
        cdef const char* c_path = path
        cdef int flags = O_RDWR | O_CLOEXEC
        if not existed:
            flags |= O_CREAT | O_TRUNC
        cdef int fd
        cdef int rc
        cdef stat st
        cdef void* m
        with nogil:
            fd = open(c_path, flags, 0o644)
        if fd < 0:
            raise StoreError(f"cannot open {open_name}: {os.strerror(errno)}")
        if fstat(fd, &st) != 0:
            close(fd)
            raise StoreError(f"cannot stat {open_name}: {os.strerror(errno)}")
        if existed and st.st_size != file_size:
            close(fd)
            raise StoreError(
                f"{file_name} is {st.st_size} bytes, expected {file_size} (mapped file size)")
        if not existed:
            with nogil:
                rc = posix_fallocate(fd, 0, file_size)
            if rc == 0:
                try:
                    os.rename(open_name, file_name)
                    if _TRACE is not None:
                        durability_journal("C " + os.path.abspath(file_name), file_name)
                    # the new name must survive a power cut before anything in it counts as durable
                    fsync_dir(os.path.dirname(os.path.abspath(file_name)))
                except OSError as e:
                    rc = e.errno or -1
            if rc != 0:
                close(fd)
                try:
                    os.unlink(open_name)
                except OSError:
                    pass
                if rc == ENOSPC or rc == EDQUOT or rc == EFBIG:
                    raise StoreDiskFullError(
                        f"no space left to allocate {file_size} bytes for {file_name}: {os.strerror(rc)}")
                raise StoreError(f"cannot allocate {file_name}: {os.strerror(rc)}")
        with nogil:
            m = mmap(NULL, <size_t>file_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
        # the mapping keeps the file alive: the descriptor is not needed past mmap (msync works on
        # the mapping), and holding one per file ran a store of many small files out of descriptors
        close(fd)
        if m == MAP_FAILED:
            raise StoreError(f"cannot mmap {file_name}: {os.strerror(errno)}")
        self.base = <unsigned char*>m

    def __dealloc__(self):
        if self.base != NULL:
            munmap(self.base, <size_t>self.file_size)
            self.base = NULL
        if self.fd >= 0:
            close(self.fd)
            self.fd = -1

    cdef int _check_open(self) except -1:
        if self.base == NULL:
            raise StoreClosedError(f"mapped file {self.file_name} is closed")
        return 0

    # -- buffer protocol: memoryview(mapped_file) is the whole mapping ----------
    def __getbuffer__(self, Py_buffer* buffer, int flags):
        self._check_open()
        PyBuffer_FillInfo(buffer, self, self.base, self.file_size, 0, flags)
        self.exports += 1

    def __releasebuffer__(self, Py_buffer* buffer):
        self.exports -= 1

    @property
    def closed(self):
        """True once ``close()`` or ``destroy()`` ran."""
        return self.base == NULL

    @property
    def writable_bytes(self):
        """Bytes left after ``wrote_position``."""
        return self.file_size - self.wrote_position

    def is_full(self):
        """True when ``wrote_position`` reached the end of the file."""
        return self.wrote_position >= self.file_size

    def append(self, const unsigned char[::1] data):
        """Copy ``data`` at ``wrote_position`` and advance it.

        Returns
        -------
        int
            The position (bytes, within this file) the data was written at, or
            -1 when it does not fit (nothing written).
        """
        self._check_open()
        cdef Py_ssize_t n = data.shape[0]
        cdef int64_t pos = self.wrote_position
        if pos + n > self.file_size:
            return -1
        if n:
            with nogil:
                memcpy(self.base + pos, &data[0], n)
        self.wrote_position = pos + n
        return pos

    def write_at(self, int64_t pos, const unsigned char[::1] data):
        """Copy ``data`` at ``pos`` (bytes within this file) without moving positions.

        Raises
        ------
        ValueError
            ``pos`` / length out of the file.
        """
        self._check_open()
        cdef Py_ssize_t n = data.shape[0]
        if pos < 0 or pos + n > self.file_size:
            raise ValueError(f"write of {n} bytes at {pos} outside {self.file_name} ({self.file_size} bytes)")
        if n:
            with nogil:
                memcpy(self.base + pos, &data[0], n)

    def read(self, int64_t pos, int64_t size):
        """Copy ``size`` bytes at ``pos`` (within this file) into a new ``bytes``.

        Raises
        ------
        ValueError
            The range is outside the file.
        """
        self._check_open()
        if pos < 0 or size < 0 or pos + size > self.file_size:
            raise ValueError(f"read of {size} bytes at {pos} outside {self.file_name} ({self.file_size} bytes)")
        cdef bytes out = PyBytes_FromStringAndSize(NULL, size)
        if size:
            memcpy(PyBytes_AS_STRING(out), self.base + pos, size)
        return out

    cdef int _flush_range(self, int64_t start, int64_t end) except -1:
        cdef int64_t aligned = start - start % OS_PAGE_SIZE
        cdef int rc
        if end <= start:
            return 0
        cdef int err = 0
        if _FP_AFTER >= 0 and _failpoint_hit(self.file_name):
            rc = -1
            err = EIO
        else:
            with nogil:
                rc = msync(self.base + aligned, <size_t>(end - aligned), MS_SYNC)
            if rc != 0:
                err = errno
        if rc != 0:
            self.write_error = True
            raise StoreError(f"msync of {self.file_name} [{aligned}, {end}) failed: {os.strerror(err)}")
        # only now, after msync returned 0, do these bytes count as durable
        if aligned <= self.durable_position < end:
            self.durable_position = end
        if _TRACE is not None:
            durability_journal(f"R {os.path.abspath(self.file_name)} {aligned} {end}", self.file_name)
        return 0

    def flush(self, int least_pages=0):
        """Make ``[flushed_position, wrote_position)`` durable (msync, GIL released).

        Parameters
        ----------
        least_pages : int
            Flush only when at least this many 4 KiB pages are dirty, or the
            file is full, or ``least_pages <= 0`` (SPEC.md §6.5).

        Returns
        -------
        int
            The new ``flushed_position`` (bytes within the file).

        Raises
        ------
        StoreError
            msync failed; ``flushed_position`` stays where it was and
            ``write_error`` is set (sticky).
        """
        self._check_open()
        if self.write_error:
            raise StoreError(f"{self.file_name} had a failed flush; no more flushes until recovery")
        cdef int64_t wrote = self.wrote_position
        cdef int64_t flushed = self.flushed_position
        if wrote <= flushed:
            return flushed
        if least_pages > 0 and wrote < self.file_size:
            if (wrote // OS_PAGE_SIZE - flushed // OS_PAGE_SIZE) < least_pages:
                return flushed
        self._flush_range(flushed, wrote)
        self.flushed_position = wrote
        return wrote

    def sync_range(self, int64_t start, int64_t end):
        """msync ``[start, end)`` (bytes within the file) whatever ``flushed_position`` says.

        Recovery uses it to make the bytes it accepted from the page cache
        durable before anything is acknowledged on top of them.

        Raises
        ------
        StoreError
            msync failed (``write_error`` is set, sticky).
        """
        self._check_open()
        if start < 0 or end > self.file_size:
            raise ValueError(f"sync_range({start}, {end}) outside {self.file_name}")
        self._flush_range(start, end)

    def warm_up(self, bint lock=False):
        """Touch every 4 KiB page after ``wrote_position`` and advise WILLNEED.

        RocketMQ's ``warmMapedFileEnable`` (SPEC.md §6.7): first-touch page
        faults move out of the append path.  ``lock`` additionally mlocks the
        mapping (best effort: a refused mlock is ignored).
        """
        self._check_open()
        cdef int64_t pos = self.wrote_position
        cdef int64_t size = self.file_size
        cdef unsigned char* base = self.base
        pos = pos - pos % OS_PAGE_SIZE + (OS_PAGE_SIZE if pos % OS_PAGE_SIZE else 0)
        with nogil:
            while pos < size:
                base[pos] = 0
                pos += OS_PAGE_SIZE
            madvise(base, <size_t>size, MADV_WILLNEED)
            if lock:
                mlock(base, <size_t>size)

    def zero_from(self, int64_t pos):
        """Zero the bytes from ``pos`` to the end of the file (recovery truncation).

        Stale bytes after a truncation point could otherwise be read back as
        records by a later recovery; zeroing them makes the cut final.
        """
        self._check_open()
        if pos < 0 or pos > self.file_size:
            raise ValueError(f"zero_from({pos}) outside {self.file_name}")
        cdef int64_t n = self.file_size - pos
        if n > 0:
            with nogil:
                memset(self.base + pos, 0, <size_t>n)
            self._flush_range(pos, self.file_size)

    def close(self):
        """Unmap and close.  Raises BufferError while memoryviews of it are alive."""
        if self.exports > 0:
            raise BufferError(f"{self.file_name}: {self.exports} memoryview(s) still export the mapping")
        if self.base != NULL:
            munmap(self.base, <size_t>self.file_size)
            self.base = NULL
        if self.fd >= 0:
            close(self.fd)
            self.fd = -1

    def destroy(self):
        """Close and delete the file."""
        self.close()
        try:
            os.unlink(self.file_name)
        except FileNotFoundError:
            pass

    def __repr__(self):
        return (f"MappedFile({self.file_name!r}, size={self.file_size}, "
                f"wrote={self.wrote_position}, flushed={self.flushed_position})")
