// The gradient average between the GPUs of one host, through memory the peers map into each other
// (CUDA IPC over NVLink or PCIe), compiled with NVRTC. peer_reduce.py sets it up. Every rank r exports a
// mailbox:  flags[32] (u64, written by the peers) | acks[32] (u64, likewise) | inbox[slots][R][stride]
// floats, and keeps a PeerState. With s = state.step (the steps averaged so far, the same on every rank)
// and n the floats averaged a step:
//
// Two slots (small gradients: the push, on the step's own stream), slot = s mod 2:
//   peer_push:     inbox_q[slot][r] = g_r             for every peer q   (stores through the mapping,
//                                                     a group of blocks for each peer)
//                  flags_q[r] = s + 1                 once every block's stores are visible system-wide
//   peer_average:  once flags_r[q] >= s + 1 for every peer q, over all n floats (below)
// One slot (large gradients: the copy engines, on a side stream while the backward pass goes on):
//   peer_wait_acks: wait until acks_r[q] >= s         every peer q has averaged step s − 1 out of its
//                                                     inbox for r, so r may write it again
//   (cudaMemcpyAsync: inbox_q[0][r][range] = g_r[range] for every peer q, each range once it is computed)
//   peer_signal:    flags_q[r] = s·(n + 1) + c        after each copy, c the floats copied so far this step
//   peer_average:  one per range, in the order of the copies, once flags_r[q] >= s·(n + 1) + c_end for
//                  every peer q (c_end: the floats copied up to the end of this range). The ranks copy
//                  the same floats in the same order (their ranges may split it differently), so the
//                  peer's count says which floats have arrived. The last range's average ends the step.
// Both:
//   peer_average:  g_r[range] = scale · Σ_{q=0..R-1} (q == r ? g_r : inbox_r[slot][q])[range]   in rank
//                  order, so every rank computes the same sum bit for bit (or, given the optimiser's
//                  SgdStep, its step applied to that average: W, v updated and g_r left as it was);
//                  the step's last one sets
//                  state.step = s + 1                 by its last block, which with one slot also
//                  acks_q[r] = s + 1                  tells every peer q its inbox here is free
//
// Two slots: a peer that has gone on to the next step writes the other slot; to reach this slot again
// it must first pass its own peer_average of the next step, which waits for this rank's next push, which
// this rank's stream queues after this peer_average. One slot: a copy's address is fixed in a captured
// step, so the sender waits for the receiver's ack instead. A peer that is slow (rank 0 evaluating) is
// waited for as long as it takes, as NCCL would; one that is lost is the heartbeat's to notice: it ends
// the process, and the waiting kernel with it.

struct PeerState {
    unsigned long long step;  // steps averaged so far
    unsigned int pushed;      // blocks of this step's peer_push that are done
    unsigned int averaged;    // blocks of this step's peer_average that are done
};

// SGD as sgd_update_many.cu takes it (PyTorch's formulation), applied by peer_average to the average ā
// of each float it writes, W and v packed as the gradients (the same offsets):
//   s = ā + weight_decay·W;   v = momentum·v + s; s = v  (velocity not null);   W = W − lr[0]·s
struct SgdStep {
    float* values;      // W
    float* velocity;    // v, or nullptr without momentum
    const float* lr;    // the rate, read from device memory at every replay
    float momentum;
    float weight_decay;
};

#define FLAG_BYTES 256    // the flags' room at the start of a mailbox (32 ranks), then the acks'
#define HEADER_BYTES 512  // flags and acks, before the inboxes

// Message passing between GPUs: a release fence after the data, an acquire load of the flag before it.
__device__ void fence_release_system() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

__device__ void store_release_system(unsigned long long* address, unsigned long long value) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" :: "l"(address), "l"(value) : "memory");
}

__device__ unsigned long long load_acquire_system(const unsigned long long* address) {
    unsigned long long value;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(address) : "memory");
    return value;
}

__device__ float* inbox_of(unsigned long long mailbox, long long slot, int source, int world, long long stride) {
    return reinterpret_cast<float*>(mailbox + HEADER_BYTES) + (slot * world + source) * stride;
}

// Every block waits (its thread 0 polling) until flags_r[q] >= threshold for every peer q.
__device__ void wait_for_peers(unsigned long long mailbox, int rank, int world, unsigned long long threshold) {
    if (threadIdx.x == 0) {
        const unsigned long long* flags = reinterpret_cast<const unsigned long long*>(mailbox);
        for (int peer = 0; peer < world; ++peer) {
            while (peer != rank && load_acquire_system(flags + peer) < threshold) __nanosleep(32);
        }
    }
    __syncthreads();
}

