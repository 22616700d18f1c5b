# cython: language_level=3
"""IEEE CRC-32 of the storage core (zlib / ``java.util.zip.CRC32``).

Results are identical to :func:`zlib.crc32`; the C implementation
(``crc32.h``) folds with VPCLMULQDQ (AVX-512) or PCLMULQDQ on x86 and uses
slicing-by-8 tables elsewhere.  Cython modules call the C functions
directly::

    from rmq._core.crc cimport rmq_crc32, rmq_crc32_copy, rmq_crc32_combine
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint32_t, uintptr_t
from libc.string cimport memmove

__all__ = ["crc32", "crc32_copy", "crc32_combine", "java_crc32"]


cdef extern from "crc32.h" nogil:
    # test hooks: the engine in use in this module's copy of crc32.h
    int rmq_crc32_engine() noexcept
    int rmq_crc32_set_engine(int engine) noexcept

# RMQ_CRC32_ENGINE_TABLE, _CLMUL, _VPCLMUL
_ENGINES = ("table", "pclmul", "vpclmul")

# Buffers at least this long are checksummed with the GIL released.
cdef Py_ssize_t _NOGIL_MIN = 5 * 1024


cdef inline const unsigned char[::1] _byte_view(object data):
    """A contiguous byte view of any buffer object (bytes, bytearray, mmap, ...)."""
    if data is None:    # a typed memoryview would accept None as an empty view
        raise TypeError("a bytes-like object is required, not 'NoneType'")
    try:
        return data
    except ValueError:
        # Other item formats ("i", "d", ...) and C-contiguous N-d buffers are
        # taken as their raw bytes, like zlib.crc32; a non-contiguous buffer
        # raises TypeError from cast().
        return memoryview(data).cast("B")


cdef inline uint32_t _crc_bytes(uint32_t crc, bytes data) noexcept:
    """CRC of a ``bytes`` object (its buffer is immutable, no view needed)."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
    if n >= _NOGIL_MIN:
        with nogil:
            crc = rmq_crc32(crc, p, <size_t>n)
        return crc
    return rmq_crc32(crc, p, <size_t>n)


cdef uint32_t _crc_any(uint32_t crc, object data) except? 0:
    """CRC of any buffer object through a typed memoryview."""
    cdef const unsigned char[::1] view = _byte_view(data)
    cdef Py_ssize_t n = view.shape[0]
    if n == 0:
        return crc
    if n >= _NOGIL_MIN:
        with nogil:
            crc = rmq_crc32(crc, &view[0], <size_t>n)
        return crc
    return rmq_crc32(crc, &view[0], <size_t>n)


def crc32(data, value=0):
    """Compute the IEEE CRC-32 of `data`, continuing from `value`.

    Same result and chaining as :func:`zlib.crc32`:
    ``crc32(b, crc32(a)) == crc32(a + b)``.

    Parameters
    ----------
    data : bytes-like
        Any C-contiguous buffer: ``bytes``, ``bytearray``, ``memoryview``,
        ``mmap.mmap``, ``array.array``, numpy arrays ...  Buffers of 5 KiB or
        more are processed with the GIL released.
    value : int, optional
        CRC of the preceding data (default 0, i.e. start a new CRC).  Taken
        modulo 2**32, as :func:`zlib.crc32` does.

    Returns
    -------
    int
        The unsigned 32-bit CRC.
    """
    cdef uint32_t crc = <uint32_t>(value & 0xFFFFFFFF)
    if type(data) is bytes:
        return _crc_bytes(crc, <bytes>data)
    return _crc_any(crc, data)


