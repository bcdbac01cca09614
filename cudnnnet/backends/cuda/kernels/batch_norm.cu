// Batch normalisation in training, the fast engine's replacement for cuDNN's calls, compiled with
// NVRTC (kernel.py); batch_norm.py sizes the grid and owns the scratch. A following ReLU may be
// applied in the same pass (relu != 0), and its gradient then taken in the backward pass.
//
// x, y, dy, dx are (N, C, P): spatial mode P = H·W (statistics over N and P); per-activation mode is
// the same with C = C·H·W and P = 1. Each channel's N samples are cut into ``groups`` groups of
// ``group_samples``; block b works on group (b mod groups) of channel (b / groups), so a grid of
// C·groups blocks fills the GPU even where C is small (cuDNN's reductions leave most of it idle at 32
// channels). Two launches per direction:
//
//   forward   batch_norm_sums:            partials[c, g] = (Σ x, Σ x²) over the group, in float64
//             batch_norm_forward_apply:   μ, σ² from the partials of channel c (a fixed order)
//                                         y = f(scale·(x - μ)/√(σ² + eps) + bias), f = ReLU or identity
//                                         (and block g = 0 writes save_mean, save_inv_std and the running
//                                         averages, as cudnnBatchNormalizationForwardTraining)
//   backward  batch_norm_gradient_sums:   partials[c, g] = (Σ dy', Σ dy'·(x - μ)), dy' = dy·f'(y), f'
//                                         read from the pre-activation recomputed from x
//             batch_norm_backward_apply:  dbias = Σ dy', dscale = Σ dy'·x̂ (block g = 0 writes them)
//                                         dx = scale/(m·√(σ² + eps))·(m·dy' - dbias - x̂·dscale)
//
// Synchronised batch normalisation (several ranks) puts an all-reduce between the two launches:
// batch_norm_totals adds each channel's partials into totals[c] = (Σ a, Σ b) and totals[2C] = m (the
// backward also writes dbias, dscale from this rank's totals), the totals are summed over the ranks
// (batch_norm.py), and the apply kernel reads them (sum_groups 1, m from count) in place of the partials.
//
// Each kernel has a 16-bit twin (``*16``, its last argument the format: 1 bfloat16, 2 IEEE half) for a
// 16-bit network's x, y, dy and dx: each value read exactly as a float, y and dx rounded once; the
// statistics, the parameters and their gradients stay float32 (the sums float64), as in float32.
//
// Deterministic: every sum is taken in a fixed order (each thread its values in increasing order,
// a fixed shuffle tree, the partials in increasing g), so the result has the same bits on every
// launch. Offsets are 32-bit: batch_norm.py checks that N·C·P < 2^31.

#define WARP 32
#define WARPS (BLOCK_SIZE / WARP)

#include "half.cuh"  // half_value, half_bits: a 16-bit network's x, y, dy and dx (the *16 kernels)

// A stored value as a float, and a float stored: float32 as it is, 16 bits of ``format`` rounded once.
__device__ __forceinline__ float load(float value, int) { return value; }
__device__ __forceinline__ float load(unsigned short bits, int format) { return half_value(bits, format); }
__device__ __forceinline__ void store(float* out, float value, int) { *out = value; }
__device__ __forceinline__ void store(unsigned short* out, float value, int format) { *out = half_bits(value, format); }

static_assert(BLOCK_SIZE % WARP == 0 && BLOCK_SIZE <= 1024, "BLOCK_SIZE must be a multiple of 32, at most 1024");

__device__ double warp_sum(double value) {
    for (int offset = WARP / 2; offset > 0; offset >>= 1) value += __shfl_down_sync(0xffffffffu, value, offset);
    return value;
}

// (a, b) summed over the block's threads in a fixed order; valid in thread 0. Every thread calls it.
__device__ void block_sums(double& a, double& b) {
    __shared__ double shared[2][WARPS];
    a = warp_sum(a);
    b = warp_sum(b);
    if (threadIdx.x % WARP == 0) {
        shared[0][threadIdx.x / WARP] = a;
        shared[1][threadIdx.x / WARP] = b;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        a = b = 0.0;
        for (int w = 0; w < WARPS; ++w) {
            a += shared[0][w];
            b += shared[1][w];
        }
    }
}

