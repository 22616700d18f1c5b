# cython: language_level=3
# IEEE CRC-32 (zlib / java.util.zip.CRC32) for the storage core, from the
# header-only C implementation in crc32.h (VPCLMULQDQ / PCLMULQDQ folding on
# x86, slicing-by-8 elsewhere).  Cython users:
#     from rmq._core.crc cimport rmq_crc32, rmq_crc32_copy, rmq_crc32_combine
from libc.stdint cimport int32_t, int64_t, uint32_t


cdef extern from "crc32.h" nogil:
    # zlib's crc32(crc, buf, len): pass 0 to start, chain by passing the last
    # result back in.
    uint32_t rmq_crc32(uint32_t crc, const unsigned char* buf, size_t len) noexcept
    # memcpy(dst, src, len) and return rmq_crc32(crc, src, len), reading src
    # once.  Any alignment, any len (>= 64 takes the fused SIMD path).  dst and
    # src must not overlap.  Writes exactly dst[0..len).
    uint32_t rmq_crc32_copy(uint32_t crc, unsigned char* dst, const unsigned char* src,
                            size_t len) noexcept
    # CRC of A+B from crc(A), crc(B) and len(B); a few ns.  len2 < 0 is 0.
    uint32_t rmq_crc32_combine(uint32_t crc1, uint32_t crc2, int64_t len2) noexcept
    # crc * x^(8*len) mod P: rmq_crc32_combine(c1, c2, n) == rmq_crc32_shift(c1, n) ^ c2.
    uint32_t rmq_crc32_shift(uint32_t crc, int64_t len) noexcept
    # RocketMQ UtilAll.crc32 (SPEC.md §0.3): the CRC & 0x7FFFFFFF.
    int32_t rmq_crc32_java(const unsigned char* buf, size_t len) noexcept
