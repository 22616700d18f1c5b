/*
 * rmq/_core/crc32.h -- IEEE CRC-32 (zlib / java.util.zip.CRC32), header-only.
 *
 * Polynomial 0x04C11DB7, bit-reflected (0xEDB88320), init and xorout
 * 0xFFFFFFFF: rmq_crc32() returns exactly what zlib's crc32() and Python's
 * zlib.crc32() return, and chains the same way:
 *     rmq_crc32(rmq_crc32(0, a, na), b, nb) == rmq_crc32(0, a+b, na+nb).
 *
 * API (all static, reentrant, no GIL needed):
 *   rmq_crc32(crc, buf, len)            zlib's crc32()
 *   rmq_crc32_copy(crc, dst, src, len)  memcpy(dst, src, len) and return
 *                                       rmq_crc32(crc, src, len), in one pass
 *   rmq_crc32_combine(crc1, crc2, len2) zlib's crc32_combine(); a few ns
 *   rmq_crc32_shift(crc, len)           crc * x^(8*len) mod P, so that
 *                                       combine(c1, c2, n) == shift(c1, n) ^ c2
 *   rmq_crc32_java(buf, len)            crc & 0x7FFFFFFF (RocketMQ UtilAll.crc32)
 *
 * Three engines, picked at run time (__builtin_cpu_supports), all compiled
 * with __attribute__((target(...))) so no global -m flags are needed:
 *   - slicing-by-8 tables (portable; buffers < 64 bytes and CPUs without
 *     PCLMULQDQ);
 *   - carry-less multiplication folding with PCLMULQDQ (Gopal et al., Intel,
 *     "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ
 *     Instruction", 2009): four 128-bit accumulators folded 512 bits at a
 *     time, then 128 -> 64 bits and a Barrett reduction to 32 bits;
 *   - the same folding on 512-bit registers with VPCLMULQDQ + AVX-512F/VL
 *     (x86-64 only): four zmm accumulators folded 256 bytes per iteration,
 *     then 4 zmm -> 1 zmm -> 1 xmm and the 128-bit tail of the engine above
 *     (buffers of 64..255 bytes fold a single zmm).  Used for buffers >=
 *     RMQ_CRC32_V512_MIN (default 64) bytes.
 * Both folding engines finish a last partial 16-byte block with the
 * overlapping-load + PSHUFB trick, so no byte goes through the tables once
 * len >= 64.
 *
 * Compile-time switches (for testing): -DRMQ_CRC32_NO_CLMUL forces the
 * portable path; -DRMQ_CRC32_NO_VPCLMUL removes only the AVX-512 engine.  At
 * run time rmq_crc32_set_engine() can lower the engine (tests only).
 *
 * Every function and table is static: each extension module that includes
 * this header gets its own private copy (~12 KiB of tables), built once by a
 * load-time constructor (GCC/Clang) or lazily on first use (other compilers).
 */
#ifndef RMQ_CRC32_H
#define RMQ_CRC32_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(RMQ_CRC32_NO_CLMUL)
#define RMQ_CRC32_X86 1
#include <immintrin.h>
#else
#define RMQ_CRC32_X86 0
#endif

/* The 512-bit engine: x86-64, GCC >= 8 or Clang >= 8 (VPCLMULQDQ intrinsics). */
#if RMQ_CRC32_X86 && defined(__x86_64__) && !defined(RMQ_CRC32_NO_VPCLMUL) &&                    \
    ((defined(__clang__) && __clang_major__ >= 8) || (!defined(__clang__) && __GNUC__ >= 8))
#define RMQ_CRC32_V512 1
#else
#define RMQ_CRC32_V512 0
#endif

/* Smallest buffer handed to the 512-bit engine (it works from 64 bytes on:
 * below 256 bytes it folds a single zmm, which on Zen 5 is still faster than
 * the 128-bit engine -- 64 B: 3.7 vs 5.2 ns, 128 B: 4.6 vs 8.8 ns). */
