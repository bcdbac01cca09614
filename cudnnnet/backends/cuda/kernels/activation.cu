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

// activation_backward16: x, y, dy and dx 16-bit (a 16-bit multilayer perceptron's, format 1 bfloat16
// or 2 IEEE half), g computed in float from their stored values and dx rounded once; one value a thread.
template <int MODE>
__device__ void backward16(unsigned short* dx, const unsigned short* __restrict__ x,
                           const unsigned short* __restrict__ y, const unsigned short* __restrict__ dy, float coef,
                           float alpha, float beta, long long count, int format) {
    for (long long i = (long long)blockIdx.x * BLOCK_SIZE + threadIdx.x; i < count; i += (long long)gridDim.x * BLOCK_SIZE) {
        const float value = blended<MODE>(reads_x(MODE) ? half_value(x[i], format) : 0.f,
                                          reads_y(MODE) ? half_value(y[i], format) : 0.f, half_value(dy[i], format),
                                          beta == 0.f ? 0.f : half_value(dx[i], format), coef, alpha, beta);
        dx[i] = half_bits(value, format);
    }
}

extern "C" __global__ void activation_backward16(unsigned short* dx, const unsigned short* __restrict__ x,
                                                 const unsigned short* __restrict__ y,
                                                 const unsigned short* __restrict__ dy, int mode, float coef,
                                                 float alpha, float beta, long long count, int format) {
    switch (mode) {
        case 0: backward16<0>(dx, x, y, dy, coef, alpha, beta, count, format); break;
        case 1: backward16<1>(dx, x, y, dy, coef, alpha, beta, count, format); break;
        case 2: backward16<2>(dx, x, y, dy, coef, alpha, beta, count, format); break;
        case 3: backward16<3>(dx, x, y, dy, coef, alpha, beta, count, format); break;
        default: backward16<4>(dx, x, y, dy, coef, alpha, beta, count, format); break;
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

// The activation fused after a Dense layer, with that layer's bias gradient in the same pass:
//
//   dx = f'(y)·dy                     f' read from y (x is y), alpha 1, beta 0, as above
//   partial[s][c] = Σ_{n in slab s} dx[n][c]
//
// dx, y, dy (N, C) with C contiguous; a block takes BLOCK_SIZE columns of one slab of slab_rows
// samples (block b: columns (b mod column_blocks)·BLOCK_SIZE on, slab b / column_blocks), so every
// warp reads whole runs of a row. A column is a channel (activation_bias_backward) or four
// (activation_bias_backward_x4: C a multiple of 4, float4 loads and stores, dx16 8-byte aligned).
// A thread loads ROWS_AHEAD rows before it computes and stores them (dx, y, dy and dx16 never
// overlap), so that many loads are in flight. The sum is in sample order within a slab, and
// activation_bias_sums adds the slabs in a fixed order: db has the same bits on every launch. With
// one slab, partial is db itself.
#define ROWS_AHEAD 4

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
    return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w));
}

template <int MODE>
__device__ __forceinline__ float4 gradient4(float4 y, float4 dy, float coef) {
    return make_float4(gradient<MODE>(y.x, y.x, dy.x, coef), gradient<MODE>(y.y, y.y, dy.y, coef),
                       gradient<MODE>(y.z, y.z, dy.z, coef), gradient<MODE>(y.w, y.w, dy.w, coef));
}

__device__ __forceinline__ void store_bf16(unsigned short* __restrict__ dx16, long long i, float value) {
    dx16[i] = (unsigned short)bf16_bits(value);
}

__device__ __forceinline__ void store_bf16(uint2* __restrict__ dx16, long long i, float4 value) {
    dx16[i] = make_uint2(bf16_bits(value.x) | (bf16_bits(value.y) << 16), bf16_bits(value.z) | (bf16_bits(value.w) << 16));
}

__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float4 add(float4 a, float4 b) { return add4(a, b); }
template <int MODE> __device__ __forceinline__ float grad(float y, float dy, float coef) { return gradient<MODE>(y, y, dy, coef); }
template <int MODE> __device__ __forceinline__ float4 grad(float4 y, float4 dy, float coef) { return gradient4<MODE>(y, dy, coef); }

// T is float (Half16 unsigned short) or float4 (Half16 uint2); columns are T's.
template <int MODE, typename T, typename Half16>
__device__ void backward_summed(T* __restrict__ dx, const T* __restrict__ y, const T* __restrict__ dy, float coef,
                                int samples, int columns, int slab_rows, T* __restrict__ partial,
                                Half16* __restrict__ dx16, T zero) {
    const int column_blocks = (columns + BLOCK_SIZE - 1) / BLOCK_SIZE;
    const int c = (blockIdx.x % column_blocks) * BLOCK_SIZE + threadIdx.x;
    const int slab = blockIdx.x / column_blocks;
    if (c >= columns) return;
    const int first = slab * slab_rows, last = min(samples, first + slab_rows);
    T sum = zero;
    for (int n = first; n < last; n += ROWS_AHEAD) {
        T ys[ROWS_AHEAD], gs[ROWS_AHEAD];
#pragma unroll
        for (int k = 0; k < ROWS_AHEAD; ++k) {
            const long long i = (long long)(n + k) * columns + c;
            ys[k] = n + k < last ? y[i] : zero;
            gs[k] = n + k < last ? dy[i] : zero;
        }
#pragma unroll
        for (int k = 0; k < ROWS_AHEAD; ++k) {
            if (n + k >= last) break;
            const long long i = (long long)(n + k) * columns + c;
            const T value = grad<MODE>(ys[k], gs[k], coef);
            dx[i] = value;
            if (dx16) store_bf16(dx16, i, value);
            sum = add(sum, value);
        }
    }
    partial[(long long)slab * columns + c] = sum;
}

