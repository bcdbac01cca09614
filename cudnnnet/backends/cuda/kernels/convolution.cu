// Convolution as explicit GEMMs (gemm_convolution.py), compiled with NVRTC (kernel.py).
//
// col (N, C·R·S, P) holds every receptive field of x, P = OH·OW output positions:
//   col[n, (c, r, s), (oh, ow)] = x[n, c, oh·stride − padding + r·dilation, ow·stride − padding + s·dilation]
// (0 where that falls in the padding). R = S = kernel. Indices are 32-bit: the backend checks
// that col and x hold fewer than 2^31 values (integer division is several times cheaper so).

__device__ int first_index() { return blockIdx.x * BLOCK_SIZE + threadIdx.x; }
__device__ int grid_stride() { return gridDim.x * BLOCK_SIZE; }

// One thread per (n, c, oh, ow) writes the R·S col entries of that receptive field: the index
// arithmetic (integer divisions dominate a memory-bound kernel) runs once per R·S values.
//   col (batch, channels·kernel², out_height·out_width), x (batch, channels, height, width)
extern "C" __global__ void im2col(float* col, const float* x, int batch, int channels, int height, int width,
                                  int kernel, int stride, int padding, int dilation, int out_height, int out_width) {
    const int positions = out_height * out_width;
    const int total = batch * channels * positions;
    for (int i = first_index(); i < total; i += grid_stride()) {
        const int p = i % positions;
        const int sample_channel = i / positions;  // n·C + c
        const int top = (p / out_width) * stride - padding, left = (p % out_width) * stride - padding;
        const float* image = x + sample_channel * height * width;  // x[n, c]
        float* out = col + sample_channel * kernel * kernel * positions + p;  // col[n, (c, 0, 0), p]
        for (int r = 0; r < kernel; ++r) {
            const int h = top + r * dilation;
            for (int s = 0; s < kernel; ++s) {
                const int w = left + s * dilation;
                const bool inside = h >= 0 && h < height && w >= 0 && w < width;
                out[(r * kernel + s) * positions] = inside ? image[h * width + w] : 0.f;
            }
        }
    }
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

// dx = alpha·col2im(dcol) + beta·dx: each pixel gathers the col entries im2col copied it to (no
// atomics: the sum runs in a fixed order). With beta == 0, dx is not read.
//   dx (batch, channels, height, width), dcol (batch, channels·kernel², out_height·out_width)
extern "C" __global__ void col2im(float* dx, const float* dcol, float alpha, float beta, int batch, int channels,
                                  int height, int width, int kernel, int stride, int padding, int dilation,
                                  int out_height, int out_width) {
    const int positions = out_height * out_width;
    const int total = batch * channels * height * width;
    for (int i = first_index(); i < total; i += grid_stride()) {
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
        dx[i] = beta == 0.f ? alpha * sum : alpha * sum + beta * dx[i];
    }
}
