// Activation backward in one launch, compiled with NVRTC (kernel.py), in place of
// cudnnActivationBackward in the fast engine (the slides engine calls cuDNN):
//
//   dx = alpha·g + beta·dx        g = f'·dy, from x, y and dy (count values each), as the host backend:
//     mode 0 sigmoid       g = dy·y·(1 − y)
//     mode 1 relu          g = dy·[x > 0]
//     mode 2 tanh          g = dy·(1 − y·y)
//     mode 3 clipped relu  g = dy·[0 < x < coef]
//     mode 4 elu           g = x > 0 ? dy : dy·(y + coef)
//
// Modes are cudnnActivationMode_t's. Only what a mode needs is read (relu and clipped relu: x and dy;
// sigmoid and tanh: y and dy). Where the activation ran fused into the layer before, x is y: every
// test of x > 0 or x < coef reads the same from y. With beta == 0, dx is not read (a NaN there does
// not survive). [x > 0] is multiplied, not selected: a NaN or infinite dy gives NaN where x <= 0; a
// NaN x counts as x <= 0. Every step is rounded on its own (no fused multiply-add), as NumPy rounds.
// Under math "bf16", where the next layer's GEMM or convolution reads dx, dx16 (else null) receives
// bf16(dx) too, rounded as kernels/bf16.cu's to_bf16 rounds, so that no conversion pass reads dx again.
//
//   activation_backward:     one value a thread and grid-stride step
//   activation_backward_x4:  four (float4 loads and stores; x, y, dy, dx 16-byte aligned, dx16 8-byte)

#include "half.cuh"  // bf16_bits: the rounding of bf16.cu's to_bf16

template <int MODE>
__device__ __forceinline__ float gradient(float x, float y, float dy, float coef) {
    if (MODE == 0) return __fmul_rn(__fmul_rn(dy, y), __fsub_rn(1.f, y));
    if (MODE == 1) return __fmul_rn(dy, x > 0.f ? 1.f : 0.f);
    if (MODE == 2) return __fmul_rn(dy, __fsub_rn(1.f, __fmul_rn(y, y)));
    if (MODE == 3) return __fmul_rn(dy, x > 0.f && x < coef ? 1.f : 0.f);
    return x > 0.f ? dy : __fmul_rn(dy, __fadd_rn(y, coef));
}

template <int MODE>
__device__ __forceinline__ float blended(float x, float y, float dy, float old, float coef, float alpha, float beta) {
    const float routed = __fmul_rn(alpha, gradient<MODE>(x, y, dy, coef));
    return beta == 0.f ? routed : __fadd_rn(__fmul_rn(beta, old), routed);
}

__device__ constexpr bool reads_x(int mode) { return mode == 1 || mode == 3 || mode == 4; }
__device__ constexpr bool reads_y(int mode) { return mode == 0 || mode == 2 || mode == 4; }

template <int MODE>
__device__ void backward(float* dx, const float* __restrict__ x, const float* __restrict__ y,
                         const float* __restrict__ dy, float coef, float alpha, float beta, long long count,
                         unsigned short* dx16) {
    for (long long i = (long long)blockIdx.x * BLOCK_SIZE + threadIdx.x; i < count; i += (long long)gridDim.x * BLOCK_SIZE) {
        const float value = blended<MODE>(reads_x(MODE) ? x[i] : 0.f, reads_y(MODE) ? y[i] : 0.f, dy[i],
                                          beta == 0.f ? 0.f : dx[i], coef, alpha, beta);
        dx[i] = value;
        if (dx16) dx16[i] = (unsigned short)bf16_bits(value);
    }
}

template <int MODE>
__device__ void backward_x4(float4* dx, const float4* __restrict__ x, const float4* __restrict__ y,
                            const float4* __restrict__ dy, float coef, float alpha, float beta, long long count4,
                            uint2* dx16) {
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    for (long long i = (long long)blockIdx.x * BLOCK_SIZE + threadIdx.x; i < count4; i += (long long)gridDim.x * BLOCK_SIZE) {
        const float4 xs = reads_x(MODE) ? x[i] : zero, ys = reads_y(MODE) ? y[i] : zero, g = dy[i];
        const float4 old = beta == 0.f ? zero : dx[i];
        float4 value;
        value.x = blended<MODE>(xs.x, ys.x, g.x, old.x, coef, alpha, beta);
        value.y = blended<MODE>(xs.y, ys.y, g.y, old.y, coef, alpha, beta);
        value.z = blended<MODE>(xs.z, ys.z, g.z, old.z, coef, alpha, beta);
        value.w = blended<MODE>(xs.w, ys.w, g.w, old.w, coef, alpha, beta);
        dx[i] = value;
        if (dx16) {
            dx16[i] = make_uint2(bf16_bits(value.x) | (bf16_bits(value.y) << 16),
                                 bf16_bits(value.z) | (bf16_bits(value.w) << 16));
        }
    }
}

extern "C" __global__ void activation_backward(float* dx, const float* __restrict__ x, const float* __restrict__ y,
                                               const float* __restrict__ dy, int mode, float coef, float alpha,
                                               float beta, long long count, unsigned short* dx16) {
    switch (mode) {
        case 0: backward<0>(dx, x, y, dy, coef, alpha, beta, count, dx16); break;
        case 1: backward<1>(dx, x, y, dy, coef, alpha, beta, count, dx16); break;
        case 2: backward<2>(dx, x, y, dy, coef, alpha, beta, count, dx16); break;
        case 3: backward<3>(dx, x, y, dy, coef, alpha, beta, count, dx16); break;
        default: backward<4>(dx, x, y, dy, coef, alpha, beta, count, dx16); break;
    }
}

extern "C" __global__ void activation_backward_x4(float4* dx, const float4* __restrict__ x,
                                                  const float4* __restrict__ y, const float4* __restrict__ dy,
                                                  int mode, float coef, float alpha, float beta, long long count4,
                                                  uint2* dx16) {
    switch (mode) {
        case 0: backward_x4<0>(dx, x, y, dy, coef, alpha, beta, count4, dx16); break;
        case 1: backward_x4<1>(dx, x, y, dy, coef, alpha, beta, count4, dx16); break;
        case 2: backward_x4<2>(dx, x, y, dy, coef, alpha, beta, count4, dx16); break;
        case 3: backward_x4<3>(dx, x, y, dy, coef, alpha, beta, count4, dx16); break;
        default: backward_x4<4>(dx, x, y, dy, coef, alpha, beta, count4, dx16); break;
    }
}
