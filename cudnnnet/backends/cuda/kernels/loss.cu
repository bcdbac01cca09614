// Loss and accuracy reductions, compiled at run time with NVRTC (see kernel.py).
//
// Every kernel is launched with BLOCK_SIZE threads per block (defined by the compiler options) and
// any number of blocks: a grid-stride loop covers all elements, so the tail of any batch size is
// guarded. Each block reduces its partial sum in shared memory, then thread 0 adds it to the
// output with one atomicAdd: blocks never read each other's results, so there is no race across
// blocks. The output is zeroed on the stream before the launch unless the caller accumulates.

// Sum of `value` over the block; the result is valid in thread 0.
__device__ float block_sum(float value) {
    __shared__ float partial[BLOCK_SIZE];
    partial[threadIdx.x] = value;
    __syncthreads();
    for (int stride = BLOCK_SIZE / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    return partial[0];
}

__device__ long long first_index() { return (long long)blockIdx.x * BLOCK_SIZE + threadIdx.x; }
__device__ long long grid_stride() { return (long long)gridDim.x * BLOCK_SIZE; }

// loss[0] += -scale · Σᵢ target[i]·log(max(predict[i], 1e-7)),  i < total (= N·classes), scale = 1/N
extern "C" __global__ void cross_entropy_loss(float* loss, const float* predict, const float* target,
                                              long long total, float scale) {
    float sum = 0.f;
    for (long long i = first_index(); i < total; i += grid_stride())
        sum += target[i] * logf(predict[i] < 1e-7f ? 1e-7f : predict[i]);  // a NaN stays NaN, as in NumPy
    const float block_total = block_sum(sum);
    if (threadIdx.x == 0) atomicAdd(loss, -scale * block_total);
}

// loss[0] += scale · Σᵢ ½(predict[i] - target[i])²,  scale = 1/N
extern "C" __global__ void squared_error_loss(float* loss, const float* predict, const float* target,
                                              long long total, float scale) {
    float sum = 0.f;
    for (long long i = first_index(); i < total; i += grid_stride()) {
        const float difference = predict[i] - target[i];
        sum += 0.5f * difference * difference;
    }
    const float block_total = block_sum(sum);
    if (threadIdx.x == 0) atomicAdd(loss, scale * block_total);
}

// The index of the first maximum of row[0:classes].
__device__ int argmax(const float* row, int classes) {
    int best = 0;
    for (int c = 1; c < classes; ++c)
        if (row[c] > row[best]) best = c;
    return best;
}

// count[0] += #samples n < batch with argmax(predict[n, :]) == argmax(target[n, :])
extern "C" __global__ void accuracy_count(float* count, const float* predict, const float* target,
                                          long long batch, int classes) {
    float hits = 0.f;
    for (long long n = first_index(); n < batch; n += grid_stride())
        hits += argmax(predict + n * classes, classes) == argmax(target + n * classes, classes) ? 1.f : 0.f;
    const float block_total = block_sum(hits);
    if (threadIdx.x == 0) atomicAdd(count, block_total);
}
