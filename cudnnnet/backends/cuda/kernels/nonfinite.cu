// Training bookkeeping, compiled at run time with NVRTC: the first step whose loss was not finite,
// recorded on the device at every step, so that no step waits on the host to check it.
//
// watch holds two int32 counts: [steps run, first step whose loss was NaN or ±inf (0: none yet)].
// The step counter lives here, not on the host, so a replayed CUDA graph keeps counting.
//
//   watch[0] += 1;  if watch[1] == 0 and loss[0] is not finite: watch[1] = watch[0]
extern "C" __global__ void record_nonfinite(int* watch, const float* loss) {
    if (blockIdx.x != 0 || threadIdx.x != 0) {
        return;
    }
    const int step = watch[0] + 1;
    watch[0] = step;
    if (watch[1] == 0 && !isfinite(loss[0])) {
        watch[1] = step;
    }
}