#ifndef RMQ_CRC32_V512_MIN
#define RMQ_CRC32_V512_MIN 64
#endif

#define RMQ_CRC32_POLY 0xEDB88320u /* reflected 0x04C11DB7 */

/* Engines, as returned by rmq_crc32_engine(). */
#define RMQ_CRC32_ENGINE_TABLE 0
#define RMQ_CRC32_ENGINE_CLMUL 1
#define RMQ_CRC32_ENGINE_VPCLMUL 2

/* rmq_crc32_tab[k][b]: CRC (no pre/post inversion) of byte b followed by k
 * zero bytes.  rmq_crc32_x2n[k]: x^(2^k) mod P.  rmq_crc32_x8n[k][d]:
 * x^(8 * d * 256^k) mod P, for rmq_crc32_shift().  All reflected (bit 31 is
 * the coefficient of x^0). */
static uint32_t rmq_crc32_tab[8][256];
static uint32_t rmq_crc32_x2n[32];
static uint32_t rmq_crc32_x8n[4][256];
static volatile int rmq_crc32_ready = 0;
/* The CPU's best engine, and the one in use (lowered only by tests). */
static int rmq_crc32_engine_max = RMQ_CRC32_ENGINE_TABLE;
static int rmq_crc32_engine_cur = RMQ_CRC32_ENGINE_TABLE;

/* ------------------------------------------------------------------------ */
/* GF(2) polynomial arithmetic modulo P, reflected representation.          */

/* a * b mod P, portable (32 shift-and-add steps). */
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
    for (k = 0; k < 4; k++) {
        uint32_t base = rmq_crc32_x2n[3 + 8 * k]; /* x^(8 * 256^k) */
        p = 0x80000000u;                         /* x^0 */
        for (b = 0; b < 256; b++) {
            rmq_crc32_x8n[k][b] = p;
            p = rmq_crc32_multmodp(p, base);
        }
    }
#if RMQ_CRC32_X86
    __builtin_cpu_init(); /* required when run before other constructors */
    if (__builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1")) {
        rmq_crc32_engine_max = RMQ_CRC32_ENGINE_CLMUL;
#if RMQ_CRC32_V512
        /* libgcc's avx512* bits also check that the OS saves zmm state. */
        if (__builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("avx512f") &&
            __builtin_cpu_supports("avx512vl"))
            rmq_crc32_engine_max = RMQ_CRC32_ENGINE_VPCLMUL;
#endif
    }
    rmq_crc32_engine_cur = rmq_crc32_engine_max;
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

/* The engine in use (RMQ_CRC32_ENGINE_*). */
static int rmq_crc32_engine(void)
{
    RMQ_CRC32_ENSURE();
    return rmq_crc32_engine_cur;
}

/* Tests only: use `engine` (clamped to what the CPU supports) from now on in
 * this module's copy of the header.  Not synchronised with concurrent calls
 * (every engine gives the same results, so a racing call is still correct).
 * Returns the engine now in use. */
static int rmq_crc32_set_engine(int engine)
{
    RMQ_CRC32_ENSURE();
    if (engine < RMQ_CRC32_ENGINE_TABLE)
        engine = RMQ_CRC32_ENGINE_TABLE;
    if (engine > rmq_crc32_engine_max)
        engine = rmq_crc32_engine_max;
    rmq_crc32_engine_cur = engine;
    return engine;
}

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
/* PCLMULQDQ / VPCLMULQDQ folding (x86 only).                               */

