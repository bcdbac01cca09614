// Convolution as explicit GEMMs (gemm_convolution.py), compiled with NVRTC (kernel.py).
//
// col (N, C·R·S, P) holds every receptive field of x, P = OH·OW output positions:
//   col[n, (c, r, s), (oh, ow)] = x[n, c, oh·stride − padding + r·dilation, ow·stride − padding + s·dilation]
// (0 where that falls in the padding). R = S = kernel. Indices are 32-bit: the backend checks
// that col and x hold fewer than 2^31 values (integer division is several times cheaper so).
//
// A 16-bit CNN's x, y and dx are 16-bit tensors themselves: im2col_half16 reads x in 16 bits,
// round_result16 and col2im16 store y and dx rounded once.
//
// Under a 16-bit math (``format`` 1: bfloat16, 2: IEEE half; 0: float32 kept) im2col_half writes
// col in 16 bits, each value rounded as converting x first would (the roundings of bf16.cu's
// to_bf16 and fp16.cu's to_fp16, repeated here: each file is compiled alone), and the FP32 results
// of the GEMMs are rounded once to the format before alpha and beta (col2im, round_result), as
// cuDNN's 16-bit output is.

__device__ int first_index() { return blockIdx.x * BLOCK_SIZE + threadIdx.x; }
__device__ int grid_stride() { return gridDim.x * BLOCK_SIZE; }

#define FORMAT_BF16 1
#define FORMAT_FP16 2

#include "half.cuh"  // bf16_bits, fp16_bits, fp16_value, half_bits: the roundings of bf16.cu and fp16.cu

// ``value`` rounded to ``format`` (0: unchanged), as a float.
__device__ __forceinline__ float rounded(float value, int format) {
    if (format == FORMAT_BF16) return __uint_as_float(bf16_bits(value) << 16);
    if (format == FORMAT_FP16) return fp16_value((unsigned short)fp16_bits(value));
    return value;
}

// The value im2col reads: x's float itself, or the value of its 16 bits in ``format`` (a 16-bit CNN's x).
struct LoadFloat {
    const float* x;
    __device__ float operator()(int i) const { return x[i]; }
};
struct LoadHalf {
    const unsigned short* x;
    int format;
    __device__ float operator()(int i) const { return half_value(x[i], format); }
};

// The value im2col stores: x's float itself, or its 16 bits in ``format``.
struct StoreFloat {
    typedef float Value;
    __device__ float operator()(float value) const { return value; }
};
struct StoreHalf {
    typedef unsigned short Value;
    int format;
    __device__ unsigned short operator()(float value) const { return half_bits(value, format); }
};

// One thread per (n, c, oh, ow) writes the R·S col entries of that receptive field: the index
// arithmetic (integer divisions dominate a memory-bound kernel) runs once per R·S values.
// The samples come in groups of ``group`` (S): col[g, (c, r, s), j, p] holds sample n = g·S + j, so
// that a group's S·P positions of one row are contiguous; samples from ``batch`` up to the last
// group's end are zeros. S = 1 is the per-sample layout col[n, (c, r, s), p].
//   col (⌈batch/S⌉, channels·kernel², S, out_height·out_width), x (batch, channels, height, width)
template <typename Load, typename Store>
__device__ void im2col_into(typename Store::Value* col, Load x, int batch, int channels, int height,
                            int width, int kernel, int stride, int padding, int dilation, int out_height,
                            int out_width, int group, Store store) {
    typedef typename Store::Value Value;
    const int positions = out_height * out_width;
    const int taps = kernel * kernel;
    const int padded_batch = (batch + group - 1) / group * group;
    const int total = padded_batch * channels * positions;
    const int tap_step = group * positions;  // from col[g, (c, r, s), j, p] to the next tap
    for (int i = first_index(); i < total; i += grid_stride()) {
        const int p = i % positions;
        const int sample_channel = i / positions;  // n·C + c
        const int n = sample_channel / channels, c = sample_channel % channels;
        Value* out = col + (((n / group) * channels + c) * taps * group + n % group) * positions + p;  // col[g, (c, 0, 0), j, p]
        if (n >= batch) {
            for (int t = 0; t < taps; ++t) out[t * tap_step] = store(0.f);
            continue;
        }
        const int top = (p / out_width) * stride - padding, left = (p % out_width) * stride - padding;
        const int image = sample_channel * height * width;  // x[n, c]
        for (int r = 0; r < kernel; ++r) {
            const int h = top + r * dilation;
            for (int s = 0; s < kernel; ++s) {
                const int w = left + s * dilation;
                const bool inside = h >= 0 && h < height && w >= 0 && w < width;
                out[(r * kernel + s) * tap_step] = store(inside ? x(image + h * width + w) : 0.f);
            }
        }
    }
}

