/* Reduction kernels for every pycoll dtype and op, written as plain elementwise loops that the
 * compiler vectorises (no restrict: out may be a, and the compiler checks aliasing at run time).
 * On x86-64 each kernel is also built for x86-64-v3 (AVX2, F16C) and picked at load time.
 * float16 and bfloat16 are combined in float32. */
#include <complex.h>
#include <stdint.h>
#include <string.h>

#include "pycoll_native.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PC_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define PC_CLONES
#endif

typedef float _Complex c64_t;
typedef double _Complex c128_t;

/* ---- bfloat16 <-> float32, round to nearest even (as ml_dtypes) ---- */
static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#define MIN_(a, b) (((a) < (b) || (a) != (a)) ? (a) : (b))
#define MAX_(a, b) (((a) > (b) || (a) != (a)) ? (a) : (b))

/* out[i] = a[i] OP b[i] for one type */
#define BINARY(name, T, EXPR)                                                                   \
    PC_CLONES static void name(T *out, const T *a, const T *b,                                  \
                               size_t n) {                                                     \
        for (size_t i = 0; i < n; i++) {                                                       \
            T x = a[i], y = b[i];                                                              \
            out[i] = (EXPR);                                                                   \
        }                                                                                      \
    }

#define ARITH(T, S)                                                                             \
    BINARY(sum_##S, T, x + y)                                                                  \
    BINARY(prod_##S, T, x * y)                                                                 \
    BINARY(min_##S, T, MIN_(x, y))                                                             \
    BINARY(max_##S, T, MAX_(x, y))
#define BITS(T, S)                                                                              \
    BINARY(band_##S, T, x & y)                                                                 \
    BINARY(bor_##S, T, x | y)                                                                  \
    BINARY(bxor_##S, T, x ^ y)                                                                 \
    BINARY(land_##S, T, (T)((x != 0) && (y != 0)))                                             \
    BINARY(lor_##S, T, (T)((x != 0) || (y != 0)))                                              \
    BINARY(lxor_##S, T, (T)((x != 0) != (y != 0)))

ARITH(int8_t, i8) BITS(int8_t, i8)
ARITH(int16_t, i16) BITS(int16_t, i16)
ARITH(int32_t, i32) BITS(int32_t, i32)
ARITH(int64_t, i64) BITS(int64_t, i64)
ARITH(uint8_t, u8) BITS(uint8_t, u8)
ARITH(uint16_t, u16) BITS(uint16_t, u16)
ARITH(uint32_t, u32) BITS(uint32_t, u32)
ARITH(uint64_t, u64) BITS(uint64_t, u64)
ARITH(float, f32)
ARITH(double, f64)
BINARY(sum_c64, c64_t, x + y)
BINARY(prod_c64, c64_t, x * y)
BINARY(sum_c128, c128_t, x + y)
BINARY(prod_c128, c128_t, x * y)
/* bool: bytes holding 0 or 1 */
BINARY(and_b, uint8_t, (uint8_t)((x != 0) & (y != 0)))
BINARY(or_b, uint8_t, (uint8_t)((x != 0) | (y != 0)))
BINARY(xor_b, uint8_t, (uint8_t)((x != 0) ^ (y != 0)))

/* float16/bfloat16: in blocks through float32 */
#define HALF_BLOCK 256
#define HALF(NAME, LOAD, STORE, HT)                                                             \
    PC_CLONES static void NAME(int op, HT *restrict out, const HT *const *ins, int nin,        \
                               size_t n) {                                                     \
        float acc[HALF_BLOCK];                                                                 \
        for (size_t base = 0; base < n; base += HALF_BLOCK) {                                  \
            size_t m = n - base < HALF_BLOCK ? n - base : HALF_BLOCK;                          \
            const HT *p0 = ins[0] + base;                                                      \
            for (size_t i = 0; i < m; i++) acc[i] = LOAD(p0[i]);                               \
            for (int j = 1; j < nin; j++) {                                                    \
                const HT *p = ins[j] + base;                                                   \
                switch (op) {                                                                  \
                case PC_SUM: for (size_t i = 0; i < m; i++) acc[i] += LOAD(p[i]); break;       \
                case PC_PROD: for (size_t i = 0; i < m; i++) acc[i] *= LOAD(p[i]); break;      \
                case PC_MIN: for (size_t i = 0; i < m; i++) { float y = LOAD(p[i]);            \
                        acc[i] = MIN_(acc[i], y); } break;                                     \
                default: for (size_t i = 0; i < m; i++) { float y = LOAD(p[i]);                \
                        acc[i] = MAX_(acc[i], y); } break;                                     \
                }                                                                              \
            }                                                                                  \
            for (size_t i = 0; i < m; i++) out[base + i] = STORE(acc[i]);                      \
        }                                                                                      \
    }

#if defined(__FLT16_MAX__)
typedef _Float16 f16_t;
#define F16_LOAD(h) ((float)(h))
#define F16_STORE(f) ((f16_t)(f))
#else
#error "pycoll needs a compiler with _Float16 (GCC >= 12 or clang >= 15)"
#endif
HALF(half_f16, F16_LOAD, F16_STORE, f16_t)
HALF(half_bf16, bf16_to_f32, f32_to_bf16, uint16_t)

size_t pycoll_dtype_size(int dtype) {
    static const size_t sizes[PC_NDTYPES] = {1, 2, 4, 8, 1, 2, 4, 8, 2, 2, 4, 8, 8, 16, 1};
    return (dtype >= 0 && dtype < PC_NDTYPES) ? sizes[dtype] : 0;
}

typedef void (*bin_fn)(void *, const void *, const void *, size_t);

#define ROW_INT(S) {(bin_fn)sum_##S, (bin_fn)prod_##S, (bin_fn)min_##S, (bin_fn)max_##S,         \
                    (bin_fn)band_##S, (bin_fn)bor_##S, (bin_fn)bxor_##S, (bin_fn)land_##S,        \
                    (bin_fn)lor_##S, (bin_fn)lxor_##S}
#define ROW_FLT(S) {(bin_fn)sum_##S, (bin_fn)prod_##S, (bin_fn)min_##S, (bin_fn)max_##S,         \
                    0, 0, 0, 0, 0, 0}

static const bin_fn TABLE[PC_NDTYPES][PC_NOPS] = {
    ROW_INT(i8), ROW_INT(i16), ROW_INT(i32), ROW_INT(i64),
    ROW_INT(u8), ROW_INT(u16), ROW_INT(u32), ROW_INT(u64),
    {0}, {0}, /* half types go through float32 */
    ROW_FLT(f32), ROW_FLT(f64),
    {(bin_fn)sum_c64, (bin_fn)prod_c64, 0, 0, 0, 0, 0, 0, 0, 0},
    {(bin_fn)sum_c128, (bin_fn)prod_c128, 0, 0, 0, 0, 0, 0, 0, 0},
    {0, 0, (bin_fn)and_b, (bin_fn)or_b, (bin_fn)and_b, (bin_fn)or_b, (bin_fn)xor_b,
     (bin_fn)and_b, (bin_fn)or_b, (bin_fn)xor_b},
};

static int half_op_ok(int op) { return op == PC_SUM || op == PC_PROD || op == PC_MIN || op == PC_MAX; }

int pycoll_reduce(int op, int dtype, void *out, const void *a, const void *b, size_t n) {
    if (op < 0 || op >= PC_NOPS || dtype < 0 || dtype >= PC_NDTYPES) return PC_EINVAL;
    if (dtype == PC_FLOAT16 || dtype == PC_BFLOAT16) {
        if (!half_op_ok(op)) return PC_EINVAL;
        const void *ins[2] = {a, b};
        if (dtype == PC_FLOAT16) half_f16(op, out, (const f16_t *const *)ins, 2, n);
        else half_bf16(op, out, (const uint16_t *const *)ins, 2, n);
        return PC_OK;
    }
    bin_fn fn = TABLE[dtype][op];
    if (!fn) return PC_EINVAL;
    fn(out, a, b, n);
    return PC_OK;
}

int pycoll_reduce_n(int op, int dtype, void *out, const void *const *ins, int nin, size_t n) {
    if (nin < 1 || op < 0 || op >= PC_NOPS || dtype < 0 || dtype >= PC_NDTYPES) return PC_EINVAL;
    if (dtype == PC_FLOAT16 || dtype == PC_BFLOAT16) {
        if (!half_op_ok(op)) return PC_EINVAL;
        if (dtype == PC_FLOAT16) half_f16(op, out, (const f16_t *const *)ins, nin, n);
        else half_bf16(op, out, (const uint16_t *const *)ins, nin, n);
        return PC_OK;
    }
    bin_fn fn = TABLE[dtype][op];
    if (!fn) return PC_EINVAL;
    if (nin == 1) {
        if (out != ins[0]) memmove(out, ins[0], n * pycoll_dtype_size(dtype));
        return PC_OK;
    }
    fn(out, ins[0], ins[1], n);
    for (int j = 2; j < nin; j++) fn(out, out, ins[j], n);
    return PC_OK;
}
