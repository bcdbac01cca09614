// ReLU backward in one launch, compiled with NVRTC (kernel.py), in place of cudnnActivationBackward
// in the fast engine (the slides engine calls cuDNN):
//
//   dx = alpha·(dy·[x > 0]) + beta·dx        x, dy, dx: count values each; [x > 0] is 1 or 0
//
// cuDNN's first cudnnActivationBackward of a process loads its kernel, a cost an MLP without other
// cuDNN calls avoids altogether. With beta == 0, dx is
// not read (a NaN there does not survive). As in the host backend (NumPy's dy * (x > 0)), dy is
// multiplied, not selected: a NaN or infinite dy gives NaN where x <= 0; a NaN x counts as x <= 0.
// The blend is rounded step by step (no fused multiply-add), as the host backend rounds it.

extern "C" __global__ void relu_backward(float* dx, const float* __restrict__ x, const float* __restrict__ dy,
                                         float alpha, float beta, long long count) {
    for (long long i = (long long)blockIdx.x * BLOCK_SIZE + threadIdx.x; i < count; i += (long long)gridDim.x * BLOCK_SIZE) {
        const float routed = __fmul_rn(alpha, __fmul_rn(dy[i], x[i] > 0.f ? 1.f : 0.f));
        dx[i] = beta == 0.f ? routed : __fadd_rn(__fmul_rn(beta, dx[i]), routed);
    }
}
