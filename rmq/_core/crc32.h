/*
 * rmq/_core/crc32.h -- IEEE CRC-32 (zlib / java.util.zip.CRC32), header-only.
 *
 * Polynomial 0x04C11DB7, bit-reflected (0xEDB88320), init and xorout
 * 0xFFFFFFFF: rmq_crc32() returns exactly what zlib's crc32() and Python's
 * zlib.crc32() return, and chains the same way:
 *     rmq_crc32(rmq_crc32(0, a, na), b, nb) == rmq_crc32(0, a+b, na+nb).
 *
 * Two engines:
 *   - slicing-by-8 tables (portable; short buffers, the < 16 byte tail of the
 *     folding engine, and CPUs without PCLMULQDQ);
 *   - on x86, carry-less multiplication folding (Gopal et al., Intel, "Fast
 *     CRC Computation for Generic Polynomials Using PCLMULQDQ Instruction",
 *     2009): four 128-bit accumulators folded 512 bits at a time, then 128 ->
 *     64 bits and a Barrett reduction to 32 bits.  It is compiled with
 *     __attribute__((target("pclmul,sse4.1"))) so no -m flags are needed, and
 *     picked at run time with __builtin_cpu_supports("pclmul").
 *
 * Every function and table is static: each extension module that includes
 * this header gets its own private copy (8 KiB of tables), built once by a
 * load-time constructor (GCC/Clang) or lazily on first use (other compilers).
 * All functions are reentrant and need no GIL.
 */
#ifndef RMQ_CRC32_H
#define RMQ_CRC32_H

#include <stddef.h>
#include <stdint.h>

/* -DRMQ_CRC32_NO_CLMUL forces the portable path (for testing). */
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(RMQ_CRC32_NO_CLMUL)
#define RMQ_CRC32_X86 1
#include <immintrin.h>
#else
#define RMQ_CRC32_X86 0
#endif

#define RMQ_CRC32_POLY 0xEDB88320u /* reflected 0x04C11DB7 */

/* rmq_crc32_tab[k][b]: CRC (no pre/post inversion) of byte b followed by k
 * zero bytes.  rmq_crc32_x2n[k]: x^(2^k) mod P, reflected (bit 31 = x^0). */
static uint32_t rmq_crc32_tab[8][256];
static uint32_t rmq_crc32_x2n[32];
static volatile int rmq_crc32_ready = 0;
#if RMQ_CRC32_X86
static int rmq_crc32_have_clmul = 0;
#endif

/* ------------------------------------------------------------------------ */
/* GF(2) polynomial arithmetic modulo P, reflected representation.          */

/* a * b mod P. */
static uint32_t rmq_crc32_multmodp(uint32_t a, uint32_t b)
{
    uint32_t m = 0x80000000u; /* x^0 */
    uint32_t p = 0;
    while (m) {
        if (a & m)
            p ^= b;
        m >>= 1;
        b = (b >> 1) ^ (RMQ_CRC32_POLY & (0u - (b & 1u))); /* b *= x */
    }
    return p;
}

/* x^(n * 2^k) mod P. */
static uint32_t rmq_crc32_x2nmodp(uint64_t n, unsigned k)
{
    uint32_t p = 0x80000000u; /* x^0 */
    while (n) {
        if (n & 1)
            p = rmq_crc32_multmodp(rmq_crc32_x2n[k & 31], p);
        n >>= 1;
        k++; /* x^(2^32) == x mod P, so the table has period 32 */
    }
    return p;
}

/* ------------------------------------------------------------------------ */
/* Initialisation.                                                          */

static void rmq_crc32_build(void)
{
    uint32_t c, b, k, p;
    for (b = 0; b < 256; b++) {
        c = b;
        for (k = 0; k < 8; k++)
            c = (c >> 1) ^ (RMQ_CRC32_POLY & (0u - (c & 1u)));
        rmq_crc32_tab[0][b] = c;
    }
    for (b = 0; b < 256; b++) {
        c = rmq_crc32_tab[0][b];
        for (k = 1; k < 8; k++) {
            c = (c >> 8) ^ rmq_crc32_tab[0][c & 0xff];
            rmq_crc32_tab[k][b] = c;
        }
    }
    p = 0x40000000u; /* x^1 */
    for (k = 0; k < 32; k++) {
        rmq_crc32_x2n[k] = p;
        p = rmq_crc32_multmodp(p, p);
    }
#if RMQ_CRC32_X86
    __builtin_cpu_init(); /* required when run before other constructors */
    rmq_crc32_have_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
#if defined(__GNUC__)
    __atomic_store_n(&rmq_crc32_ready, 1, __ATOMIC_RELEASE);
#else
    rmq_crc32_ready = 1;
#endif
}

