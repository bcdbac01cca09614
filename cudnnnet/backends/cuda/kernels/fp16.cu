// float32 <-> IEEE half for ``math: fp16``, compiled with NVRTC (kernel.py); low_precision.py launches
// them around each cublasGemmEx and cuDNN convolution, whose operands are half copies of our float32
// tensors, as bf16.cu does for ``math: bf16``.
//
//   to_fp16:        out[i] = half(in[i])                          round to nearest, ties to even
//   to_fp16_x4:     the same, four values a thread (in 16-byte aligned: float4 loads, 8-byte stores)
//   fp16_to_float:  out[i] = alpha·float(in[i]) + beta·out[i]     (out not read where beta == 0)
//
// The conversions are half.cuh's fp16_bits and fp16_value. The host backend rounds the same way
// (backends/host: round_to_fp16), so an overflow gives infinity on both, which dynamic loss scaling
// (loss_scale.cu) then finds.

#include "half.cuh"

extern "C" __global__ void to_fp16(unsigned short* out, const float* __restrict__ in, long long count) {
    for (long long i = (long long)blockIdx.x * BLOCK_SIZE + threadIdx.x; i < count; i += (long long)gridDim.x * BLOCK_SIZE) {
        out[i] = (unsigned short)fp16_bits(in[i]);
    }
}

extern "C" __global__ void to_fp16_x4(uint2* out, const float4* __restrict__ in, long long count4) {
    for (long long i = (long long)blockIdx.x * BLOCK_SIZE + threadIdx.x; i < count4; i += (long long)gridDim.x * BLOCK_SIZE) {
        const float4 v = in[i];
        out[i] = make_uint2(fp16_bits(v.x) | (fp16_bits(v.y) << 16), fp16_bits(v.z) | (fp16_bits(v.w) << 16));
    }
}

extern "C" __global__ void fp16_to_float(float* out, const unsigned short* __restrict__ in, float alpha, float beta,
                                         long long count) {
    for (long long i = (long long)blockIdx.x * BLOCK_SIZE + threadIdx.x; i < count; i += (long long)gridDim.x * BLOCK_SIZE) {
        const float value = __fmul_rn(alpha, fp16_value(in[i]));
        out[i] = beta == 0.f ? value : __fadd_rn(__fmul_rn(beta, out[i]), value);
    }
}
