// Dynamic loss scaling of ``math: fp16`` (cudnnnet/optim/loss_scaling.py), compiled with NVRTC: the
// overflow check, the scale's update and the skipped step stay on the device, so that a captured
// CUDA graph runs them at every replay and no step waits on the host.
//
// `state` holds six float32 values (loss_scaling.py names them):
//   [0] S        the scale the next step's loss gradient is multiplied by
//   [1] found    1 where find_nonfinite_gradients met an inf or NaN this step (0 between steps)
//   [2] skip     1 where this step's update is skipped (its gradients overflowed)
//   [3] unscale  1/S of the scale this step's gradients carry
//   [4] clean    steps in a row without overflow since S last changed (exact below 2^24)
//   [5] skipped  steps skipped so far (exact below 2^24)
//
// A step: dJ/dŷ·S → backward → find_nonfinite_gradients → update_loss_scale → the optimiser, which
// reads skip and unscale (sgd_update_many.cu, adam_update_many.cu, or the cuBLAS SGD through
// sgd_scaled_coefficients).

#define SCALE 0
#define FOUND 1
#define SKIP 2
#define UNSCALE 3
#define CLEAN 4
#define SKIPPED 5

// found = 1 where any grad[i] is inf or NaN; those values are set to 0, so that the cuBLAS SGD of a
// skipped step (coefficients 0 and 1, sgd_scaled_coefficients) multiplies no infinity by 0.
extern "C" __global__ void find_nonfinite_gradients(float* grad, long long count, float* state) {
    int found = 0;
    for (long long i = (long long)blockIdx.x * BLOCK_SIZE + threadIdx.x; i < count; i += (long long)gridDim.x * BLOCK_SIZE) {
        if (!isfinite(grad[i])) {
            grad[i] = 0.0f;
            found = 1;
        }
    }
    if (__syncthreads_or(found) && threadIdx.x == 0) {
        state[FOUND] = 1.0f;  // every block that finds one writes the same value
    }
}

// One thread, after find_nonfinite_gradients and before the optimiser:
//   skip = found;  unscale = 1/S
//   found:  S = max(S/2, min_scale);  clean = 0;  skipped += 1
//   else:   clean += 1;  where clean == growth_interval: S = min(2·S, max_scale), clean = 0
//   found = 0
extern "C" __global__ void update_loss_scale(float* state, float growth_interval, float min_scale, float max_scale) {
    if (blockIdx.x != 0 || threadIdx.x != 0) {
        return;
    }
    const float scale = state[SCALE];
    const bool found = state[FOUND] != 0.0f;
    state[SKIP] = found ? 1.0f : 0.0f;
    state[UNSCALE] = 1.0f / scale;
    if (found) {
        state[SCALE] = fmaxf(0.5f * scale, min_scale);
        state[CLEAN] = 0.0f;
        state[SKIPPED] += 1.0f;
    } else {
        const float clean = state[CLEAN] + 1.0f;
        const bool grow = clean >= growth_interval;
        state[SCALE] = grow ? fminf(2.0f * scale, max_scale) : scale;
        state[CLEAN] = grow ? 0.0f : clean;
    }
    state[FOUND] = 0.0f;
}

// One thread: the device scalars of the cuBLAS SGD (the slides engine) of a loss-scaled step, where
// rate = lr[0] (lr not null) or lr_value, u = unscale; a skipped step gets 1 and 0 throughout, so that
// it leaves weights and velocities as they were:
//   out[0] = momentum        v = out[0]·v
//   out[1] = u               v += out[1]·g
//   out[2] = weight_decay    v += out[2]·param
//   out[3] = -rate           param += out[3]·v
//   out[4] = 1 - rate·wd     param = out[4]·param     (no momentum)
//   out[5] = -rate·u         param += out[5]·g        (no momentum)
extern "C" __global__ void sgd_scaled_coefficients(float* out, const float* lr, float lr_value, const float* state,
                                                   float momentum, float weight_decay) {
    if (blockIdx.x != 0 || threadIdx.x != 0) {
        return;
    }
    const float rate = lr != nullptr ? lr[0] : lr_value;
    const float unscale = state[UNSCALE];
    const bool skip = state[SKIP] != 0.0f;
    out[0] = skip ? 1.0f : momentum;
    out[1] = skip ? 0.0f : unscale;
    out[2] = skip ? 0.0f : weight_decay;
    out[3] = skip ? 0.0f : -rate;
    out[4] = skip ? 1.0f : fmaf(-weight_decay, rate, 1.0f);  // as cublasSaxpy makes it unscaled: 1 + (-wd)·lr
    out[5] = skip ? 0.0f : -rate * unscale;
}