// The values of this block's group: j in [0, count), at offset (first + j / positions)·C·P + c·P + j mod P.
struct Group {
    int channel, group, first, count, positions, sample_stride, base;

    __device__ Group(int channels, int positions_, int samples, int group_samples, int groups) {
        channel = blockIdx.x / groups;
        group = blockIdx.x - channel * groups;
        first = group * group_samples;
        const int last = min(samples, first + group_samples);
        positions = positions_;
        count = max(0, last - first) * positions;
        sample_stride = channels * positions;
        base = first * sample_stride + channel * positions;
    }

    __device__ int offset(int j) const {
        const int n = j / positions;
        return base + n * sample_stride + (j - n * positions);
    }
};

// The channel's (Σ a, Σ b) over its groups' partials, in increasing group order.
__device__ void channel_sums(const double* partials, int channel, int groups, double& a, double& b) {
    a = b = 0.0;
    for (int g = 0; g < groups; ++g) {
        a += partials[2 * (channel * groups + g)];
        b += partials[2 * (channel * groups + g) + 1];
    }
}

// The normalisation of channel c as y = x·a + b (a = scale/√(σ² + eps), b = bias - μ·a): the same
// bits in the forward and the backward pass, so that the ReLU's gradient sees the forward's y.
__device__ float2 affine(float scale, float bias, float mean, float inv_std) {
    const float a = __fmul_rn(scale, inv_std);
    return make_float2(a, __fsub_rn(bias, __fmul_rn(mean, a)));
}

// m, the values each statistic is taken over: every rank's (count, after the all-reduce of the totals)
// or this launch's.
__device__ double values_per_statistic(const double* count, int samples, int positions) {
    return count != nullptr ? *count : (double)samples * positions;
}

__device__ float pre_activation(float x, float2 ab) { return __fmaf_rn(x, ab.x, ab.y); }

template <typename T>
__device__ void sums_of(double* partials, const T* __restrict__ x, int channels, int positions, int samples,
                        int group_samples, int groups, int format) {
    const Group at(channels, positions, samples, group_samples, groups);
    double sum = 0.0, squares = 0.0;
    for (int j = threadIdx.x; j < at.count; j += BLOCK_SIZE) {
        const double value = load(x[at.offset(j)], format);
        sum += value;
        squares += value * value;
    }
    block_sums(sum, squares);
    if (threadIdx.x == 0) {
        partials[2 * blockIdx.x] = sum;
        partials[2 * blockIdx.x + 1] = squares;
    }
}

template <typename T>
__device__ void forward_apply(T* y, const T* __restrict__ x, const double* partials, int sum_groups,
                              const double* count, const float* scale, const float* bias, float* running_mean,
                              float* running_var, float* save_mean, float* save_inv_std, float factor, float eps,
                              int relu, int channels, int positions, int samples, int group_samples, int groups,
                              int format) {
    const Group at(channels, positions, samples, group_samples, groups);
    __shared__ float2 shared_ab;
    if (threadIdx.x == 0) {
        double sum, squares;
        channel_sums(partials, at.channel, sum_groups, sum, squares);
        const double m = values_per_statistic(count, samples, positions);
        const double mean = sum / m;
        const double variance = fmax(squares / m - mean * mean, 0.0);
        const float inv_std = (float)(1.0 / sqrt(variance + (double)eps));
        shared_ab = affine(scale[at.channel], bias[at.channel], (float)mean, inv_std);
        if (at.group == 0) {
            const int c = at.channel;
            save_mean[c] = (float)mean;
            save_inv_std[c] = inv_std;
            const double unbiased = variance * m / fmax(m - 1.0, 1.0);
            running_mean[c] = (float)((1.0 - factor) * running_mean[c] + factor * mean);
            running_var[c] = (float)((1.0 - factor) * running_var[c] + factor * unbiased);
        }
    }
    __syncthreads();
    const float2 ab = shared_ab;
    for (int j = threadIdx.x; j < at.count; j += BLOCK_SIZE) {
        const int o = at.offset(j);
        const float value = pre_activation(load(x[o], format), ab);
        store(y + o, relu && !(value > 0.f) ? 0.f : value, format);
    }
}