#if RMQ_CRC32_X86
/*
 * Constants, for the reflected domain.  A 64-bit lane holding constant K
 * multiplies the other operand by x^n mod P where
 *     K(n) = bitreverse32(x^n mod P) << 1
 * (the << 1 absorbs the one-bit shift of a reflected carry-less product).
 * Folding a 128-bit block forward by D bits uses K(D+32) for its low lane
 * and K(D-32) for its high lane.  Generated with this Python (P = 0x104C11DB7):
 *
 *     def mulmod(a, b):                      # GF(2)[x] product mod P
 *         r = 0
 *         while b:
 *             if b & 1: r ^= a
 *             b >>= 1; a <<= 1
 *             if a >> 32: a ^= 0x104C11DB7
 *         return r
 *     def xnmodp(n):                         # x^n mod P, square-and-multiply
 *         r, s = 1, 2
 *         while n:
 *             if n & 1: r = mulmod(r, s)
 *             s = mulmod(s, s); n >>= 1
 *         return r
 *     K = lambda n: int(format(xnmodp(n), "032b")[::-1], 2) << 1
 *
 *     D (bits)  use                         K(D+32)      K(D-32)
 *     2048      4 zmm, 256 bytes/iteration  0x11542778A  0x1322D1430
 *     1536      zmm 0 -> zmm 3              0x1821D8BC0  0x12E958AC4
 *     1024      zmm 1 -> zmm 3              0x1E88EF372  0x14A7FE880
 *      512      4 xmm / zmm -> next 64 B    0x154442BD4  0x1C6E41596
 *      384      zmm lane 0 -> lane 3        0x03DB1ECDC  0x174359406
 *      256      zmm lane 1 -> lane 3        0x0F1DA05AA  0x15A546366
 *      128      xmm -> next 16 bytes        0x1751997D0  0x0CCAA009E
 *     and K(64) = 0x163CD6124 (96 -> 64 bits).
 * Barrett: mu = bitreverse33(floor(x^64 / P)) = bitreverse33(0x104D101DF)
 *             = 0x1F7011641,
 *          P' = bitreverse33(P) = 0x1DB710641.
 * (x^(2^32 - 1) mod P == 1, checked with the same script: rmq_crc32_shift()
 * reduces its exponent modulo 2^32 - 1.)
 */
#define RMQ_K_F512 _mm_set_epi64x(0x1C6E41596LL, 0x154442BD4LL)
#define RMQ_K_F128 _mm_set_epi64x(0x0CCAA009ELL, 0x1751997D0LL)
#define RMQ_K_F96 _mm_set_epi64x(0, 0x163CD6124LL)
#define RMQ_K_BARRETT _mm_set_epi64x(0x1F7011641LL, 0x1DB710641LL)

#define RMQ_TARGET_CLMUL __attribute__((target("pclmul,sse4.1")))
#define RMQ_INLINE_CLMUL static inline __attribute__((always_inline, target("pclmul,sse4.1")))

/* x * x^n mod P (congruent, still 128 bits wide) for the two lanes of k. */
#define RMQ_FOLD(x, k) \
    _mm_xor_si128(_mm_clmulepi64_si128((x), (k), 0x00), _mm_clmulepi64_si128((x), (k), 0x11))

/* PSHUFB controls for the partial last block: loaded from +r, "shift left by
 * 16 - r bytes" (and, by its top bits, the blend mask); from +16+r, "shift
 * right by r bytes". */
static const unsigned char rmq_crc32_shuf[48] = {
    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
};

/*
 * Register model: byte 0 of a 16-byte block sits in bits 0..7, and bit i of
 * a 128-bit register is the coefficient of x^(127-i) relative to the end of
 * its block.  An accumulator `x` stands for all the data before `src`.
 *
 * Folds in the remaining `len` bytes (any length; the partial last block
 * re-reads the 16 bytes ending at src + len, so at least 16 bytes must
 * precede src + len in the buffer) and reduces to the 32-bit CRC register.
 * With `copy`, also stores every byte read to dst.
 */
