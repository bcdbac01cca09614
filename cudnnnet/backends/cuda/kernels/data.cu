// A training set made resident in device memory from its bytes, and batches gathered from it;
// compiled with NVRTC (kernel.py).
//
// The batch start is read from device memory (cursor[0]) so that a CUDA graph replaying the
// training step gathers the next batch at every replay; the epoch's order is a device array.

__device__ long long first_index() { return (long long)blockIdx.x * BLOCK_SIZE + threadIdx.x; }
__device__ long long grid_stride() { return (long long)gridDim.x * BLOCK_SIZE; }

// j = order[cursor + b];  x[b, :] = images[j, :];  target[b, c] = (labels[j] == c)
//   x (batch, sample_size), target (batch, classes), images (N, sample_size), labels (N), order (N)
extern "C" __global__ void gather_batch(float* x, float* target, const float* images, const float* labels,
                                        const float* order, const float* cursor, long long batch,
                                        long long sample_size, int classes) {
    const long long start = (long long)cursor[0];
    const int size = (int)sample_size;  // one batch holds fewer than 2^31 values (the backend checks)
    const bool whole_float4s = size % 4 == 0 && (reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(images)) % 16 == 0;
    if (whole_float4s) {  // every row starts 16-byte aligned: copy float4s (784 = 4·196 for MNIST)
        const int size4 = size / 4;
        float4* x4 = reinterpret_cast<float4*>(x);
        const float4* images4 = reinterpret_cast<const float4*>(images);
        for (int i = (int)first_index(); i < (int)(batch * size4); i += (int)grid_stride()) {
            const int b = i / size4;
            const long long sample = (long long)order[start + b];
            x4[i] = images4[sample * size4 + (i - b * size4)];
        }
    } else {
        for (int i = (int)first_index(); i < (int)(batch * size); i += (int)grid_stride()) {
            const int b = i / size;
            const long long sample = (long long)order[start + b];
            x[i] = images[sample * size + (i - b * size)];
        }
    }
    for (long long i = first_index(); i < batch * classes; i += grid_stride()) {
        const long long b = i / classes;
        const int label = (int)labels[(long long)order[start + b]];
        target[i] = label == (int)(i - b * classes) ? 1.f : 0.f;
    }
}

// images[n, 0, y, x] = (p / 255 − mean) / std,  p = pixels[n, y − pad, x − pad] inside, 0 in the padding
//   images (N, 1, H + 2·pad, W + 2·pad) float32, pixels (N, H, W) uint8. Correctly rounded division and
//   subtraction (__fdiv_rn, __fsub_rn): the float32 operations to_float_images does, so both give the same bits.
extern "C" __global__ void pixels_to_images(float* images, const unsigned char* pixels, long long count,
                                            int height, int width, int pad, float mean, float std_dev) {
    const int padded_height = height + 2 * pad, padded_width = width + 2 * pad;
    const long long total = count * padded_height * padded_width;
    for (long long i = first_index(); i < total; i += grid_stride()) {
        const int x = (int)(i % padded_width) - pad;
        const int y = (int)(i / padded_width % padded_height) - pad;
        const long long n = i / ((long long)padded_height * padded_width);
        const bool inside = 0 <= x && x < width && 0 <= y && y < height;
        const float scaled = inside ? __fdiv_rn((float)pixels[(n * height + y) * width + x], 255.f) : 0.f;
        images[i] = __fdiv_rn(__fsub_rn(scaled, mean), std_dev);
    }
}