def crc32_copy(dst, src, value=0):
    """Copy `src` to the start of `dst` and return the CRC-32 of `src`.

    ``crc32_copy(dst, src, value)`` does ``dst[:len(src)] = src`` (in bytes)
    and returns ``zlib.crc32(src, value)``, reading `src` only once (the C
    ``rmq_crc32_copy``).  Bytes of `dst` past ``len(src)`` are not touched.

    Parameters
    ----------
    dst : writable bytes-like
        ``bytearray``, writable ``memoryview``, ``mmap.mmap``, ...
        (C-contiguous, any item format, taken as raw bytes); at least as long
        as `src`.  Overlapping `src` is allowed here (it is then copied as by
        ``memmove``; the C function itself requires disjoint buffers).
    src : bytes-like
        Any C-contiguous buffer, as for :func:`crc32`.  Buffers of 5 KiB or
        more are processed with the GIL released.
    value : int, optional
        CRC of the preceding data (default 0), taken modulo 2**32.

    Returns
    -------
    int
        The unsigned 32-bit CRC of `src`, continuing from `value`.

    Raises
    ------
    TypeError
        If `dst` is not a writable contiguous buffer, or `src` not a buffer.
    ValueError
        If `dst` is shorter than `src`.
    """
    cdef uint32_t crc = <uint32_t>(value & 0xFFFFFFFF)
    cdef Py_buffer s
    cdef Py_buffer d
    cdef const unsigned char* sp
    cdef unsigned char* dp
    cdef Py_ssize_t n
    # Py_buffer directly: a typed memoryview costs ~100 ns per argument.
    PyObject_GetBuffer(src, &s, PyBUF_SIMPLE)
    try:
        try:
            PyObject_GetBuffer(dst, &d, PyBUF_SIMPLE | PyBUF_WRITABLE)
        except BufferError as e:
            raise TypeError(f"dst must be a writable, contiguous bytes-like object ({e})") from None
        try:
            n = s.len
            if d.len < n:
                raise ValueError(f"dst is shorter than src ({d.len} < {n} bytes)")
            sp = <const unsigned char*>s.buf
            dp = <unsigned char*>d.buf
            if n == 0:
                pass
            elif <uintptr_t>dp < <uintptr_t>(sp + n) and <uintptr_t>sp < <uintptr_t>(dp + n):
                # overlapping views of one buffer: CRC first, then memmove
                with nogil:
                    crc = rmq_crc32(crc, sp, <size_t>n)
                    memmove(dp, sp, <size_t>n)
            elif n >= _NOGIL_MIN:
                with nogil:
                    crc = rmq_crc32_copy(crc, dp, sp, <size_t>n)
            else:
                crc = rmq_crc32_copy(crc, dp, sp, <size_t>n)
        finally:
            PyBuffer_Release(&d)
    finally:
        PyBuffer_Release(&s)
    return crc


def crc32_combine(crc1, crc2, len2):
    """Compute the CRC-32 of ``A + B`` from the CRCs of `A` and `B`.

    Runs in constant time (a few carry-less multiplies) without touching
    the data; same result as zlib's ``crc32_combine``.

    Parameters
    ----------
    crc1 : int
        ``crc32(A)``, taken modulo 2**32.
    crc2 : int
        ``crc32(B)``, taken modulo 2**32.
    len2 : int
        ``len(B)`` in bytes, ``0 <= len2 < 2**63``.

    Returns
    -------
    int
        ``crc32(A + B)``, unsigned 32-bit.

    Raises
    ------
    ValueError
        If `len2` is negative.
    OverflowError
        If `len2` does not fit in a signed 64-bit integer.
    """
    cdef int64_t n = len2
    if n < 0:
        raise ValueError(f"len2 must be >= 0, got {len2}")
    return rmq_crc32_combine(<uint32_t>(crc1 & 0xFFFFFFFF), <uint32_t>(crc2 & 0xFFFFFFFF), n)


def java_crc32(data):
    """Compute RocketMQ's ``UtilAll.crc32``: the CRC-32 masked to 31 bits.

    RocketMQ stores ``crc32(data) & 0x7FFFFFFF`` so the value is a
    non-negative Java ``int`` (SPEC.md §0.3); this is the value of the
    BODYCRC field of a CommitLog record.

    Parameters
    ----------
    data : bytes-like
        Any C-contiguous buffer, as for :func:`crc32`.

    Returns
    -------
    int
        ``zlib.crc32(data) & 0x7FFFFFFF``, in ``[0, 2**31)``.
    """
    cdef uint32_t crc
    if type(data) is bytes:
        crc = _crc_bytes(0, <bytes>data)
    else:
        crc = _crc_any(0, data)
    return <int>(crc & 0x7FFFFFFF)


def _engine():
    """The CRC engine in use in this module: "table", "pclmul" or "vpclmul".

    Test hook.  Other extension modules (commitlog, ...) have their own copy
    of crc32.h and always use the best engine of the CPU.
    """
    return _ENGINES[rmq_crc32_engine()]


def _set_engine(engine):
    """Use `engine` (a name of :data:`_ENGINES`) from now on in this module.

    Test hook: the request is clamped to what the CPU (and the build)
    supports, and the engine actually in use is returned.  Not meant to be
    called while other threads compute CRCs with this module.
    """
    return _ENGINES[rmq_crc32_set_engine(_ENGINES.index(engine))]
