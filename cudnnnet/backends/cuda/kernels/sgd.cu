// One SGD step (PyTorch's formulation) in one launch, compiled at run time with NVRTC.
//
// The learning rate is read from device memory (`lr[0]`) when `lr` is not null, so a CUDA graph
// that captured this launch picks up a new rate written there before each replay; otherwise it is
// `lr_value`.
//
//   g = grad + weight_decay·param       (grad alone where weight_decay is 0: a non-finite param stays
//                                        what param - lr·grad makes of it, as on the host)
//   v = momentum·v + g;  g = v          (only when velocity != nullptr)
//   param = param - lr·g
//
//   sgd_update:     one value a thread and grid-stride step
//   sgd_update_x4:  four (float4 loads and stores; param, grad and velocity 16-byte aligned)

// param - lr·g for one value; velocity is read and written only where has_velocity.
__device__ __forceinline__ float sgd_step(float param, float grad, float& velocity, bool has_velocity, float rate,
                                          float momentum, float weight_decay) {
    float step = weight_decay != 0.f ? grad + weight_decay * param : grad;  // as the host: no 0·param
    if (has_velocity) {
        step = momentum * velocity + step;
        velocity = step;
    }
    return param - rate * step;
}

extern "C" __global__ void sgd_update(float* param, const float* grad, float* velocity, const float* lr,
                                      float lr_value, float momentum, float weight_decay, long long count) {
    const float rate = lr != nullptr ? lr[0] : lr_value;
    const bool has_velocity = velocity != nullptr;
    for (long long i = (long long)blockIdx.x * BLOCK_SIZE + threadIdx.x; i < count;
         i += (long long)gridDim.x * BLOCK_SIZE) {
        float v = has_velocity ? velocity[i] : 0.f;
        param[i] = sgd_step(param[i], grad[i], v, has_velocity, rate, momentum, weight_decay);
        if (has_velocity) velocity[i] = v;
    }
}

extern "C" __global__ void sgd_update_x4(float4* param, const float4* __restrict__ grad, float4* velocity,
                                         const float* lr, float lr_value, float momentum, float weight_decay,
                                         long long count4) {
    const float rate = lr != nullptr ? lr[0] : lr_value;
    const bool has_velocity = velocity != nullptr;
    for (long long i = (long long)blockIdx.x * BLOCK_SIZE + threadIdx.x; i < count4;
         i += (long long)gridDim.x * BLOCK_SIZE) {
        const float4 p = param[i], g = grad[i];
        float4 v = has_velocity ? velocity[i] : make_float4(0.f, 0.f, 0.f, 0.f);
        param[i] = make_float4(sgd_step(p.x, g.x, v.x, has_velocity, rate, momentum, weight_decay),
                               sgd_step(p.y, g.y, v.y, has_velocity, rate, momentum, weight_decay),
                               sgd_step(p.z, g.z, v.z, has_velocity, rate, momentum, weight_decay),
                               sgd_step(p.w, g.w, v.w, has_velocity, rate, momentum, weight_decay));
        if (has_velocity) velocity[i] = v;
    }
}