RMQ_INLINE_CLMUL uint32_t rmq_crc32_fin128(__m128i x, unsigned char *dst, const unsigned char *src,
                                           size_t len, const int copy)
{
    const __m128i mask32 = _mm_setr_epi32(-1, 0, -1, 0);
    __m128i k = RMQ_K_F128, t;

    while (len >= 16) {
        t = _mm_loadu_si128((const __m128i *)src);
        if (copy) {
            _mm_storeu_si128((__m128i *)dst, t);
            dst += 16;
        }
        x = _mm_xor_si128(RMQ_FOLD(x, k), t);
        src += 16;
        len -= 16;
    }
    if (len) {
        /* r = len bytes left.  The accumulator A and the tail T (16 + r
         * bytes) are regrouped as [16 - r zero bytes, A[0..r)] followed by
         * the 16-byte block A[r..16) + T: the first is folded into the second. */
        __m128i b = _mm_loadu_si128((const __m128i *)(src + len - 16)); /* ends with T */
        __m128i lsh = _mm_loadu_si128((const __m128i *)(rmq_crc32_shuf + len));
        __m128i rsh = _mm_loadu_si128((const __m128i *)(rmq_crc32_shuf + 16 + len));
        __m128i hi = _mm_shuffle_epi8(x, lsh);
        __m128i lo = _mm_blendv_epi8(b, _mm_shuffle_epi8(x, rsh), lsh);
        if (copy) /* rewrites 16 - r bytes already stored, with the same values */
            _mm_storeu_si128((__m128i *)(dst + len - 16), b);
        x = _mm_xor_si128(RMQ_FOLD(hi, k), lo);
    }

    /* 128 -> 96 bits: low lane * x^96 (== * x^128 with the product's own
     * x^32 offset) plus the high lane moved up 64 places. */
    t = _mm_clmulepi64_si128(x, k, 0x10);
    x = _mm_xor_si128(_mm_srli_si128(x, 8), t);
    /* 96 -> 64 bits: the top 32 bits times x^64, plus the rest moved up 32.
     * The 64-bit low lane W now satisfies W == CRC (mod P). */
    t = _mm_clmulepi64_si128(_mm_and_si128(x, mask32), RMQ_K_F96, 0x00);
    x = _mm_xor_si128(_mm_srli_si128(x, 4), t);

    /* Barrett: T1 = floor(W / x^32) * mu; T2 = floor(T1 / x^32) * P;
     * CRC = (W + T2) mod x^32, which lands in bits 32..63. */
    k = RMQ_K_BARRETT;
    t = _mm_clmulepi64_si128(_mm_and_si128(x, mask32), k, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), k, 0x00);
    x = _mm_xor_si128(x, t);
    return (uint32_t)_mm_extract_epi32(x, 1);
}

/* 128-bit engine.  Requires len >= 64; `c` is the running (inverted) CRC. */
RMQ_INLINE_CLMUL uint32_t rmq_crc32_clmul_impl(uint32_t c, unsigned char *dst, const unsigned char *src,
                                               size_t len, const int copy)
{
    __m128i k, x0, x1, x2, x3, y0, y1, y2, y3;

    x0 = _mm_loadu_si128((const __m128i *)(src + 0));
    x1 = _mm_loadu_si128((const __m128i *)(src + 16));
    x2 = _mm_loadu_si128((const __m128i *)(src + 32));
    x3 = _mm_loadu_si128((const __m128i *)(src + 48));
    if (copy) {
        _mm_storeu_si128((__m128i *)(dst + 0), x0);
        _mm_storeu_si128((__m128i *)(dst + 16), x1);
        _mm_storeu_si128((__m128i *)(dst + 32), x2);
        _mm_storeu_si128((__m128i *)(dst + 48), x3);
        dst += 64;
    }
    x0 = _mm_xor_si128(x0, _mm_cvtsi32_si128((int)c)); /* the CRC so far */
    src += 64;
    len -= 64;

    /* Four independent accumulators, each folded over the next 64 bytes. */
    k = RMQ_K_F512;
    while (len >= 64) {
        y0 = _mm_loadu_si128((const __m128i *)(src + 0));
        y1 = _mm_loadu_si128((const __m128i *)(src + 16));
        y2 = _mm_loadu_si128((const __m128i *)(src + 32));
        y3 = _mm_loadu_si128((const __m128i *)(src + 48));
        if (copy) {
            _mm_storeu_si128((__m128i *)(dst + 0), y0);
            _mm_storeu_si128((__m128i *)(dst + 16), y1);
            _mm_storeu_si128((__m128i *)(dst + 32), y2);
            _mm_storeu_si128((__m128i *)(dst + 48), y3);
            dst += 64;
        }
        x0 = _mm_xor_si128(RMQ_FOLD(x0, k), y0);
        x1 = _mm_xor_si128(RMQ_FOLD(x1, k), y1);
        x2 = _mm_xor_si128(RMQ_FOLD(x2, k), y2);
        x3 = _mm_xor_si128(RMQ_FOLD(x3, k), y3);
        src += 64;
        len -= 64;
    }

    /* 4 x 128 -> 128, then the remaining bytes. */
    k = RMQ_K_F128;
    x0 = _mm_xor_si128(RMQ_FOLD(x0, k), x1);
    x0 = _mm_xor_si128(RMQ_FOLD(x0, k), x2);
    x0 = _mm_xor_si128(RMQ_FOLD(x0, k), x3);
    return rmq_crc32_fin128(x0, dst, src, len, copy);
}

