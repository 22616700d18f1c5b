# cython: language_level=3
# Java String.hashCode() over UTF-8 bytes (SPEC.md §0.2): the string is taken
# as UTF-16 code units (non-BMP characters give two surrogates), and
# h = 31*h + unit wraps at 2^32.  Used for tagsCode and IndexFile keys, so our
# files hash exactly as RocketMQ's.
from libc.stdint cimport int32_t, uint32_t


cdef inline uint32_t java_hash_update(uint32_t h, const unsigned char* p, Py_ssize_t n) noexcept nogil:
    """Continue a Java String.hashCode ``h`` over ``n`` UTF-8 bytes at ``p``.

    Malformed UTF-8 bytes count as U+FFFD each, as Java's decoder replaces them.
    """
    cdef Py_ssize_t i = 0
    cdef uint32_t c, cp
    cdef unsigned char b
    while i < n:
        b = p[i]
        if b < 0x80:
            h = 31 * h + b
            i += 1
            continue
        if (b & 0xE0) == 0xC0 and i + 1 < n and (p[i + 1] & 0xC0) == 0x80 and b >= 0xC2:
            cp = ((b & 0x1F) << 6) | (p[i + 1] & 0x3F)
            i += 2
        elif (b & 0xF0) == 0xE0 and i + 2 < n and (p[i + 1] & 0xC0) == 0x80 and (p[i + 2] & 0xC0) == 0x80:
            cp = ((b & 0x0F) << 12) | ((p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F)
            if cp < 0x800 or (0xD800 <= cp <= 0xDFFF):
                cp = 0xFFFD
            i += 3
        elif (b & 0xF8) == 0xF0 and i + 3 < n and (p[i + 1] & 0xC0) == 0x80 and (p[i + 2] & 0xC0) == 0x80 and (p[i + 3] & 0xC0) == 0x80:
            cp = ((b & 0x07) << 18) | ((p[i + 1] & 0x3F) << 12) | ((p[i + 2] & 0x3F) << 6) | (p[i + 3] & 0x3F)
            i += 4
            if cp < 0x10000 or cp > 0x10FFFF:
                cp = 0xFFFD
            else:
                c = cp - 0x10000
                h = 31 * h + (0xD800 + (c >> 10))
                cp = 0xDC00 + (c & 0x3FF)
        else:
            cp = 0xFFFD
            i += 1
        h = 31 * h + cp
    return h


cdef inline int32_t java_hash(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    """Java ``String.hashCode()`` of the UTF-8 string ``p[0:n]``, as a signed int32."""
    return <int32_t>java_hash_update(0, p, n)


cdef inline int32_t index_key_hash(const unsigned char* topic, Py_ssize_t topic_len,
                                   const unsigned char* key, Py_ssize_t key_len) noexcept nogil:
    """IndexFile key hash of ``topic + "#" + key`` (SPEC.md §3.2): abs(hashCode), 0 for MIN_VALUE."""
    cdef uint32_t h = java_hash_update(0, topic, topic_len)
    h = 31 * h + 35   # '#'
    h = java_hash_update(h, key, key_len)
    if h == 0x80000000u:    # Integer.MIN_VALUE stays negative under abs(): use 0
        return 0
    cdef int32_t s = <int32_t>h
    return -s if s < 0 else s