extern "C" __global__ void im2col(float* col, const float* x, int batch, int channels, int height, int width,
                                  int kernel, int stride, int padding, int dilation, int out_height, int out_width,
                                  int group) {
    LoadFloat load = {x};
    im2col_into(col, load, batch, channels, height, width, kernel, stride, padding, dilation, out_height, out_width,
                group, StoreFloat());
}

// im2col with col in 16 bits of ``format``: col[…] = half(x[…]).
extern "C" __global__ void im2col_half(unsigned short* col, const float* x, int batch, int channels, int height,
                                       int width, int kernel, int stride, int padding, int dilation, int out_height,
                                       int out_width, int group, int format) {
    StoreHalf store;
    store.format = format;
    LoadFloat load = {x};
    im2col_into(col, load, batch, channels, height, width, kernel, stride, padding, dilation, out_height, out_width,
                group, store);
}

// im2col of a 16-bit x (a 16-bit CNN's activation) into a 16-bit col of its ``format``: the bits copied.
extern "C" __global__ void im2col_half16(unsigned short* col, const unsigned short* x, int batch, int channels,
                                         int height, int width, int kernel, int stride, int padding, int dilation,
                                         int out_height, int out_width, int group, int format) {
    StoreHalf store;
    store.format = format;
    LoadHalf load = {x, format};
    im2col_into(col, load, batch, channels, height, width, kernel, stride, padding, dilation, out_height, out_width,
                group, store);
}

// out = alpha·rounded(in, format) + beta·out (out not read where beta == 0; ``in`` may be ``out``):
// a GEMM's FP32 result rounded as cuDNN's 16-bit output is, then blended as bf16_to_float does.
extern "C" __global__ void round_result(float* out, const float* in, float alpha, float beta, int format,
                                        long long count) {
    for (long long i = (long long)blockIdx.x * BLOCK_SIZE + threadIdx.x; i < count; i += (long long)gridDim.x * BLOCK_SIZE) {
        const float value = __fmul_rn(alpha, rounded(in[i], format));
        out[i] = beta == 0.f ? value : __fadd_rn(__fmul_rn(beta, out[i]), value);
    }
}

// out₁₆ = half(in): a GEMM's FP32 result stored in a 16-bit tensor of ``format``, rounded once.
extern "C" __global__ void round_result16(unsigned short* out, const float* in, int format, long long count) {
    for (long long i = (long long)blockIdx.x * BLOCK_SIZE + threadIdx.x; i < count; i += (long long)gridDim.x * BLOCK_SIZE) {
        out[i] = half_bits(in[i], format);
    }
}

// W′[c, k, t] = W[k, c, taps − 1 − t]: the filter that makes a stride-1 backward data a forward
// convolution (convolution.py, ``by_forward``).
//   flipped (channels, out_channels, taps), w (out_channels, channels, taps), taps = R·S
template <typename Value>
__device__ void flip_into(Value* flipped, const Value* w, int out_channels, int channels, int taps) {
    const int total = out_channels * channels * taps;
    for (int i = first_index(); i < total; i += grid_stride()) {
        const int t = i % taps;
        const int c = (i / taps) % channels, k = i / (taps * channels);
        flipped[(c * out_channels + k) * taps + taps - 1 - t] = w[i];
    }
}