RMQ_TARGET_CLMUL static uint32_t rmq_crc32_clmul(uint32_t c, const unsigned char *buf, size_t len)
{
    return rmq_crc32_clmul_impl(c, NULL, buf, len, 0);
}

/* Short buffers, 16 <= len < 64: one 128-bit block then the shared tail fold
 * (about 3x faster than slicing-by-8 on record headers and property tails). */
RMQ_TARGET_CLMUL static uint32_t rmq_crc32_clmul_small(uint32_t c, const unsigned char *buf, size_t len)
{
    __m128i x = _mm_loadu_si128((const __m128i *)buf);
    x = _mm_xor_si128(x, _mm_cvtsi32_si128((int)c));
    return rmq_crc32_fin128(x, NULL, buf + 16, len - 16, 0);
}

RMQ_TARGET_CLMUL static uint32_t rmq_crc32_clmul_copy(uint32_t c, unsigned char *dst,
                                                      const unsigned char *src, size_t len)
{
    return rmq_crc32_clmul_impl(c, dst, src, len, 1);
}

/* a * b mod P with one carry-less multiply and a Barrett reduction. */
RMQ_INLINE_CLMUL uint32_t rmq_crc32_mulmodp_clmul(uint32_t a, uint32_t b)
{
    const __m128i mask32 = _mm_setr_epi32(-1, 0, -1, 0);
    const __m128i k = RMQ_K_BARRETT;
    /* The 63-bit product of two reflected 32-bit values, shifted up one bit,
     * is the reflected 64-bit product (bit i = coefficient of x^(63-i)):
     * exactly the W that the Barrett step of rmq_crc32_fin128 reduces. */
    __m128i w = _mm_clmulepi64_si128(_mm_cvtsi32_si128((int)a), _mm_cvtsi32_si128((int)b), 0x00);
    __m128i t;
    w = _mm_slli_epi64(w, 1);
    t = _mm_clmulepi64_si128(_mm_and_si128(w, mask32), k, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), k, 0x00);
    return (uint32_t)_mm_extract_epi32(_mm_xor_si128(w, t), 1);
}

/* crc * x^(8n) mod P, n < 2^32 - 1.  x^(8n) is the product of at most four
 * table entries, multiplied as a tree that does not involve crc, so a call
 * costs one multiply of latency on crc, and 1 (n < 256), 2 (n < 64 Ki) or 4
 * multiplies in all. */
