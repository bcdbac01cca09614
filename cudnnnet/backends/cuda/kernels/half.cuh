// float32 -> 16 bits and back, the one copy every kernel that writes a 16-bit value includes
// (#include "half.cuh"; kernel.py puts this text in its place before NVRTC compiles the file, so
// that a cached cubin's name covers it too). The host backend mirrors both roundings
// (backends/host: round_to_bf16, round_to_fp16).
//
//   bf16_bits:   the nearest bfloat16, ties to even: add 0x7FFF plus the lowest kept bit, keep the
//                high 16 bits; a NaN stays a (quiet) NaN with its sign; infinities and values past
//                the largest bfloat16 become ±infinity, as __float2bfloat16_rn does.
//   fp16_bits:   the nearest IEEE half, ties to even (PTX cvt.rn.f16.f32): past 65504 (rounding up
//                from 65520) ±infinity, subnormal halves kept, a NaN stays a NaN.
//   fp16_value:  the float of a half's bits (cvt.f32.f16), exact.
//   half_value, half_bits: a 16-bit activation's value and rounding by its format (HalfFormat.kernel_code
//                in low_precision.py): 1 bfloat16, 2 IEEE half.

__device__ __forceinline__ unsigned int bf16_bits(float value) {
    const unsigned int bits = __float_as_uint(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (bits >> 16) | 0x0040u;  // NaN: quiet, sign kept
    return (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
}

__device__ __forceinline__ unsigned int fp16_bits(float value) {
    unsigned short half;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(half) : "f"(value));
    return half;
}

__device__ __forceinline__ float fp16_value(unsigned short half) {
    float value;
    asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(half));
    return value;
}

__device__ __forceinline__ float half_value(unsigned short bits, int format) {
    return format == 1 ? __uint_as_float((unsigned int)bits << 16) : fp16_value(bits);
}

__device__ __forceinline__ unsigned short half_bits(float value, int format) {
    return (unsigned short)(format == 1 ? bf16_bits(value) : fp16_bits(value));
}
