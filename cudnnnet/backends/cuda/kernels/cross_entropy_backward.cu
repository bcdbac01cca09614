// The softmax-output training step fused into one launch, compiled at run time with NVRTC.
// Two kernels: cross_entropy_backward starts from the probabilities of cudnnSoftmaxForward;
// softmax_cross_entropy_backward (at the end) starts from the logits and computes the softmax too,
// and with predict and grad null it is the evaluation's loss and hit count alone.
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

// log(max(p, floor)) where a NaN p stays NaN (fmaxf would drop it), as NumPy's maximum does.
__device__ float log_at_least(float p, float floor) { return logf(p < floor ? floor : p); }

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
        sums.loss += t * log_at_least(p, 1e-7f);
    }
    for (long long n = first_index(); n < batch; n += grid_stride())
        sums.hits += argmax(predict + n * classes, classes) == argmax(target + n * classes, classes) ? 1.f : 0.f;
    const Partials block_total = block_sum(sums);
    if (threadIdx.x == 0) {
        atomicAdd(loss, -scale * block_total.loss);
        atomicAdd(count, block_total.hits);
    }
}

// softmax_cross_entropy_backward: the Softmax layer's forward and the training step above in one
// launch, starting from the logits x (N × classes, one row per sample): for each sample n,
//
//   predict[n, c] = e[c] / Σ_c e[c],   e[c] = exp(x[n, c] - max_c x[n, c])       (cudnnSoftmaxForward, ACCURATE)
//   grad[n, c]    = (predict[n, c] - target[n, c]) · grad_scale                  grad_scale = 1/N
//   loss[0]      += -loss_scale · Σ target·log(max(predict, 1e-7))              loss_scale = 1/N in training
//   count[0]     += #{n : argmax predict[n, :] == argmax target[n, :]}           (first maximum wins)
//
// predict and grad may be null: that output is not written. Evaluation passes both null and
// loss_scale = 1/(samples in the whole set), so that loss[0] sums to the set's mean over its batches.
//
// A GROUP of lanes takes each sample (lane l its classes l, l + GROUP, ...), so that the loads of
// a row are issued together and coalesce; the row's maximum, sum and first argmaxes are shuffles
// within the group. A warp takes WARP / GROUP samples at a time and its lanes loop together (the
// shuffles need them all), lanes past the batch holding no classes. The block partials and atomics
// are those of cross_entropy_backward. A NaN logit makes its row NaN (its sum is NaN), and so the
// loss, as in the unfused path; such a row's hit may count differently. softmax_cross_entropy_backward16
// reads 16-bit logits (a 16-bit multilayer perceptron's) and computes in float from their values.

#include "half.cuh"  // half_value: a 16-bit logit's float

#define WARP 32
#define GROUP 16  // lanes per sample: MNIST's 10 classes in one load each
#define FULL_MASK 0xffffffffu

__device__ float group_max(float value) {
    for (int offset = GROUP / 2; offset > 0; offset >>= 1)
        value = fmaxf(value, __shfl_xor_sync(FULL_MASK, value, offset, GROUP));
    return value;
}

__device__ float group_sum(float value) {
    for (int offset = GROUP / 2; offset > 0; offset >>= 1) value += __shfl_xor_sync(FULL_MASK, value, offset, GROUP);
    return value;
}

// The class of the group's first maximum, from each lane's (first maximum, its class).
__device__ int group_argmax(float value, int index) {
    for (int offset = GROUP / 2; offset > 0; offset >>= 1) {
        const float other = __shfl_xor_sync(FULL_MASK, value, offset, GROUP);
        const int other_index = __shfl_xor_sync(FULL_MASK, index, offset, GROUP);
        if (other > value || (other == value && other_index < index)) {
            value = other;
            index = other_index;
        }
    }
    return index;
}

// The logit at i: float32 (FORMAT 0), or a 16-bit multilayer perceptron's (1 bfloat16, 2 IEEE half), exact.
template <int FORMAT>
__device__ __forceinline__ float logit_at(const void* __restrict__ logits, long long i) {
    if (FORMAT == 0) return static_cast<const float*>(logits)[i];
    return half_value(static_cast<const unsigned short*>(logits)[i], FORMAT);
}

template <int FORMAT>
__device__ void softmax_cross_entropy(float* __restrict__ predict, float* __restrict__ grad, float* loss, float* count,
                                      const void* __restrict__ logits, const float* __restrict__ target,
                                      long long batch, int classes, float grad_scale, float loss_scale) {
    const float minus_infinity = __int_as_float(0xff800000);
    const int lane = threadIdx.x % GROUP, group_in_warp = (threadIdx.x % WARP) / GROUP;
    const long long warp = first_index() / WARP, warps = grid_stride() / WARP;
    Partials sums = {0.f, 0.f};
    for (long long first = warp * (WARP / GROUP); first < batch; first += warps * (WARP / GROUP)) {
        const long long n = first + group_in_warp;
        const int own = n < batch ? classes : 0;  // past the batch: no classes, but the shuffles still run
        const long long row = n * classes;
        const float* t = target + row;
        float top = minus_infinity;
        for (int c = lane; c < own; c += GROUP) top = fmaxf(top, logit_at<FORMAT>(logits, row + c));
        top = group_max(top);
        float total = 0.f;
        for (int c = lane; c < own; c += GROUP) total += expf(logit_at<FORMAT>(logits, row + c) - top);
        total = group_sum(total);
        float best_p = minus_infinity, best_t = minus_infinity;
        int best_p_class = classes, best_t_class = classes;
        for (int c = lane; c < own; c += GROUP) {
            const float p = expf(logit_at<FORMAT>(logits, row + c) - top) / total;
            if (predict) predict[n * classes + c] = p;
            if (grad) grad[n * classes + c] = (p - t[c]) * grad_scale;
            sums.loss += t[c] * log_at_least(p, 1e-7f);
            if (p > best_p) {
                best_p = p;
                best_p_class = c;
            }
            if (t[c] > best_t) {
                best_t = t[c];
                best_t_class = c;
            }
        }
        const int predicted = group_argmax(best_p, best_p_class), expected = group_argmax(best_t, best_t_class);
        if (lane == 0 && own) sums.hits += predicted == expected ? 1.f : 0.f;
    }
    const Partials block_total = block_sum(sums);
    if (threadIdx.x == 0) {
        atomicAdd(loss, -loss_scale * block_total.loss);
        atomicAdd(count, block_total.hits);
    }
}

extern "C" __global__ void softmax_cross_entropy_backward(float* __restrict__ predict, float* __restrict__ grad,
                                                          float* loss, float* count, const float* __restrict__ logits,
                                                          const float* __restrict__ target, long long batch,
                                                          int classes, float grad_scale, float loss_scale) {
    softmax_cross_entropy<0>(predict, grad, loss, count, logits, target, batch, classes, grad_scale, loss_scale);
}

// The same from 16-bit logits of ``format`` (1 bfloat16, 2 IEEE half); predict and grad float32.
extern "C" __global__ void softmax_cross_entropy_backward16(float* __restrict__ predict, float* __restrict__ grad,
                                                            float* loss, float* count,
                                                            const unsigned short* __restrict__ logits,
                                                            const float* __restrict__ target, long long batch,
                                                            int classes, float grad_scale, float loss_scale,
                                                            int format) {
    if (format == 1)
        softmax_cross_entropy<1>(predict, grad, loss, count, logits, target, batch, classes, grad_scale, loss_scale);
    else
        softmax_cross_entropy<2>(predict, grad, loss, count, logits, target, batch, classes, grad_scale, loss_scale);
}
