// One SGD step (PyTorch's formulation) in one launch, compiled at run time with NVRTC.
//
// The learning rate is read from device memory (`lr[0]`), so a CUDA graph that captured this
// launch picks up a new rate written there before each replay.
//
//   g = grad + weight_decay·param
//   v = momentum·v + g;  g = v          (only when velocity != nullptr)
//   param = param - lr·g
extern "C" __global__ void sgd_update(float* param, const float* grad, float* velocity, const float* lr,
                                      float momentum, float weight_decay, long long count) {
    const float rate = lr[0];
    for (long long i = (long long)blockIdx.x * BLOCK_SIZE + threadIdx.x; i < count;
         i += (long long)gridDim.x * BLOCK_SIZE) {
        float step = grad[i] + weight_decay * param[i];
        if (velocity != nullptr) {
            step = momentum * velocity[i] + step;
            velocity[i] = step;
        }
        param[i] -= rate * step;
    }
}