// words_q[r] = value for every peer q, after a release fence: flags (offset 0) or acks (FLAG_BYTES).
__device__ void tell_peers(const unsigned long long* mailboxes, long long offset, int rank, int world,
                           unsigned long long value) {
    fence_release_system();
    for (int other = 0; other < world; ++other) {
        if (other == rank) continue;
        store_release_system(reinterpret_cast<unsigned long long*>(mailboxes[other] + offset) + rank, value);
    }
}

// Thread 0 of block 0: wait until acks_r[q] >= s for every peer q (q has averaged step s − 1 out of its inbox for r).
extern "C" __global__ void peer_wait_acks(const unsigned long long* mailboxes, int rank, int world,
                                          const PeerState* state) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const unsigned long long step = state->step;
    const unsigned long long* acks = reinterpret_cast<const unsigned long long*>(mailboxes[rank] + FLAG_BYTES);
    for (int peer = 0; peer < world; ++peer) {
        while (peer != rank && load_acquire_system(acks + peer) < step) __nanosleep(64);
    }
}

// Thread 0 of block 0, after a copy of step s (stream-ordered, so complete), ``copied`` floats copied so
// far this step: flags_q[r] = s·period + copied (period = n + 1, so the flags only grow).
extern "C" __global__ void peer_signal(const unsigned long long* mailboxes, int rank, int world,
                                       const PeerState* state, unsigned long long period, unsigned long long copied) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    tell_peers(mailboxes, 0, rank, world, state->step * period + copied);
}

// The grid (a multiple of world - 1 blocks) in world - 1 groups, block b in group b mod (world - 1),
// each group streaming the whole buffer to one peer; the last block to arrive raises the flags once
// every block's stores are visible system-wide.
extern "C" __global__ void peer_push(const float* __restrict__ gradients, long long count, long long stride,
                                     const unsigned long long* mailboxes, int rank, int world, PeerState* state) {
    const unsigned long long step = state->step;
    const int groups = world - 1, group = blockIdx.x % groups, peer = group < rank ? group : group + 1;
    const long long slot = (long long)(step & 1ull), vectors = count / 4;
    const long long first = (long long)(blockIdx.x / groups) * BLOCK_SIZE + threadIdx.x;
    const long long stride_group = (long long)(gridDim.x / groups) * BLOCK_SIZE;
    float* inbox = inbox_of(mailboxes[peer], slot, rank, world, stride);
    // inbox_q[slot][r] = g_r
    for (long long i = first; i < vectors; i += stride_group) {
        reinterpret_cast<float4*>(inbox)[i] = reinterpret_cast<const float4*>(gradients)[i];
    }
    for (long long i = 4 * vectors + first; i < count; i += stride_group) inbox[i] = gradients[i];
    fence_release_system();
    __syncthreads();
    if (threadIdx.x != 0 || atomicAdd(&state->pushed, 1u) != gridDim.x - 1) return;
    state->pushed = 0;
    // flags_q[r] = s + 1
    tell_peers(mailboxes, 0, rank, world, step + 1);
}

// g_r[i] = scale · Σ_q g_q[i] in rank order (inbox: this rank's inbox slot, sources ``stride`` apart).
__device__ float rank_order_average(const float* gradients, const float* inbox, long long i, int rank, int world,
                                    long long stride, float scale) {
    float sum = 0.f;
    for (int source = 0; source < world; ++source) {
        sum = __fadd_rn(sum, source == rank ? gradients[i] : __ldcg(inbox + source * stride + i));
    }
    return __fmul_rn(scale, sum);
}

__device__ float4 rank_order_average4(const float* gradients, const float* inbox, long long i, int rank, int world,
                                      long long stride, float scale) {
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int source = 0; source < world; ++source) {
        const float4 v = source == rank ? *reinterpret_cast<const float4*>(gradients + i)
                                        : __ldcg(reinterpret_cast<const float4*>(inbox + source * stride + i));
        sum.x = __fadd_rn(sum.x, v.x), sum.y = __fadd_rn(sum.y, v.y);
        sum.z = __fadd_rn(sum.z, v.z), sum.w = __fadd_rn(sum.w, v.w);
    }
    return make_float4(__fmul_rn(scale, sum.x), __fmul_rn(scale, sum.y), __fmul_rn(scale, sum.z),
                       __fmul_rn(scale, sum.w));
}

