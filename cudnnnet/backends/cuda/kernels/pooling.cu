// Max pooling backward where windows do not overlap, compiled with NVRTC (kernel.py). pooling.py
// decides when it runs (max mode, no padding, stride >= window); every other pooling runs on cuDNN.
//
//   dx = alpha·route(dy) + beta·dx
//
// route(dy) holds each window's dy at the window's first cell (row-major) equal to its maximum, and
// 0 everywhere else: the window's other cells, the cells of no window (the gaps when stride >
// window, the bottom rows and right columns no window reaches) and every cell of a window that
// holds a NaN (its maximum is NaN, which equals no cell: the host backend's rule). The maximum is
// recomputed from x; y is not read. With beta == 0, dx is not read (a NaN there does not survive).
// The products and the sum are rounded one by one, as NumPy rounds them (no fused multiply-add).
//
// The windows do not overlap, so the image splits into one tile per window: rows [oh·stride,
// (oh+1)·stride) by columns [ow·stride, (ow+1)·stride), the last tile of each row and column
// stretched to the image's edge. One thread per window writes its whole tile: every dx value is
// written once, by one thread, without atomics. Indices are 32-bit: pooling.py checks that x holds
// fewer than 2^31 values (less the grid's threads, so that the grid-stride index cannot overflow).
// dx must not overlap x or dy.
//   x, dx (planes = N·C, height, width), dy (planes, out_height, out_width)

__device__ int first_index() { return blockIdx.x * BLOCK_SIZE + threadIdx.x; }
__device__ int grid_stride() { return gridDim.x * BLOCK_SIZE; }

#include "half.cuh"  // half_value, half_bits: a 16-bit CNN's x, dy and dx (max_pooling_backward16)

// A stored value as a float, and a float stored: float32 as it is, 16 bits of ``format`` rounded once.
__device__ __forceinline__ float load(float value, int) { return value; }
__device__ __forceinline__ float load(unsigned short bits, int format) { return half_value(bits, format); }
__device__ __forceinline__ void store(float* out, float value, int) { *out = value; }
__device__ __forceinline__ void store(unsigned short* out, float value, int format) { *out = half_bits(value, format); }

// The offset r·width + s of the window's first cell (row-major) equal to its maximum, or -1 if the
// window holds a NaN. WINDOW > 0 fixes the window's size at compile time (the loops unroll and all
// its loads are in flight at once); WINDOW == 0 takes ``window``.
template <int WINDOW, typename T>
__device__ int first_maximum(const T* __restrict__ corner, int width, int window, int format) {
    const int size = WINDOW > 0 ? WINDOW : window;
    float best = load(corner[0], format);
    int first = 0;
    bool nan = false;
#pragma unroll
    for (int r = 0; r < size; ++r) {
#pragma unroll
        for (int s = 0; s < size; ++s) {
            const float value = load(corner[r * width + s], format);
            nan |= value != value;  // true only for NaN (no fast-math: NVRTC keeps IEEE comparisons)
            if (value > best) {  // strictly greater: a later cell equal to the maximum never takes it
                best = value;
                first = r * width + s;
            }
        }
    }
    return nan ? -1 : first;
}

template <int WINDOW, typename T>
__device__ void max_pooling_backward_tiles(T* __restrict__ dx, const T* __restrict__ x, const T* __restrict__ dy,
                                           float alpha, float beta, int planes, int height, int width, int window,
                                           int stride, int out_height, int out_width, int format) {
    const int total = planes * out_height * out_width;
    for (int i = first_index(); i < total; i += grid_stride()) {
        const int ow = i % out_width;
        const int row = i / out_width;  // plane·out_height + oh
        const int oh = row % out_height;
        const int plane = row / out_height;
        const int top = oh * stride, left = ow * stride;
        const int bottom = oh == out_height - 1 ? height : top + stride;  // the last tiles reach the edges
        const int right = ow == out_width - 1 ? width : left + stride;
        const int corner = (plane * height + top) * width + left;  // x[plane, top, left]
        const float gradient = load(dy[i], format);
        const int winner = first_maximum<WINDOW>(x + corner, width, window, format);
        for (int h = top; h < bottom; ++h) {
            for (int w = left; w < right; ++w) {
                const int offset = (h - top) * width + (w - left);
                const float routed = __fmul_rn(alpha, offset == winner ? gradient : 0.f);
                T* out = dx + corner + offset;  // dx[plane, h, w]
                store(out, beta == 0.f ? routed : __fadd_rn(routed, __fmul_rn(beta, load(*out, format))), format);
            }
        }
    }
}

// The CNN's 2×2 windows and 3×3 ones with their loads unrolled; any other size in loops.
template <typename T>
__device__ void max_pooling_backward_any(T* __restrict__ dx, const T* __restrict__ x, const T* __restrict__ dy,
                                         float alpha, float beta, int planes, int height, int width, int window,
                                         int stride, int out_height, int out_width, int format) {
    switch (window) {
        case 2:
            max_pooling_backward_tiles<2>(dx, x, dy, alpha, beta, planes, height, width, window, stride, out_height,
                                          out_width, format);
            break;
        case 3:
            max_pooling_backward_tiles<3>(dx, x, dy, alpha, beta, planes, height, width, window, stride, out_height,
                                          out_width, format);
            break;
        default:
            max_pooling_backward_tiles<0>(dx, x, dy, alpha, beta, planes, height, width, window, stride, out_height,
                                          out_width, format);
    }
}

extern "C" __global__ void max_pooling_backward(float* __restrict__ dx, const float* __restrict__ x,
                                                const float* __restrict__ dy, float alpha, float beta, int planes,
                                                int height, int width, int window, int stride, int out_height,
                                                int out_width) {
    max_pooling_backward_any(dx, x, dy, alpha, beta, planes, height, width, window, stride, out_height, out_width, 0);
}

// The same on a 16-bit CNN's x, dy and dx of ``format`` (1 bfloat16, 2 IEEE half): the maximum found
// among x's values (exact), dx = half(alpha·route(dy) + beta·dx) rounded once.
extern "C" __global__ void max_pooling_backward16(unsigned short* __restrict__ dx, const unsigned short* __restrict__ x,
                                                  const unsigned short* __restrict__ dy, float alpha, float beta,
                                                  int planes, int height, int width, int window, int stride,
                                                  int out_height, int out_width, int format) {
    max_pooling_backward_any(dx, x, dy, alpha, beta, planes, height, width, window, stride, out_height, out_width,
                             format);
}
