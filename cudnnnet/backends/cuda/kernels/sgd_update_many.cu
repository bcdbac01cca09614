// One SGD step (PyTorch's formulation) on many parameters in one launch: a multi-tensor apply,
// compiled at run time with NVRTC.
//
// `table` lists every parameter as (param, grad, velocity, offset, size): the parameters laid end
// to end form one index space of `total` elements, and parameter k holds [offset, offset + size).
// The grid strides over that space; each thread finds the parameter of its element by binary
// search over the offsets. For every element of every parameter:
//
//   g = grad + weight_decay·param
//   v = momentum·v + g;  g = v          (only when the parameter's velocity != nullptr)
//   param = param - lr·g
//
// The learning rate is read from device memory (`lr[0]`) when `lr` is not null, so a CUDA graph
// that captured this launch picks up a new rate written there before each replay; otherwise it
// is `lr_value`.
//
// Under dynamic loss scaling (`loss_scale` not null: the state of loss_scale.cu) the gradients
// carry the scale S: g = grad·(1/S) before the weight decay, and a step whose gradients overflowed
// (skip set) changes nothing.

struct SgdTensor {
    float* param;
    const float* grad;
    float* velocity;
    long long offset;
    long long size;
};

// The k < tensors with table[k].offset <= i < table[k].offset + table[k].size (offsets ascend).
__device__ int find_tensor(const SgdTensor* table, int tensors, long long i) {
    int low = 0, high = tensors - 1;
    while (low < high) {
        const int middle = (low + high + 1) / 2;
        if (table[middle].offset <= i) low = middle;
        else high = middle - 1;
    }
    return low;
}

extern "C" __global__ void sgd_update_many(const SgdTensor* table, int tensors, long long total, const float* lr,
                                           float lr_value, float momentum, float weight_decay,
                                           const float* loss_scale) {
    if (loss_scale != nullptr && loss_scale[2] != 0.0f) return;  // skip: this step's gradients overflowed
    const float unscale = loss_scale != nullptr ? loss_scale[3] : 1.0f;
    const float rate = lr != nullptr ? lr[0] : lr_value;
    for (long long i = (long long)blockIdx.x * BLOCK_SIZE + threadIdx.x; i < total;
         i += (long long)gridDim.x * BLOCK_SIZE) {
        const SgdTensor t = table[find_tensor(table, tensors, i)];
        const long long j = i - t.offset;
        float step = __fmul_rn(t.grad[j], unscale) + weight_decay * t.param[j];  // _rn: never contracted
        if (t.velocity != nullptr) {
            step = momentum * t.velocity[j] + step;
            t.velocity[j] = step;
        }
        t.param[j] -= rate * step;
    }
}
