// y = f(y + b): a layer's bias and the activation after it in one pass, compiled with NVRTC
// (kernel.py). It replaces cudnnAddTensor (or the original's rank-1 cublasSgemm) followed by
// cudnnActivationForward: one read and one write of y instead of two of each.
//
// mode: cudnnActivationMode_t (0 sigmoid, 1 relu, 2 tanh, 3 clipped relu, 4 elu), or -1 for none;
// coef: the clipping threshold or ELU's alpha. b holds one value per channel.
//   y (N, C, H, W), b (C), positions = H·W

__device__ float activation(float x, int mode, float coef) {
    switch (mode) {
        case 0: return 1.f / (1.f + expf(-x));
        case 1: return fmaxf(x, 0.f);
        case 2: return tanhf(x);
        case 3: return fminf(fmaxf(x, 0.f), coef);
        case 4: return x > 0.f ? x : coef * expm1f(x);
        default: return x;
    }
}

extern "C" __global__ void bias_activation_forward(float* y, const float* b, long long count, int channels,
                                                   int positions, int mode, float coef) {
    for (long long i = (long long)blockIdx.x * BLOCK_SIZE + threadIdx.x; i < count;
         i += (long long)gridDim.x * BLOCK_SIZE) {
        const int channel = (int)((i / positions) % channels);
        y[i] = activation(y[i] + b[channel], mode, coef);
    }
}
