// float32 <-> bfloat16 for ``math: bf16``, compiled with NVRTC (kernel.py); low_precision.py launches
// them around each cublasGemmEx and cuDNN convolution, whose operands are bfloat16 copies of our
// float32 tensors. No library call converts an array, so the slides engine runs these too.
//
//   to_bf16:        out[i] = bf16(in[i])                          round to nearest, ties to even
//   to_bf16_x4:     the same, four values a thread (in 16-byte aligned: float4 loads, 8-byte stores)
//   bf16_to_float:  out[i] = alpha·float(in[i]) + beta·out[i]     (out not read where beta == 0)
//
// The rounding is half.cuh's bf16_bits, which the host backend mirrors (backends/host: round_to_bf16).

#include "half.cuh"

extern "C" __global__ void to_bf16(unsigned short* out, const float* __restrict__ in, long long count) {
    for (long long i = (long long)blockIdx.x * BLOCK_SIZE + threadIdx.x; i < count; i += (long long)gridDim.x * BLOCK_SIZE) {
        out[i] = (unsigned short)bf16_bits(in[i]);
    }
}

extern "C" __global__ void to_bf16_x4(uint2* out, const float4* __restrict__ in, long long count4) {
    for (long long i = (long long)blockIdx.x * BLOCK_SIZE + threadIdx.x; i < count4; i += (long long)gridDim.x * BLOCK_SIZE) {
        const float4 v = in[i];
        out[i] = make_uint2(bf16_bits(v.x) | (bf16_bits(v.y) << 16), bf16_bits(v.z) | (bf16_bits(v.w) << 16));
    }
}

extern "C" __global__ void bf16_to_float(float* out, const unsigned short* __restrict__ in, float alpha, float beta,
                                         long long count) {
    for (long long i = (long long)blockIdx.x * BLOCK_SIZE + threadIdx.x; i < count; i += (long long)gridDim.x * BLOCK_SIZE) {
        const float value = __fmul_rn(alpha, __uint_as_float((unsigned int)in[i] << 16));
        out[i] = beta == 0.f ? value : __fadd_rn(__fmul_rn(beta, out[i]), value);
    }
}