#if defined(__GNUC__)
/* Built when the extension module is loaded, before any call can happen. */
__attribute__((constructor)) static void rmq_crc32_ctor(void)
{
    rmq_crc32_build();
}
#define RMQ_CRC32_ENSURE() ((void)0)
#else
/* Racing first callers all compute and store identical values. */
#define RMQ_CRC32_ENSURE()                                                    \
    do {                                                                      \
        if (!rmq_crc32_ready)                                                 \
            rmq_crc32_build();                                                \
    } while (0)
#endif

/* ------------------------------------------------------------------------ */
/* Slicing-by-8.  `c` is the running CRC register (already inverted).        */

static inline uint32_t rmq_crc32_le32(const unsigned char *p)
{
    /* compilers turn this into a single load on little-endian targets */
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint32_t rmq_crc32_slice8(uint32_t c, const unsigned char *buf, size_t len)
{
    const uint32_t(*t)[256] = (const uint32_t(*)[256])rmq_crc32_tab;
    while (len >= 8) {
        uint32_t lo = c ^ rmq_crc32_le32(buf);
        uint32_t hi = rmq_crc32_le32(buf + 4);
        c = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
            t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
        buf += 8;
        len -= 8;
    }
    while (len--)
        c = (c >> 8) ^ t[0][(c ^ *buf++) & 0xff];
    return c;
}

/* ------------------------------------------------------------------------ */
/* PCLMULQDQ folding (x86 only).                                            */

#if RMQ_CRC32_X86
/*
 * Constants, for the reflected domain.  A 64-bit lane holding constant K
 * multiplies the other operand by x^n mod P where
 *     K = bitreverse32(x^n mod P) << 1
 * (the << 1 absorbs the one-bit shift of a reflected carry-less product).
 * Computed with a few lines of Python over GF(2)[x], P = 0x104C11DB7:
 *     n = 4*128+32  -> 0x154442BD4   fold 512 bits, low lane
 *     n = 4*128-32  -> 0x1C6E41596   fold 512 bits, high lane
 *     n = 128+32    -> 0x1751997D0   fold 128 bits, low lane
 *     n = 128-32    -> 0x0CCAA009E   fold 128 bits, high lane
 *     n = 64        -> 0x163CD6124   96 -> 64 bits
 * Barrett: mu = bitreverse33(floor(x^64 / P)) = bitreverse33(0x104D101DF)
 *             = 0x1F7011641,
 *          P' = bitreverse33(P) = 0x1DB710641.
 */
#define RMQ_K_F512 _mm_set_epi64x(0x1C6E41596LL, 0x154442BD4LL)
#define RMQ_K_F128 _mm_set_epi64x(0x0CCAA009ELL, 0x1751997D0LL)
#define RMQ_K_F96 _mm_set_epi64x(0, 0x163CD6124LL)
#define RMQ_K_BARRETT _mm_set_epi64x(0x1F7011641LL, 0x1DB710641LL)

/* x * x^n mod P (congruent, still 128 bits wide) for the two lanes of k. */
#define RMQ_FOLD(x, k) \
    _mm_xor_si128(_mm_clmulepi64_si128((x), (k), 0x00), _mm_clmulepi64_si128((x), (k), 0x11))

/*
 * Requires len >= 64 and len % 16 == 0; `c` is the running (inverted) CRC.
 *
 * Register model: byte 0 of the buffer sits in bits 0..7, and bit i of a
 * 128-bit register is the coefficient of x^(127-i) relative to the end of
 * its 16-byte block.
 */
__attribute__((target("pclmul,sse4.1"))) static uint32_t
rmq_crc32_clmul(uint32_t c, const unsigned char *buf, size_t len)
{
    const __m128i mask32 = _mm_setr_epi32(-1, 0, -1, 0);
    __m128i k, x0, x1, x2, x3, t;

    x0 = _mm_loadu_si128((const __m128i *)(buf + 0));
    x1 = _mm_loadu_si128((const __m128i *)(buf + 16));
    x2 = _mm_loadu_si128((const __m128i *)(buf + 32));
    x3 = _mm_loadu_si128((const __m128i *)(buf + 48));
    x0 = _mm_xor_si128(x0, _mm_cvtsi32_si128((int)c)); /* the CRC so far */
    buf += 64;
    len -= 64;

    /* Four independent accumulators, each folded over the next 64 bytes. */
    k = RMQ_K_F512;
    while (len >= 64) {
        x0 = _mm_xor_si128(RMQ_FOLD(x0, k), _mm_loadu_si128((const __m128i *)(buf + 0)));
        x1 = _mm_xor_si128(RMQ_FOLD(x1, k), _mm_loadu_si128((const __m128i *)(buf + 16)));
        x2 = _mm_xor_si128(RMQ_FOLD(x2, k), _mm_loadu_si128((const __m128i *)(buf + 32)));
        x3 = _mm_xor_si128(RMQ_FOLD(x3, k), _mm_loadu_si128((const __m128i *)(buf + 48)));
        buf += 64;
        len -= 64;
    }

    /* 4 x 128 -> 128, then the remaining 16-byte blocks. */
    k = RMQ_K_F128;
    x0 = _mm_xor_si128(RMQ_FOLD(x0, k), x1);
    x0 = _mm_xor_si128(RMQ_FOLD(x0, k), x2);
    x0 = _mm_xor_si128(RMQ_FOLD(x0, k), x3);
    while (len >= 16) {
        x0 = _mm_xor_si128(RMQ_FOLD(x0, k), _mm_loadu_si128((const __m128i *)buf));
        buf += 16;
        len -= 16;
    }

    /* 128 -> 96 bits: low lane * x^96 (== * x^128 with the product's own
     * x^32 offset) plus the high lane moved up 64 places. */
    t = _mm_clmulepi64_si128(x0, k, 0x10);
    x0 = _mm_xor_si128(_mm_srli_si128(x0, 8), t);
    /* 96 -> 64 bits: the top 32 bits times x^64, plus the rest moved up 32.
     * The 64-bit low lane W now satisfies W == CRC (mod P). */
    t = _mm_clmulepi64_si128(_mm_and_si128(x0, mask32), RMQ_K_F96, 0x00);
    x0 = _mm_xor_si128(_mm_srli_si128(x0, 4), t);

    /* Barrett: T1 = floor(W / x^32) * mu; T2 = floor(T1 / x^32) * P;
     * CRC = (W + T2) mod x^32, which lands in bits 32..63. */
    k = RMQ_K_BARRETT;
    t = _mm_clmulepi64_si128(_mm_and_si128(x0, mask32), k, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), k, 0x00);
    x0 = _mm_xor_si128(x0, t);
    return (uint32_t)_mm_extract_epi32(x0, 1);
}

