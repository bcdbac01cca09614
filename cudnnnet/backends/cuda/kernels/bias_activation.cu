// y = f(y + b): a layer's bias and the activation after it in one pass, compiled with NVRTC
// (kernel.py). It replaces cudnnAddTensor (or the original's rank-1 cublasSgemm) followed by
// cudnnActivationForward: one read and one write of y instead of two of each.
//
// mode: cudnnActivationMode_t (0 sigmoid, 1 relu, 2 tanh, 3 clipped relu, 4 elu), or -1 for none;
// coef: the clipping threshold or ELU's alpha. b holds one value per channel. 32-bit indices: the
// backend checks that y holds fewer than 2^31 values. Under math "bf16", where the next layer's
// GEMM or convolution reads y, y16 (else null) receives bf16(y) too, rounded as kernels/bf16.cu's
// to_bf16 rounds, so that no conversion pass reads y again.
//   y (N, C, H, W), b (C), positions = H·W, y16 like y
// bias_activation_forward16 takes a 16-bit y (a 16-bit multilayer perceptron's activation, format 1
// bfloat16 or 2 IEEE half): f(y + b) computed in float from y's stored value, rounded once.

#include "half.cuh"  // bf16_bits: the rounding of bf16.cu's to_bf16

__device__ float activation(float x, int mode, float coef) {
    switch (mode) {
        case 0: return 1.f / (1.f + expf(-x));
        case 1: return fmaxf(x, 0.f);
        case 2: return tanhf(x);
        case 3: return fminf(fmaxf(x, 0.f), coef);
        case 4: return x > 0.f ? x : coef * expm1f(x);
        default: return x;
    }
}

// A row is one channel of one sample (``positions`` values sharing a bias) or, for a Dense
// layer's y (positions = 1), one sample's ``channels`` values. A block takes rows in groups of
// BLOCK_SIZE / width rows, ``width`` threads (32 to BLOCK_SIZE, a power of two) striding along
// each, so the bias index costs no division per value; each thread keeps UNROLL loads in flight.
#define UNROLL 4

extern "C" __global__ void bias_activation_forward(float* y, const float* b, int count, int channels,
                                                   int positions, int mode, float coef, unsigned short* y16) {
    const bool dense = positions == 1;
    const int row_length = dense ? channels : positions;
    const int rows = count / row_length;
    int width = 32;  // a power of two, so that it divides BLOCK_SIZE
    while (width < row_length && width < BLOCK_SIZE) width *= 2;
    const int rows_per_block = BLOCK_SIZE / width;
    const int lane = threadIdx.x % width;
    for (int row = blockIdx.x * rows_per_block + threadIdx.x / width; row < rows; row += gridDim.x * rows_per_block) {
        float* values = y + row * row_length;
        unsigned short* values16 = y16 ? y16 + row * row_length : nullptr;
        const float row_bias = dense ? 0.f : b[row % channels];
        for (int start = lane; start < row_length; start += UNROLL * width) {
            float loaded[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int j = start + u * width;
                loaded[u] = j < row_length ? values[j] + (dense ? b[j] : row_bias) : 0.f;
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int j = start + u * width;
                if (j < row_length) {
                    const float value = activation(loaded[u], mode, coef);
                    values[j] = value;
                    if (values16) values16[j] = (unsigned short)bf16_bits(value);
                }
            }
        }
    }
}

// The Dense case (positions = 1) when channels is a multiple of 4 and y and b are 16-byte aligned:
// y read as float4, one per thread and grid-stride step, so that every load is 16 bytes and no
// thread waits on a row loop. The bias index is (i mod channels/4): the 4 values of a float4 share
// a sample and take 4 consecutive biases.
extern "C" __global__ void bias_activation_forward_dense4(float4* y, const float4* b, int count4, int channels4,
                                                          int mode, float coef, uint2* y16) {
    for (int i = blockIdx.x * BLOCK_SIZE + threadIdx.x; i < count4; i += gridDim.x * BLOCK_SIZE) {
        float4 value = y[i];
        const float4 bias = b[i % channels4];
        value.x = activation(value.x + bias.x, mode, coef);
        value.y = activation(value.y + bias.y, mode, coef);
        value.z = activation(value.z + bias.z, mode, coef);
        value.w = activation(value.w + bias.w, mode, coef);
        y[i] = value;
        if (y16) {
            y16[i] = make_uint2(bf16_bits(value.x) | (bf16_bits(value.y) << 16),
                                bf16_bits(value.z) | (bf16_bits(value.w) << 16));
        }
    }
}

