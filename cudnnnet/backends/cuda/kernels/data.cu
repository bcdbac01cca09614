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

// splitmix64's step: add the golden gamma, then its finaliser (augmentation.py's ``mix``, the same bits).
__device__ unsigned long long mix(unsigned long long z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// gather_batch with augmentation.py's random crop and flip: for sample b, with step = counter[0],
//   h = mix(mix(mix(seed) + step) + b);  dy, dx = 24-bit fields of h scaled to [−P, P];  flip = bit 48 of h
//   x[b, c, y, x'] = images[j, c, y + dy, xs + dx]  (xs = W − 1 − x' if flip else x'; 0 outside the image)
//   target[b, k] = (labels[j] == k),  j = order[cursor[0] + b]
// then counter[0] += 1, so that each replay of a captured step draws the next step's crops.
//   x (batch, C, H, W), target (batch, classes), images (N, C, H, W), labels (N), order (N),
//   counter: two uint32 [step, blocks finished]; the last block to finish advances the step.
extern "C" __global__ void gather_augmented_batch(float* x, float* target, const float* images, const float* labels,
                                                  const float* order, const float* cursor, unsigned int* counter,
                                                  long long batch, int channels, int height, int width, int classes,
                                                  int padding, int flip, unsigned long long seed) {
    __shared__ unsigned int step;
    if (threadIdx.x == 0) step = counter[0];
    __syncthreads();
    const long long start = (long long)cursor[0];
    const unsigned long long key = mix(mix(seed) + step);
    const unsigned long long span = 2ull * padding + 1;
    const int plane = height * width, size = channels * plane;  // fewer than 2^31 values (the backend checks)
    for (long long i = first_index(); i < batch * size; i += grid_stride()) {
        const long long b = i / size;
        const int within = (int)(i - b * size);
        const int c = within / plane, y = within % plane / width, column = within % width;
        const unsigned long long h = mix(key + (unsigned long long)b);
        const int dy = (int)(((h & 0xFFFFFFull) * span) >> 24) - padding;
        const int dx = (int)((((h >> 24) & 0xFFFFFFull) * span) >> 24) - padding;
        const bool flipped = flip && ((h >> 48) & 1ull);
        const int row = y + dy, source = (flipped ? width - 1 - column : column) + dx;
        const bool inside = 0 <= row && row < height && 0 <= source && source < width;
        const long long sample = (long long)order[start + b];
        x[i] = inside ? images[sample * size + (long long)c * plane + (long long)row * width + source] : 0.f;
    }
    for (long long i = first_index(); i < batch * classes; i += grid_stride()) {
        const long long b = i / classes;
        const int label = (int)labels[(long long)order[start + b]];
        target[i] = label == (int)(i - b * classes) ? 1.f : 0.f;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();  // this block read the step before it counts itself finished
        if (atomicAdd(&counter[1], 1u) == gridDim.x - 1) {
            counter[1] = 0;
            counter[0] = step + 1;
        }
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
