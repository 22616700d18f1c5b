# cython: language_level=3
# Big-endian loads and stores (Java ByteBuffer order) over raw pointers.
# Every multi-byte field of every rmq file goes through these helpers.
from libc.stdint cimport int16_t, int32_t, int64_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy


cdef extern from *:
    """
    #define rmq_bswap16(x) __builtin_bswap16(x)
    #define rmq_bswap32(x) __builtin_bswap32(x)
    #define rmq_bswap64(x) __builtin_bswap64(x)
    """
    uint16_t rmq_bswap16(uint16_t) nogil
    uint32_t rmq_bswap32(uint32_t) nogil
    uint64_t rmq_bswap64(uint64_t) nogil


cdef inline int16_t load_be16(const unsigned char* p) noexcept nogil:
    cdef uint16_t v
    memcpy(&v, p, 2)
    return <int16_t>rmq_bswap16(v)


cdef inline int32_t load_be32(const unsigned char* p) noexcept nogil:
    cdef uint32_t v
    memcpy(&v, p, 4)
    return <int32_t>rmq_bswap32(v)


cdef inline int64_t load_be64(const unsigned char* p) noexcept nogil:
    cdef uint64_t v
    memcpy(&v, p, 8)
    return <int64_t>rmq_bswap64(v)


cdef inline void store_be16(unsigned char* p, int16_t x) noexcept nogil:
    cdef uint16_t v = rmq_bswap16(<uint16_t>x)
    memcpy(p, &v, 2)


cdef inline void store_be32(unsigned char* p, int32_t x) noexcept nogil:
    cdef uint32_t v = rmq_bswap32(<uint32_t>x)
    memcpy(p, &v, 4)


cdef inline void store_be64(unsigned char* p, int64_t x) noexcept nogil:
    cdef uint64_t v = rmq_bswap64(<uint64_t>x)
    memcpy(p, &v, 8)