#define SUMMED_MODES(T, Half16, zero)                                                                            \
    switch (mode) {                                                                                            \
        case 0: backward_summed<0, T, Half16>(dx, y, dy, coef, samples, columns, slab_rows, partial, dx16, zero); break; \
        case 1: backward_summed<1, T, Half16>(dx, y, dy, coef, samples, columns, slab_rows, partial, dx16, zero); break; \
        case 2: backward_summed<2, T, Half16>(dx, y, dy, coef, samples, columns, slab_rows, partial, dx16, zero); break; \
        case 3: backward_summed<3, T, Half16>(dx, y, dy, coef, samples, columns, slab_rows, partial, dx16, zero); break; \
        default: backward_summed<4, T, Half16>(dx, y, dy, coef, samples, columns, slab_rows, partial, dx16, zero); break; \
    }

extern "C" __global__ void activation_bias_backward(float* dx, const float* __restrict__ y,
                                                    const float* __restrict__ dy, int mode, float coef, int samples,
                                                    int columns, int slab_rows, float* partial, unsigned short* dx16) {
    SUMMED_MODES(float, unsigned short, 0.f)
}

extern "C" __global__ void activation_bias_backward_x4(float4* dx, const float4* __restrict__ y,
                                                       const float4* __restrict__ dy, int mode, float coef,
                                                       int samples, int columns, int slab_rows, float4* partial,
                                                       uint2* dx16) {
    SUMMED_MODES(float4, uint2, make_float4(0.f, 0.f, 0.f, 0.f))
}

// activation_bias_backward16: y, dy and dx 16-bit (format 1 bfloat16, 2 IEEE half), one channel a
// thread, as above: dx = f'(y)·dy computed in float and stored rounded once; the partial sums add
// the float values before their rounding, as the host's oracle does.
template <int MODE>
__device__ void backward_summed16(unsigned short* __restrict__ dx, const unsigned short* __restrict__ y,
                                  const unsigned short* __restrict__ dy, float coef, int samples, int columns,
                                  int slab_rows, float* __restrict__ partial, int format) {
    const int column_blocks = (columns + BLOCK_SIZE - 1) / BLOCK_SIZE;
    const int c = (blockIdx.x % column_blocks) * BLOCK_SIZE + threadIdx.x;
    const int slab = blockIdx.x / column_blocks;
    if (c >= columns) return;
    const int first = slab * slab_rows, last = min(samples, first + slab_rows);
    float sum = 0.f;
    for (int n = first; n < last; n += ROWS_AHEAD) {
        unsigned short ys[ROWS_AHEAD], gs[ROWS_AHEAD];
#pragma unroll
        for (int k = 0; k < ROWS_AHEAD; ++k) {
            const long long i = (long long)(n + k) * columns + c;
            ys[k] = n + k < last ? y[i] : 0;
            gs[k] = n + k < last ? dy[i] : 0;
        }
#pragma unroll
        for (int k = 0; k < ROWS_AHEAD; ++k) {
            if (n + k >= last) break;
            const float value = grad<MODE>(half_value(ys[k], format), half_value(gs[k], format), coef);
            dx[(long long)(n + k) * columns + c] = half_bits(value, format);
            sum = __fadd_rn(sum, value);
        }
    }
    partial[(long long)slab * columns + c] = sum;
}

extern "C" __global__ void activation_bias_backward16(unsigned short* dx, const unsigned short* __restrict__ y,
                                                      const unsigned short* __restrict__ dy, int mode, float coef,
                                                      int samples, int columns, int slab_rows, float* partial,
                                                      int format) {
    switch (mode) {
        case 0: backward_summed16<0>(dx, y, dy, coef, samples, columns, slab_rows, partial, format); break;
        case 1: backward_summed16<1>(dx, y, dy, coef, samples, columns, slab_rows, partial, format); break;
        case 2: backward_summed16<2>(dx, y, dy, coef, samples, columns, slab_rows, partial, format); break;
        case 3: backward_summed16<3>(dx, y, dy, coef, samples, columns, slab_rows, partial, format); break;
        default: backward_summed16<4>(dx, y, dy, coef, samples, columns, slab_rows, partial, format); break;
    }
}

