// The softmax-output training step fused into one launch, compiled at run time with NVRTC.
//
// It does in one pass what the unfused path does with cudaMemcpy + cublasSaxpy + cublasSscal
// (the gradient), the cross_entropy_loss kernel and the accuracy_count kernel (loss.cu):
//
//   grad[i]  = (predict[i] - target[i]) · scale                         i < total = N·classes
//   loss[0] += -scale · Σᵢ target[i]·log(max(predict[i], 1e-7))         scale = 1/N
//   count[0] += #{n < N : argmax predict[n, :] == argmax target[n, :]}  (first maximum wins)
//
// Launched with BLOCK_SIZE threads per block and any number of blocks: grid-stride loops guard the
// tail of any batch size. Each block reduces its loss and count partials in shared memory, then
// thread 0 adds them to the outputs with one atomicAdd each: blocks never read each other's
// results, so there is no race across blocks. The outputs are always accumulated into.

struct Partials {
    float loss;
    float hits;
};

// Sums of both partials over the block; the result is valid in thread 0.
__device__ Partials block_sum(Partials value) {
    __shared__ Partials partial[BLOCK_SIZE];
    partial[threadIdx.x] = value;
    __syncthreads();
    for (int stride = BLOCK_SIZE / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            partial[threadIdx.x].loss += partial[threadIdx.x + stride].loss;
            partial[threadIdx.x].hits += partial[threadIdx.x + stride].hits;
        }
        __syncthreads();
    }
    return partial[0];
}

__device__ long long first_index() { return (long long)blockIdx.x * BLOCK_SIZE + threadIdx.x; }
__device__ long long grid_stride() { return (long long)gridDim.x * BLOCK_SIZE; }

// The index of the first maximum of row[0:classes].
__device__ int argmax(const float* row, int classes) {
    int best = 0;
    for (int c = 1; c < classes; ++c)
        if (row[c] > row[best]) best = c;
    return best;
}

extern "C" __global__ void cross_entropy_backward(float* grad, float* loss, float* count, const float* predict,
                                                  const float* target, long long batch, int classes, float scale) {
    const long long total = batch * classes;
    Partials sums = {0.f, 0.f};
    for (long long i = first_index(); i < total; i += grid_stride()) {
        const float p = predict[i], t = target[i];
        grad[i] = (p - t) * scale;
        sums.loss += t * logf(fmaxf(p, 1e-7f));
    }
    for (long long n = first_index(); n < batch; n += grid_stride())
        sums.hits += argmax(predict + n * classes, classes) == argmax(target + n * classes, classes) ? 1.f : 0.f;
    const Partials block_total = block_sum(sums);
    if (threadIdx.x == 0) {
        atomicAdd(loss, -scale * block_total.loss);
        atomicAdd(count, block_total.hits);
    }
}
