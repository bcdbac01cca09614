// A convolution's bias gradient in one launch, compiled with NVRTC (kernel.py); channel_sum.py sizes
// the grid and owns the scratch.
//
//   db[c] = alpha·Σₙ Σₚ dy[n, c, p] + beta·db[c]      dy (N, C, P = H·W), db (C)
//
// With beta == 0, db is not read (a NaN there does not survive). The blend is rounded step by step
// (no fused multiply-add), as the host backend rounds it.
//
// Deterministic: the same bits on every launch, without float atomics. The N·P values of a channel,
// taken in the order j = n·P + p, are cut into ``chunks`` chunks of ``chunk_length``; block b sums
// chunk (b mod chunks) of channel (b / chunks) in a fixed order (each thread its values j ≡ thread
// (mod BLOCK_SIZE) in increasing order, then a fixed shuffle tree). With one chunk per channel the
// block writes db[c] itself. Otherwise it writes its sum to partials[b], and the last block to
// finish (an integer atomic counter, reset to 0 by that block for the next launch) adds the
// partials of each channel in a fixed order and writes db. Launches on the backend's one stream
// run one after another, so they can share partials and the counter.
//
// 32-bit indices: channel_sum.py checks that N·C·P + C·(UNROLL·BLOCK_SIZE + P) < 2^31, which
// bounds every offset computed here, including those a thread steps to past its last value.

#define WARP 32
#define WARPS (BLOCK_SIZE / WARP)
#define UNROLL 4  // values each thread loads before adding them (channel_sum.py: UNROLL)

#include "half.cuh"  // half_value: a 16-bit CNN's dy (channel_sum16)

__device__ __forceinline__ float load(float value, int) { return value; }
__device__ __forceinline__ float load(unsigned short bits, int format) { return half_value(bits, format); }

static_assert(BLOCK_SIZE % WARP == 0 && BLOCK_SIZE <= 1024, "BLOCK_SIZE must be a multiple of 32, at most 1024");

// The sum over the warp's lanes in a fixed order (a shuffle tree); valid in lane 0.
__device__ float warp_sum(float value) {
    for (int offset = WARP / 2; offset > 0; offset >>= 1) value += __shfl_down_sync(0xffffffffu, value, offset);
    return value;
}

// The sum over the block's threads in a fixed order; valid in thread 0. Every thread must call it.
__device__ float block_sum(float value) {
    __shared__ float warp_sums[WARPS];
    value = warp_sum(value);
    if (threadIdx.x % WARP == 0) warp_sums[threadIdx.x / WARP] = value;
    __syncthreads();
    float total = 0.f;
    if (threadIdx.x == 0)
        for (int w = 0; w < WARPS; ++w) total += warp_sums[w];
    return total;
}

// This thread's share of Σ dy[n, channel, p] over j = n·positions + p in [begin, end): the values
// j = begin + threadIdx.x + k·BLOCK_SIZE, added in increasing k. The offset of the next value is
// stepped without a division: BLOCK_SIZE values on is q samples and r positions on.
template <typename T>
__device__ float chunk_sum(const T* __restrict__ dy, int channel, int channels, int positions, int begin, int end,
                           int format) {
    const int sample_stride = channels * positions;
    const int q = BLOCK_SIZE / positions, r = BLOCK_SIZE - q * positions;
    const int step = q * sample_stride + r;
    int j = begin + threadIdx.x;
    const int n = j / positions;
    int p = j - n * positions;
    int offset = n * sample_stride + channel * positions + p;
    float sum = 0.f;
    for (; j < end; j += UNROLL * BLOCK_SIZE) {
        float loaded[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            loaded[u] = j + u * BLOCK_SIZE < end ? load(dy[offset], format) : 0.f;
            offset += step;
            p += r;
            if (p >= positions) {  // past the sample's last position: on to the next sample
                p -= positions;
                offset += sample_stride - positions;
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) sum += loaded[u];
    }
    return sum;
}

// alpha·sum + beta·old, each product and the sum rounded on its own; old is not read when beta == 0.
__device__ void blend(float* out, float alpha, float sum, float beta) {
    *out = beta == 0.f ? __fmul_rn(alpha, sum) : __fadd_rn(__fmul_rn(beta, *out), __fmul_rn(alpha, sum));
}

// The last block: db[c] from partials[c·chunks .. (c+1)·chunks), one warp per channel, each lane
// adding the partials k ≡ lane (mod 32) in increasing k, then a shuffle tree. The partials are read
// through volatile loads (past L1, which is not coherent across SMs).
__device__ void sum_partials(float* db, const volatile float* partials, float alpha, float beta, int channels,
                             int chunks) {
    const int lane = threadIdx.x % WARP;
    for (int channel = threadIdx.x / WARP; channel < channels; channel += WARPS) {
        float sum = 0.f;
        for (int k = lane; k < chunks; k += WARP) sum += partials[channel * chunks + k];
        sum = warp_sum(sum);
        if (lane == 0) blend(db + channel, alpha, sum, beta);
    }
}

// Launched with channels·chunks blocks of BLOCK_SIZE threads; partials holds at least that many
// floats; *counter is 0 before the launch and is left 0 after it.
template <typename T>
__device__ void channel_sum_of(float* db, const T* __restrict__ dy, float* partials, unsigned int* counter,
                               float alpha, float beta, int channels, int positions, int per_channel,
                               int chunk_length, int chunks, int format) {
    const int channel = blockIdx.x / chunks;
    const int begin = (blockIdx.x - channel * chunks) * chunk_length;
    const int end = min(per_channel, begin + chunk_length);
    const float sum = block_sum(chunk_sum(dy, channel, channels, positions, begin, end, format));
    if (chunks == 1) {
        if (threadIdx.x == 0) blend(db + channel, alpha, sum, beta);
        return;
    }
    __shared__ bool last;
    if (threadIdx.x == 0) {
        partials[blockIdx.x] = sum;
        __threadfence();  // the partial is visible to every block before the counter counts it
        last = atomicAdd(counter, 1u) == gridDim.x - 1;
        __threadfence();
    }
    __syncthreads();
    if (!last) return;
    sum_partials(db, partials, alpha, beta, channels, chunks);
    if (threadIdx.x == 0) *counter = 0;  // every block has counted: ready for the next launch
}

extern "C" __global__ void channel_sum(float* db, const float* __restrict__ dy, float* partials,
                                       unsigned int* counter, float alpha, float beta, int channels, int positions,
                                       int per_channel, int chunk_length, int chunks) {
    channel_sum_of(db, dy, partials, counter, alpha, beta, channels, positions, per_channel, chunk_length, chunks, 0);
}

// The same from a 16-bit CNN's dy of ``format`` (1 bfloat16, 2 IEEE half), each value exact in float; db float32.
extern "C" __global__ void channel_sum16(float* db, const unsigned short* __restrict__ dy, float* partials,
                                         unsigned int* counter, float alpha, float beta, int channels, int positions,
                                         int per_channel, int chunk_length, int chunks, int format) {
    channel_sum_of(db, dy, partials, counter, alpha, beta, channels, positions, per_channel, chunk_length, chunks,
                   format);
}
