// Convolution as explicit GEMMs (gemm_convolution.py), compiled with NVRTC (kernel.py).
//
// col (N, C·R·S, P) holds every receptive field of x, P = OH·OW output positions:
//   col[n, (c, r, s), (oh, ow)] = x[n, c, oh·stride − padding + r·dilation, ow·stride − padding + s·dilation]
// (0 where that falls in the padding). R = S = kernel.

__device__ long long first_index() { return (long long)blockIdx.x * BLOCK_SIZE + threadIdx.x; }
__device__ long long grid_stride() { return (long long)gridDim.x * BLOCK_SIZE; }

//   col (batch, channels·kernel², out_height·out_width), x (batch, channels, height, width)
extern "C" __global__ void im2col(float* col, const float* x, long long batch, int channels, int height, int width,
                                  int kernel, int stride, int padding, int dilation, int out_height, int out_width) {
    const int positions = out_height * out_width;
    const int rows = channels * kernel * kernel;
    const long long total = batch * rows * positions;
    for (long long i = first_index(); i < total; i += grid_stride()) {
        const int p = (int)(i % positions);
        const long long sample_row = i / positions;
        const int row = (int)(sample_row % rows);
        const long long n = sample_row / rows;
        const int c = row / (kernel * kernel), r = (row / kernel) % kernel, s = row % kernel;
        const int h = (p / out_width) * stride - padding + r * dilation;
        const int w = (p % out_width) * stride - padding + s * dilation;
        const bool inside = h >= 0 && h < height && w >= 0 && w < width;
        col[i] = inside ? x[((n * channels + c) * height + h) * width + w] : 0.f;
    }
}

// dx = alpha·col2im(dcol) + beta·dx: each pixel gathers the col entries im2col copied it to (no
// atomics: the sum runs in a fixed order). With beta == 0, dx is not read.
//   dx (batch, channels, height, width), dcol (batch, channels·kernel², out_height·out_width)
extern "C" __global__ void col2im(float* dx, const float* dcol, float alpha, float beta, long long batch, int channels,
                                  int height, int width, int kernel, int stride, int padding, int dilation,
                                  int out_height, int out_width) {
    const int positions = out_height * out_width;
    const long long total = batch * channels * height * width;
    for (long long i = first_index(); i < total; i += grid_stride()) {
        const int w = (int)(i % width);
        const int h = (int)((i / width) % height);
        const long long sample_channel = i / ((long long)width * height);  // n·channels + c
        const float* rows = dcol + sample_channel * kernel * kernel * positions;  // rows (c, r, ·) of sample n
        float sum = 0.f;
        for (int r = 0; r < kernel; ++r) {
            const int h_offset = h + padding - r * dilation;  // = oh·stride
            if (h_offset < 0 || h_offset % stride != 0 || h_offset / stride >= out_height) continue;
            for (int s = 0; s < kernel; ++s) {
                const int w_offset = w + padding - s * dilation;  // = ow·stride
                if (w_offset < 0 || w_offset % stride != 0 || w_offset / stride >= out_width) continue;
                sum += rows[(r * kernel + s) * positions + (h_offset / stride) * out_width + w_offset / stride];
            }
        }
        dx[i] = beta == 0.f ? alpha * sum : alpha * sum + beta * dx[i];
    }
}