#undef RMQ_FOLD
#undef RMQ_K_F512
#undef RMQ_K_F128
#undef RMQ_K_F96
#undef RMQ_K_BARRETT
#endif /* RMQ_CRC32_X86 */

/* ------------------------------------------------------------------------ */
/* Public API.                                                              */

/* Same contract as zlib's crc32(crc, buf, len): pass 0 to start. */
static uint32_t rmq_crc32(uint32_t crc, const unsigned char *buf, size_t len)
{
    uint32_t c = ~crc;
    RMQ_CRC32_ENSURE();
#if RMQ_CRC32_X86
    if (len >= 64 && rmq_crc32_have_clmul) {
        size_t n = len & ~(size_t)15;
        c = rmq_crc32_clmul(c, buf, n);
        buf += n;
        len -= n;
    }
#endif
    return ~rmq_crc32_slice8(c, buf, len);
}

/* CRC of A+B from crc1 = crc(A), crc2 = crc(B) and len2 = len(B); O(log len2).
 * A negative len2 is taken as 0. */
static uint32_t rmq_crc32_combine(uint32_t crc1, uint32_t crc2, int64_t len2)
{
    RMQ_CRC32_ENSURE();
    if (len2 <= 0)
        return crc1 ^ crc2;
    /* crc(A+B) = crc(A) * x^(8*len2) + crc(B) mod P; the pre/post inversions
     * cancel out. */
    return rmq_crc32_multmodp(rmq_crc32_x2nmodp((uint64_t)len2, 3), crc1) ^ crc2;
}

/* RocketMQ's UtilAll.crc32(byte[]): the CRC masked to a non-negative int. */
static int32_t rmq_crc32_java(const unsigned char *buf, size_t len)
{
    return (int32_t)(rmq_crc32(0, buf, len) & 0x7FFFFFFFu);
}

#endif /* RMQ_CRC32_H */