// db[c] = Σ_s partial[s][c]. A block takes 32 channels (a warp's run of a row) with BLOCK_SIZE / 32
// lanes each: lane l adds slabs l, l + lanes, … in order, then lane 0 adds the lanes' sums in order.
extern "C" __global__ void activation_bias_sums(float* __restrict__ db, const float* __restrict__ partial, int slabs,
                                                int channels) {
    constexpr int LANES = BLOCK_SIZE / 32;
    __shared__ float lane_sums[LANES][32];
    const int c = blockIdx.x * 32 + threadIdx.x % 32, lane = threadIdx.x / 32;
    float sum = 0.f;
    if (c < channels) {
        for (int s = lane; s < slabs; s += LANES) sum = __fadd_rn(sum, partial[(long long)s * channels + c]);
    }
    lane_sums[lane][threadIdx.x % 32] = sum;
    __syncthreads();
    if (lane == 0 && c < channels) {
        float total = 0.f;
        for (int l = 0; l < LANES; ++l) total = __fadd_rn(total, lane_sums[l][threadIdx.x]);
        db[c] = total;
    }
}

// activation_bias_backward16_x8: as activation_bias_backward16, eight channels a thread (C a multiple
// of 8; dx, y, dy and partial 16-byte aligned): one 16-byte load of y and of dy and one store of dx a
// row, eight running sums, each channel's in sample order as in the one-channel kernel (the same bits).
template <int MODE>
__device__ __forceinline__ unsigned int gradient_pair(unsigned int y, unsigned int dy, float coef, int format,
                                                      float& sum_low, float& sum_high) {
    const float low = grad<MODE>(half_value((unsigned short)(y & 0xffffu), format),
                                 half_value((unsigned short)(dy & 0xffffu), format), coef);
    const float high = grad<MODE>(half_value((unsigned short)(y >> 16), format),
                                  half_value((unsigned short)(dy >> 16), format), coef);
    sum_low = __fadd_rn(sum_low, low);
    sum_high = __fadd_rn(sum_high, high);
    return (unsigned int)half_bits(low, format) | ((unsigned int)half_bits(high, format) << 16);
}

template <int MODE>
__device__ void backward_summed16_x8(uint4* __restrict__ dx, const uint4* __restrict__ y,
                                     const uint4* __restrict__ dy, float coef, int samples, int columns8,
                                     int slab_rows, float4* __restrict__ partial, int format) {
    const int column_blocks = (columns8 + BLOCK_SIZE - 1) / BLOCK_SIZE;
    const int c = (blockIdx.x % column_blocks) * BLOCK_SIZE + threadIdx.x;
    const int slab = blockIdx.x / column_blocks;
    if (c >= columns8) return;
    const int first = slab * slab_rows, last = min(samples, first + slab_rows);
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    float sum[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int n = first; n < last; n += ROWS_AHEAD) {
        uint4 ys[ROWS_AHEAD], gs[ROWS_AHEAD];
#pragma unroll
        for (int k = 0; k < ROWS_AHEAD; ++k) {
            const long long i = (long long)(n + k) * columns8 + c;
            ys[k] = n + k < last ? y[i] : zero;
            gs[k] = n + k < last ? dy[i] : zero;
        }
#pragma unroll
        for (int k = 0; k < ROWS_AHEAD; ++k) {
            if (n + k >= last) break;
            dx[(long long)(n + k) * columns8 + c] = make_uint4(
                gradient_pair<MODE>(ys[k].x, gs[k].x, coef, format, sum[0], sum[1]),
                gradient_pair<MODE>(ys[k].y, gs[k].y, coef, format, sum[2], sum[3]),
                gradient_pair<MODE>(ys[k].z, gs[k].z, coef, format, sum[4], sum[5]),
                gradient_pair<MODE>(ys[k].w, gs[k].w, coef, format, sum[6], sum[7]));
        }
    }
    const long long at = (long long)slab * 2 * columns8 + 2 * c;  // float4s: slab · C / 4 + channel 8c / 4
    partial[at] = make_float4(sum[0], sum[1], sum[2], sum[3]);
    partial[at + 1] = make_float4(sum[4], sum[5], sum[6], sum[7]);
}

extern "C" __global__ void activation_bias_backward16_x8(uint4* dx, const uint4* __restrict__ y,
                                                         const uint4* __restrict__ dy, int mode, float coef,
                                                         int samples, int columns8, int slab_rows, float4* partial,
                                                         int format) {
    switch (mode) {
        case 0: backward_summed16_x8<0>(dx, y, dy, coef, samples, columns8, slab_rows, partial, format); break;
        case 1: backward_summed16_x8<1>(dx, y, dy, coef, samples, columns8, slab_rows, partial, format); break;
        case 2: backward_summed16_x8<2>(dx, y, dy, coef, samples, columns8, slab_rows, partial, format); break;
        case 3: backward_summed16_x8<3>(dx, y, dy, coef, samples, columns8, slab_rows, partial, format); break;
        default: backward_summed16_x8<4>(dx, y, dy, coef, samples, columns8, slab_rows, partial, format); break;
    }
}