// g_r[i] = average (sgd null), or the SGD step of W[i] (and v[i]) with it.
__device__ void store_average(float* gradients, const SgdStep* sgd, float rate, long long i, float average) {
    if (sgd == nullptr) {
        gradients[i] = average;
        return;
    }
    float step = average + sgd->weight_decay * sgd->values[i];  // s = ā + wd·W
    if (sgd->velocity != nullptr) {
        step = sgd->momentum * sgd->velocity[i] + step;  // v = m·v + s
        sgd->velocity[i] = step;
    }
    sgd->values[i] -= rate * step;  // W = W − lr·s
}

__device__ void store_average4(float* gradients, const SgdStep* sgd, float rate, long long i, float4 average) {
    if (sgd == nullptr) {
        *reinterpret_cast<float4*>(gradients + i) = average;
        return;
    }
    float4 w = *reinterpret_cast<const float4*>(sgd->values + i);
    float4 step = make_float4(average.x + sgd->weight_decay * w.x, average.y + sgd->weight_decay * w.y,
                              average.z + sgd->weight_decay * w.z, average.w + sgd->weight_decay * w.w);
    if (sgd->velocity != nullptr) {
        const float4 v = *reinterpret_cast<const float4*>(sgd->velocity + i);
        const float m = sgd->momentum;
        step = make_float4(m * v.x + step.x, m * v.y + step.y, m * v.z + step.z, m * v.w + step.w);
        *reinterpret_cast<float4*>(sgd->velocity + i) = step;
    }
    w.x -= rate * step.x, w.y -= rate * step.y, w.z -= rate * step.z, w.w -= rate * step.w;
    *reinterpret_cast<float4*>(sgd->values + i) = w;
}

// Once flags_r[q] >= s·period + part for every peer q: for i in [offset, offset + count) (float4s from the
// first 16-byte boundary, single floats around them) ā = scale · Σ_q g_q[i] in rank order, stored in
// g_r[i], or with ``sgd`` not null its step applied to W[i] (and v[i]); with ``finish``, the last block to
// finish sets state.step = s + 1 and, with one slot, acks the inbox to every peer. The gradients, every
// inbox, W and v start 16-byte aligned.
extern "C" __global__ void peer_average(float* gradients, long long offset, long long count, long long stride,
                                        const unsigned long long* mailboxes, int rank, int world, int slots,
                                        float scale, PeerState* state, unsigned long long period,
                                        unsigned long long part, int finish, const SgdStep* sgd) {
    const unsigned long long step = state->step, mailbox = mailboxes[rank];
    wait_for_peers(mailbox, rank, world, step * period + part);
    const float* inbox = inbox_of(mailbox, (long long)(step % (unsigned long long)slots), 0, world, stride);
    const float rate = sgd != nullptr ? sgd->lr[0] : 0.f;
    const long long to_boundary = (4 - (offset & 3)) & 3;  // single floats before a 16-byte boundary
    const long long head = to_boundary < count ? to_boundary : count;
    const long long first_vector = offset + head, vectors = (count - head) / 4, end = offset + count;
    const long long first = (long long)blockIdx.x * BLOCK_SIZE + threadIdx.x;
    const long long stride_grid = (long long)gridDim.x * BLOCK_SIZE;
    for (long long v = first; v < vectors; v += stride_grid) {
        const long long i = first_vector + 4 * v;
        // ā[i..i+3] = scale · Σ_q g_q[i..i+3]
        store_average4(gradients, sgd, rate, i, rank_order_average4(gradients, inbox, i, rank, world, stride, scale));
    }
    for (long long i = offset + first; i < first_vector; i += stride_grid) {
        store_average(gradients, sgd, rate, i, rank_order_average(gradients, inbox, i, rank, world, stride, scale));
    }
    for (long long i = first_vector + 4 * vectors + first; i < end; i += stride_grid) {
        store_average(gradients, sgd, rate, i, rank_order_average(gradients, inbox, i, rank, world, stride, scale));
    }
    if (!finish) return;
    __syncthreads();
    if (threadIdx.x != 0) return;
    __threadfence();
    if (atomicAdd(&state->averaged, 1u) == gridDim.x - 1) {
        state->averaged = 0;
        state->step = step + 1;
        // acks_q[r] = s + 1   (every block has read its part of the inbox)
        if (slots == 1) tell_peers(mailboxes, FLAG_BYTES, rank, world, step + 1);
    }
}