template <typename T>
__device__ void gradient_sums(double* partials, const T* __restrict__ x, const T* __restrict__ dy,
                              const float* scale, const float* bias, const float* save_mean,
                              const float* save_inv_std, int relu, int channels, int positions, int samples,
                              int group_samples, int groups, int format) {
    const Group at(channels, positions, samples, group_samples, groups);
    const float mean = save_mean[at.channel];
    const float2 ab = affine(scale[at.channel], bias[at.channel], mean, save_inv_std[at.channel]);
    double sum = 0.0, products = 0.0;
    for (int j = threadIdx.x; j < at.count; j += BLOCK_SIZE) {
        const int o = at.offset(j);
        const float value = load(x[o], format);
        const double grad = relu && !(pre_activation(value, ab) > 0.f) ? 0.0 : (double)load(dy[o], format);
        sum += grad;
        products += grad * ((double)value - mean);
    }
    block_sums(sum, products);
    if (threadIdx.x == 0) {
        partials[2 * blockIdx.x] = sum;
        partials[2 * blockIdx.x + 1] = products;
    }
}

template <typename T>
__device__ void backward_apply(T* dx, const T* __restrict__ x, const T* __restrict__ dy, const double* partials,
                               int sum_groups, const double* count, const float* scale, const float* bias,
                               float* dscale, float* dbias, const float* save_mean, const float* save_inv_std,
                               int relu, int channels, int positions, int samples, int group_samples, int groups,
                               int format) {
    const Group at(channels, positions, samples, group_samples, groups);
    const int c = at.channel;
    const float mean = save_mean[c], inv_std = save_inv_std[c];
    const float2 ab = affine(scale[c], bias[c], mean, inv_std);
    __shared__ float3 shared_k;
    if (threadIdx.x == 0) {
        double bias_grad, products;
        channel_sums(partials, c, sum_groups, bias_grad, products);
        const double m = values_per_statistic(count, samples, positions);
        const double scale_grad = products * inv_std;  // Σ dy'·x̂
        const double k = (double)scale[c] * inv_std;
        // dx = k·dy' - k·dbias/m - k·inv_std·dscale/m·(x - μ)
        shared_k = make_float3((float)k, (float)(k * bias_grad / m), (float)(k * inv_std * scale_grad / m));
        if (at.group == 0 && dscale != nullptr) {  // null: batch_norm_totals wrote this rank's
            dscale[c] = (float)scale_grad;
            dbias[c] = (float)bias_grad;
        }
    }
    __syncthreads();
    const float3 k = shared_k;
    for (int j = threadIdx.x; j < at.count; j += BLOCK_SIZE) {
        const int o = at.offset(j);
        const float value = load(x[o], format);
        const float grad = relu && !(pre_activation(value, ab) > 0.f) ? 0.f : load(dy[o], format);
        store(dx + o, k.x * grad - k.y - k.z * (value - mean), format);
    }
}

extern "C" __global__ void batch_norm_sums(double* partials, const float* __restrict__ x, int channels,
                                           int positions, int samples, int group_samples, int groups) {
    sums_of(partials, x, channels, positions, samples, group_samples, groups, 0);
}

extern "C" __global__ void batch_norm_sums16(double* partials, const unsigned short* __restrict__ x, int channels,
                                             int positions, int samples, int group_samples, int groups, int format) {
    sums_of(partials, x, channels, positions, samples, group_samples, groups, format);
}

