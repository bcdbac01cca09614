// spin: one thread that keeps the stream busy for `nanoseconds` (the GPU's global timer), compiled
// at run time with NVRTC.
//
// A plan search queues spin, then a start event, then the calls it times, then an end event: the
// host has queued every call before the GPU reaches them, so they run back to back and the events
// measure the GPU's time for them, not the host's time to launch them.
extern "C" __global__ void spin(long long nanoseconds) {
    if (blockIdx.x != 0 || threadIdx.x != 0) {
        return;
    }
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < (unsigned long long)nanoseconds);
}