extern "C" __global__ void flip_filter(float* flipped, const float* w, int out_channels, int channels, int taps) {
    flip_into(flipped, w, out_channels, channels, taps);
}

// The same for a 16-bit filter (its bits moved, whichever the format).
extern "C" __global__ void flip_filter_half(unsigned short* flipped, const unsigned short* w, int out_channels,
                                            int channels, int taps) {
    flip_into(flipped, w, out_channels, channels, taps);
}

// The output row (or column) whose window starts at ``offset`` = o·stride, or -1 if none does.
// Stride 1 (the common case) needs no division.
__device__ int output_index(int offset, int stride, int count) {
    if (offset < 0) return -1;
    if (stride != 1) {
        if (offset % stride != 0) return -1;
        offset /= stride;
    }
    return offset < count ? offset : -1;
}

// The sum of the dcol entries im2col copied pixel i of x to (no atomics: a fixed order).
//   dcol (batch, channels·kernel², out_height·out_width), i indexes x (batch, channels, height, width)
__device__ float col2im_sum(const float* dcol, int i, int height, int width, int kernel, int stride, int padding,
                            int dilation, int out_height, int out_width) {
    const int positions = out_height * out_width;
    const int w = i % width;
    const int h = (i / width) % height;
    const int sample_channel = i / (width * height);  // n·C + c
    const float* rows = dcol + (long long)sample_channel * kernel * kernel * positions;  // rows (c, ·, ·) of sample n
    float sum = 0.f;
    for (int r = 0; r < kernel; ++r) {
        const int oh = output_index(h + padding - r * dilation, stride, out_height);
        if (oh < 0) continue;
        const float* row = rows + r * kernel * positions + oh * out_width;
        for (int s = 0; s < kernel; ++s) {
            const int ow = output_index(w + padding - s * dilation, stride, out_width);
            if (ow >= 0) sum += row[s * positions + ow];
        }
    }
    return sum;
}

// dx = alpha·rounded(col2im(dcol), format) + beta·dx: each pixel gathers the col entries im2col
// copied it to, rounded to ``format`` (0: not rounded). With beta == 0, dx is not read.
//   dx (batch, channels, height, width), dcol (batch, channels·kernel², out_height·out_width)
extern "C" __global__ void col2im(float* dx, const float* dcol, float alpha, float beta, int batch, int channels,
                                  int height, int width, int kernel, int stride, int padding, int dilation,
                                  int out_height, int out_width, int format) {
    const int total = batch * channels * height * width;
    for (int i = first_index(); i < total; i += grid_stride()) {
        const float sum = col2im_sum(dcol, i, height, width, kernel, stride, padding, dilation, out_height, out_width);
        if (format == 0) {
            dx[i] = beta == 0.f ? alpha * sum : alpha * sum + beta * dx[i];
        } else {
            const float value = __fmul_rn(alpha, rounded(sum, format));
            dx[i] = beta == 0.f ? value : __fadd_rn(__fmul_rn(beta, dx[i]), value);
        }
    }
}

// dx₁₆ = half(col2im(dcol)): a 16-bit CNN's input gradient, of ``format``, rounded once.
extern "C" __global__ void col2im16(unsigned short* dx, const float* dcol, int batch, int channels, int height,
                                    int width, int kernel, int stride, int padding, int dilation, int out_height,
                                    int out_width, int format) {
    const int total = batch * channels * height * width;
    for (int i = first_index(); i < total; i += grid_stride()) {
        dx[i] = half_bits(col2im_sum(dcol, i, height, width, kernel, stride, padding, dilation, out_height, out_width),
                          format);
    }
}