RMQ_TARGET_CLMUL static uint32_t rmq_crc32_shift_clmul(uint32_t crc, uint32_t n)
{
    uint32_t p = rmq_crc32_x8n[0][n & 0xff];
    if (n >> 8) {
        p = rmq_crc32_mulmodp_clmul(p, rmq_crc32_x8n[1][(n >> 8) & 0xff]);
        if (n >> 16)
            p = rmq_crc32_mulmodp_clmul(
                p, rmq_crc32_mulmodp_clmul(rmq_crc32_x8n[2][(n >> 16) & 0xff], rmq_crc32_x8n[3][n >> 24]));
    }
    return rmq_crc32_mulmodp_clmul(crc, p);
}

#if RMQ_CRC32_V512
#define RMQ_INLINE_V512                                                                            \
    static inline __attribute__((always_inline,                                                   \
                                 target("pclmul,sse4.1,avx2,avx512f,avx512vl,vpclmulqdq")))
#define RMQ_TARGET_V512 __attribute__((target("pclmul,sse4.1,avx2,avx512f,avx512vl,vpclmulqdq")))

/* The same constants in all four 128-bit lanes. */
#define RMQ_K512(kd_minus, kd_plus) _mm512_broadcast_i32x4(_mm_set_epi64x((kd_minus), (kd_plus)))
/* a ^ b ^ c */
#define RMQ_XOR3(a, b, c) _mm512_ternarylogic_epi64((a), (b), (c), 0x96)
/* fold every lane of x forward (by k) and add y */
#define RMQ_FOLD512(x, k, y) \
    RMQ_XOR3(_mm512_clmulepi64_epi128((x), (k), 0x00), _mm512_clmulepi64_epi128((x), (k), 0x11), (y))