extern "C" __global__ void batch_norm_forward_apply(float* y, const float* __restrict__ x, const double* partials,
                                                    int sum_groups, const double* count, const float* scale,
                                                    const float* bias, float* running_mean, float* running_var,
                                                    float* save_mean, float* save_inv_std, float factor, float eps,
                                                    int relu, int channels, int positions, int samples,
                                                    int group_samples, int groups) {
    forward_apply(y, x, partials, sum_groups, count, scale, bias, running_mean, running_var, save_mean, save_inv_std,
                  factor, eps, relu, channels, positions, samples, group_samples, groups, 0);
}

extern "C" __global__ void batch_norm_forward_apply16(unsigned short* y, const unsigned short* __restrict__ x,
                                                      const double* partials, int sum_groups, const double* count,
                                                      const float* scale, const float* bias, float* running_mean,
                                                      float* running_var, float* save_mean, float* save_inv_std,
                                                      float factor, float eps, int relu, int channels, int positions,
                                                      int samples, int group_samples, int groups, int format) {
    forward_apply(y, x, partials, sum_groups, count, scale, bias, running_mean, running_var, save_mean, save_inv_std,
                  factor, eps, relu, channels, positions, samples, group_samples, groups, format);
}

extern "C" __global__ void batch_norm_gradient_sums(double* partials, const float* __restrict__ x,
                                                    const float* __restrict__ dy, const float* scale,
                                                    const float* bias, const float* save_mean,
                                                    const float* save_inv_std, int relu, int channels,
                                                    int positions, int samples, int group_samples, int groups) {
    gradient_sums(partials, x, dy, scale, bias, save_mean, save_inv_std, relu, channels, positions, samples,
                  group_samples, groups, 0);
}

extern "C" __global__ void batch_norm_gradient_sums16(double* partials, const unsigned short* __restrict__ x,
                                                      const unsigned short* __restrict__ dy, const float* scale,
                                                      const float* bias, const float* save_mean,
                                                      const float* save_inv_std, int relu, int channels,
                                                      int positions, int samples, int group_samples, int groups,
                                                      int format) {
    gradient_sums(partials, x, dy, scale, bias, save_mean, save_inv_std, relu, channels, positions, samples,
                  group_samples, groups, format);
}

extern "C" __global__ void batch_norm_backward_apply(float* dx, const float* __restrict__ x,
                                                     const float* __restrict__ dy, const double* partials,
                                                     int sum_groups, const double* count,
                                                     const float* scale, const float* bias, float* dscale,
                                                     float* dbias, const float* save_mean, const float* save_inv_std,
                                                     int relu, int channels, int positions, int samples,
                                                     int group_samples, int groups) {
    backward_apply(dx, x, dy, partials, sum_groups, count, scale, bias, dscale, dbias, save_mean, save_inv_std, relu,
                   channels, positions, samples, group_samples, groups, 0);
}

extern "C" __global__ void batch_norm_backward_apply16(unsigned short* dx, const unsigned short* __restrict__ x,
                                                       const unsigned short* __restrict__ dy, const double* partials,
                                                       int sum_groups, const double* count, const float* scale,
                                                       const float* bias, float* dscale, float* dbias,
                                                       const float* save_mean, const float* save_inv_std, int relu,
                                                       int channels, int positions, int samples, int group_samples,
                                                       int groups, int format) {
    backward_apply(dx, x, dy, partials, sum_groups, count, scale, bias, dscale, dbias, save_mean, save_inv_std, relu,
                   channels, positions, samples, group_samples, groups, format);
}

extern "C" __global__ void batch_norm_totals(double* totals, const double* partials, int channels, int groups,
                                             long long count, float* dscale, float* dbias,
                                             const float* save_inv_std) {
    const int c = blockIdx.x * BLOCK_SIZE + threadIdx.x;
    if (c == 0) totals[2 * channels] = (double)count;
    if (c >= channels) return;
    double a, b;
    channel_sums(partials, c, groups, a, b);
    totals[2 * c] = a;
    totals[2 * c + 1] = b;
    if (dscale != nullptr) {  // the backward's: this rank's dbias = Σ dy', dscale = Σ dy'·x̂
        dscale[c] = (float)(b * save_inv_std[c]);
        dbias[c] = (float)a;
    }
}
