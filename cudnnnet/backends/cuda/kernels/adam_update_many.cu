// One Adam or AdamW step (PyTorch's formulation) on many parameters in one launch: a
// multi-tensor apply like sgd_update_many.cu, compiled at run time with NVRTC.
//
// `table` lists every parameter as (param, grad, m, v, offset, size): the parameters laid end to
// end form one index space of `total` elements. With t = counter[0] + 1 (the step being taken),
// for every element of every parameter:
//
//   decoupled (AdamW):  param = param - lr·weight_decay·param
//   otherwise (Adam):   g = grad + weight_decay·param
//   m = β1·m + (1 - β1)·g;   v = β2·v + (1 - β2)·g²
//   param = param - (lr / (1 - β1ᵗ))·m / (√v / √(1 - β2ᵗ) + eps)
//
// The learning rate (`lr[0]` when `lr` is not null, else `lr_value`) and the step count
// (`counter[0]`) are read from device memory, so a CUDA graph that captured this launch follows
// the schedule and the bias correction at every replay. The last block to finish writes t into
// counter[0]; counter[1] holds the count of finished blocks (as unsigned int bits, 0 between
// launches), so the step advances exactly once per launch whatever the grid.
//
// Under dynamic loss scaling (`loss_scale` not null: the state of loss_scale.cu) the gradients
// carry the scale S: g = grad·(1/S) first, and a step whose gradients overflowed (skip set) changes
// nothing: parameters, moments and the step count stay as they were.

struct AdamTensor {
    float* param;
    const float* grad;
    float* m;
    float* v;
    long long offset;
    long long size;
};

// The k < tensors with table[k].offset <= i < table[k].offset + table[k].size (offsets ascend).
__device__ int find_adam_tensor(const AdamTensor* table, int tensors, long long i) {
    int low = 0, high = tensors - 1;
    while (low < high) {
        const int middle = (low + high + 1) / 2;
        if (table[middle].offset <= i) low = middle;
        else high = middle - 1;
    }
    return low;
}

extern "C" __global__ void adam_update_many(const AdamTensor* table, int tensors, long long total, const float* lr,
                                            float lr_value, float* counter, float beta1, float beta2, float eps,
                                            float weight_decay, int decoupled, const float* loss_scale) {
    if (loss_scale != nullptr && loss_scale[2] != 0.0f) return;  // skip: every block returns, t stays
    const float unscale = loss_scale != nullptr ? loss_scale[3] : 1.0f;
    const float rate = lr != nullptr ? lr[0] : lr_value;
    const float t = *(volatile const float*)counter + 1.0f;
    // 1 - βᵗ = -expm1(t·log β): no cancellation when βᵗ is close to 1 (β2 = 0.999 at small t)
    const float step_size = rate / -expm1f(t * logf(beta1));
    const float root_correction2 = sqrtf(-expm1f(t * logf(beta2)));
    for (long long i = (long long)blockIdx.x * BLOCK_SIZE + threadIdx.x; i < total;
         i += (long long)gridDim.x * BLOCK_SIZE) {
        const AdamTensor p = table[find_adam_tensor(table, tensors, i)];
        const long long j = i - p.offset;
        float param = p.param[j];
        float g = __fmul_rn(p.grad[j], unscale);  // exact where unscale is 1 (no loss scaling)
        if (decoupled) param -= rate * weight_decay * param;
        else g += weight_decay * param;
        const float m = beta1 * p.m[j] + (1.0f - beta1) * g;
        const float v = beta2 * p.v[j] + (1.0f - beta2) * g * g;
        p.m[j] = m;
        p.v[j] = v;
        p.param[j] = param - step_size * m / (sqrtf(v) / root_correction2 + eps);
    }
    // every block has read counter[0] before it counts itself finished; the last one advances it
    __shared__ bool last_block;
    __syncthreads();
    unsigned int* finished = reinterpret_cast<unsigned int*>(counter + 1);
    if (threadIdx.x == 0) {
        __threadfence();
        last_block = atomicAdd(finished, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (last_block && threadIdx.x == 0) {
        counter[0] = t;
        *finished = 0u;
    }
}