/* 512-bit engine.  Requires len >= 64; `c` is the running (inverted) CRC. */
RMQ_INLINE_V512 uint32_t rmq_crc32_v512_impl(uint32_t c, unsigned char *dst, const unsigned char *src,
                                             size_t len, const int copy)
{
    __m512i k, x0, x1, x2, x3, y0, y1, y2, y3;
    __m256i h;
    __m128i x;

    x0 = _mm512_loadu_si512((const void *)src);
    if (copy)
        _mm512_storeu_si512((void *)dst, x0);
    x0 = _mm512_xor_si512(x0, _mm512_inserti32x4(_mm512_setzero_si512(), _mm_cvtsi32_si128((int)c), 0));

    if (len >= 256) {
        x1 = _mm512_loadu_si512((const void *)(src + 64));
        x2 = _mm512_loadu_si512((const void *)(src + 128));
        x3 = _mm512_loadu_si512((const void *)(src + 192));
        if (copy) {
            _mm512_storeu_si512((void *)(dst + 64), x1);
            _mm512_storeu_si512((void *)(dst + 128), x2);
            _mm512_storeu_si512((void *)(dst + 192), x3);
            dst += 256;
        }
        src += 256;
        len -= 256;

        /* Four zmm = 16 independent 128-bit accumulators, 256 bytes apart. */
        k = RMQ_K512(0x1322D1430LL, 0x11542778ALL); /* D = 2048 */
        while (len >= 256) {
            y0 = _mm512_loadu_si512((const void *)(src + 0));
            y1 = _mm512_loadu_si512((const void *)(src + 64));
            y2 = _mm512_loadu_si512((const void *)(src + 128));
            y3 = _mm512_loadu_si512((const void *)(src + 192));
            if (copy) {
                _mm512_storeu_si512((void *)(dst + 0), y0);
                _mm512_storeu_si512((void *)(dst + 64), y1);
                _mm512_storeu_si512((void *)(dst + 128), y2);
                _mm512_storeu_si512((void *)(dst + 192), y3);
                dst += 256;
            }
            x0 = RMQ_FOLD512(x0, k, y0);
            x1 = RMQ_FOLD512(x1, k, y1);
            x2 = RMQ_FOLD512(x2, k, y2);
            x3 = RMQ_FOLD512(x3, k, y3);
            src += 256;
            len -= 256;
        }

        /* 4 zmm -> 1: x0, x1, x2 folded onto x3 (1536, 1024, 512 bits). */
        k = RMQ_K512(0x12E958AC4LL, 0x1821D8BC0LL);
        x0 = RMQ_FOLD512(x0, k, x3);
        k = RMQ_K512(0x14A7FE880LL, 0x1E88EF372LL);
        x0 = RMQ_XOR3(x0, _mm512_clmulepi64_epi128(x1, k, 0x00), _mm512_clmulepi64_epi128(x1, k, 0x11));
        k = RMQ_K512(0x1C6E41596LL, 0x154442BD4LL);
        x0 = RMQ_XOR3(x0, _mm512_clmulepi64_epi128(x2, k, 0x00), _mm512_clmulepi64_epi128(x2, k, 0x11));
    } else {
        if (copy)
            dst += 64;
        src += 64;
        len -= 64;
    }

    /* Then 64 bytes at a time. */
    k = RMQ_K512(0x1C6E41596LL, 0x154442BD4LL); /* D = 512 */
    while (len >= 64) {
        y0 = _mm512_loadu_si512((const void *)src);
        if (copy) {
            _mm512_storeu_si512((void *)dst, y0);
            dst += 64;
        }
        x0 = RMQ_FOLD512(x0, k, y0);
        src += 64;
        len -= 64;
    }

    /* 512 -> 128: lanes 0, 1, 2 folded onto lane 3 (384, 256, 128 bits);
     * lane 3's constants are 0, and it is added back in unchanged. */
    k = _mm512_set_epi64(0, 0, 0x0CCAA009ELL, 0x1751997D0LL, 0x15A546366LL, 0x0F1DA05AALL, 0x174359406LL,
                         0x03DB1ECDCLL);
    x0 = RMQ_XOR3(_mm512_clmulepi64_epi128(x0, k, 0x00), _mm512_clmulepi64_epi128(x0, k, 0x11),
                  _mm512_maskz_mov_epi64(0xC0, x0));
    h = _mm256_xor_si256(_mm512_castsi512_si256(x0), _mm512_extracti64x4_epi64(x0, 1));
    x = _mm_xor_si128(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    return rmq_crc32_fin128(x, dst, src, len, copy);
}

RMQ_TARGET_V512 static uint32_t rmq_crc32_v512(uint32_t c, const unsigned char *buf, size_t len)
{
    return rmq_crc32_v512_impl(c, NULL, buf, len, 0);
}

RMQ_TARGET_V512 static uint32_t rmq_crc32_v512_copy(uint32_t c, unsigned char *dst,
                                                    const unsigned char *src, size_t len)
{
    return rmq_crc32_v512_impl(c, dst, src, len, 1);
}

#undef RMQ_INLINE_V512
#undef RMQ_TARGET_V512
#undef RMQ_K512
#undef RMQ_XOR3
#undef RMQ_FOLD512
#endif /* RMQ_CRC32_V512 */

#undef RMQ_FOLD
#undef RMQ_K_F512
#undef RMQ_K_F128
#undef RMQ_K_F96
#undef RMQ_K_BARRETT
#undef RMQ_INLINE_CLMUL
#undef RMQ_TARGET_CLMUL
#endif /* RMQ_CRC32_X86 */

/* ------------------------------------------------------------------------ */
/* Public API.                                                              */

/* Same contract as zlib's crc32(crc, buf, len): pass 0 to start. */
static uint32_t rmq_crc32(uint32_t crc, const unsigned char *buf, size_t len)
{
    RMQ_CRC32_ENSURE();
#if RMQ_CRC32_X86
    if (len >= 64 && rmq_crc32_engine_cur != RMQ_CRC32_ENGINE_TABLE) {
#if RMQ_CRC32_V512
        if (len >= RMQ_CRC32_V512_MIN && rmq_crc32_engine_cur == RMQ_CRC32_ENGINE_VPCLMUL)
            return ~rmq_crc32_v512(~crc, buf, len);
#endif
        return ~rmq_crc32_clmul(~crc, buf, len);
    }
    if (len >= 16 && rmq_crc32_engine_cur != RMQ_CRC32_ENGINE_TABLE)
        return ~rmq_crc32_clmul_small(~crc, buf, len);
#endif
    return ~rmq_crc32_slice8(~crc, buf, len);
}

/*
 * memcpy(dst, src, len) and return rmq_crc32(crc, src, len), reading src
 * once: each 64-byte block is loaded, stored to dst (unaligned stores) and
 * folded.  No alignment requirement on either pointer.  dst and src must not
 * overlap (as for memcpy).  Every byte of dst[0..len) is written (some bytes
 * of the last 64 may be written twice, with the same value); nothing outside
 * dst[0..len) is touched.
 */
static uint32_t rmq_crc32_copy(uint32_t crc, unsigned char *dst, const unsigned char *src, size_t len)
{
    RMQ_CRC32_ENSURE();
#if RMQ_CRC32_X86
    if (len >= 64 && rmq_crc32_engine_cur != RMQ_CRC32_ENGINE_TABLE) {
#if RMQ_CRC32_V512
        if (len >= RMQ_CRC32_V512_MIN && rmq_crc32_engine_cur == RMQ_CRC32_ENGINE_VPCLMUL)
            return ~rmq_crc32_v512_copy(~crc, dst, src, len);
#endif
        return ~rmq_crc32_clmul_copy(~crc, dst, src, len);
    }
#endif
    if (len)
        memcpy(dst, src, len);
    return ~rmq_crc32_slice8(~crc, src, len);
}

/* crc * x^(8*len) mod P (reflected), with len taken as 0 if negative: the
 * CRC-register part of zlib's crc32_combine, so that
 *     rmq_crc32_combine(crc1, crc2, len2) == rmq_crc32_shift(crc1, len2) ^ crc2.
 * A few ns with PCLMULQDQ (one to four multiplies mod P). */
static uint32_t rmq_crc32_shift(uint32_t crc, int64_t len)
{
    uint64_t n;
    uint32_t p;
    unsigned k;
    RMQ_CRC32_ENSURE();
    if (len <= 0)
        return crc;
    n = (uint64_t)len;
    if (n >= 0xFFFFFFFFu)
        n %= 0xFFFFFFFFu; /* x^(2^32 - 1) == 1 mod P */
#if RMQ_CRC32_X86
    if (rmq_crc32_engine_cur != RMQ_CRC32_ENGINE_TABLE)
        return rmq_crc32_shift_clmul(crc, (uint32_t)n);
#endif
    p = rmq_crc32_multmodp(crc, rmq_crc32_x8n[0][n & 0xff]);
    for (k = 1; k < 4; k++)
        if ((n >> (8 * k)) & 0xff)
            p = rmq_crc32_multmodp(p, rmq_crc32_x8n[k][(n >> (8 * k)) & 0xff]);
    return p;
}

/* CRC of A+B from crc1 = crc(A), crc2 = crc(B) and len2 = len(B) (zlib's
 * crc32_combine).  A negative len2 is taken as 0. */
static uint32_t rmq_crc32_combine(uint32_t crc1, uint32_t crc2, int64_t len2)
{
    /* crc(A+B) = crc(A) * x^(8*len2) + crc(B) mod P; the pre/post inversions
     * cancel out. */
    return rmq_crc32_shift(crc1, len2) ^ crc2;
}

/* RocketMQ's UtilAll.crc32(byte[]): the CRC masked to a non-negative int. */
static int32_t rmq_crc32_java(const unsigned char *buf, size_t len)
{
    return (int32_t)(rmq_crc32(0, buf, len) & 0x7FFFFFFFu);
}

#endif /* RMQ_CRC32_H */