extern "C" __global__ void bias_activation_forward16(unsigned short* y, const float* b, int count, int channels,
                                                     int positions, int mode, float coef, int format) {
    for (int i = blockIdx.x * BLOCK_SIZE + threadIdx.x; i < count; i += gridDim.x * BLOCK_SIZE) {
        const float value = half_value(y[i], format) + b[(i / positions) % channels];
        y[i] = half_bits(activation(value, mode, coef), format);
    }
}

// bias_activation_forward16_dense8: a Dense layer's 16-bit y (N, C) with C a multiple of 8, y and b
// 16-byte aligned: eight values a thread, one 16-byte load and store, the bias as two float4s (the
// one-value kernel above reads y two bytes at a time). The same arithmetic as bias_activation_forward16.
__device__ __forceinline__ unsigned int bias_activation_pair(unsigned int pair, float bias_low, float bias_high,
                                                            int mode, float coef, int format) {
    const float low = activation(half_value((unsigned short)(pair & 0xffffu), format) + bias_low, mode, coef);
    const float high = activation(half_value((unsigned short)(pair >> 16), format) + bias_high, mode, coef);
    return (unsigned int)half_bits(low, format) | ((unsigned int)half_bits(high, format) << 16);
}

extern "C" __global__ void bias_activation_forward16_dense8(uint4* y, const float4* __restrict__ b, long long count8,
                                                            int channels8, int mode, float coef, int format) {
    for (long long i = (long long)blockIdx.x * BLOCK_SIZE + threadIdx.x; i < count8;
         i += (long long)gridDim.x * BLOCK_SIZE) {
        const uint4 packed = y[i];
        const long long column = i % channels8;
        const float4 low = b[2 * column], high = b[2 * column + 1];
        y[i] = make_uint4(bias_activation_pair(packed.x, low.x, low.y, mode, coef, format),
                          bias_activation_pair(packed.y, low.z, low.w, mode, coef, format),
                          bias_activation_pair(packed.z, high.x, high.y, mode, coef, format),
                          bias_activation_pair(packed.w, high.z, high.w, mode, coef, format));
    }
}

// bias_activation_forward16_spatial8: a convolution's 16-bit y (N, C, H, W) with H·W a multiple of 8,
// y 16-byte aligned: eight values of one channel a thread (one 16-byte load and store, one bias value,
// one division for the eight). The same arithmetic as bias_activation_forward16.
extern "C" __global__ void bias_activation_forward16_spatial8(uint4* y, const float* __restrict__ b,
                                                              long long count8, int channels, int positions8,
                                                              int mode, float coef, int format) {
    for (long long i = (long long)blockIdx.x * BLOCK_SIZE + threadIdx.x; i < count8;
         i += (long long)gridDim.x * BLOCK_SIZE) {
        const uint4 packed = y[i];
        const float bias = b[(i / positions8) % channels];
        y[i] = make_uint4(bias_activation_pair(packed.x, bias, bias, mode, coef, format),
                          bias_activation_pair(packed.y, bias, bias, mode, coef, format),
                          bias_activation_pair(packed.z, bias, bias, mode, coef, format),
                          bias_activation_pair(packed.w, bias, bias, mode, coef, format));
    }
}

// bias_activation_to_half: sgemm_bias_activation where cuBLASLt offers no algorithm for the epilogue.
// From the GEMM's float32 result acc (rows × count/rows, column-major, leading dimension rows), the
// epilogue's arithmetic: C₁₆ = h(f(acc + h(b))), the bias read rounded to C's 16 bits (format 1
// bfloat16, 2 IEEE half), the sum and f in float32, rounded once; C has leading dimension ldc.
extern "C" __global__ void bias_activation_to_half(unsigned short* c, const float* __restrict__ acc,
                                                   const float* __restrict__ b, int rows, int count, int ldc,
                                                   int mode, float coef, int format) {
    for (int i = blockIdx.x * BLOCK_SIZE + threadIdx.x; i < count; i += gridDim.x * BLOCK_SIZE) {
        const int row = i % rows, column = i / rows;
        const float bias = half_value(half_bits(b[row], format), format);
        c[(long long)column * ldc + row] = half_bits(activation(acc[i] + bias, mode, coef), format);
    }
}
