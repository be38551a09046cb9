// cluster_split.cuh - a K split over a thread block cluster, for the warp-specialized Hopper GEMMs
// (384 threads: two consumer warpgroups, then a producer warpgroup) whose output tile would
// leave SMs idle: `split` consecutive blocks (one cluster) share one output tile, each takes a
// share of its K chunks, and at the end they sum their float32 partial tiles through
// distributed shared memory (no workspace, no second kernel). What the W4A16 wgmma kernel
// (gemm_w4a16_prepacked_wgmma_sm90.cu), the 2:4 sparse one (gemm_sparse_w4a16_wgmma_sm90.cu)
// and the W4A8 one (gemm_w4a8_sm90.cu) share: the output tiles and the busiest SM's rows that
// their plans weigh, the chunk ranges, the partial tiles' sum, the register split between the
// warpgroups, the cluster launch and its occupancy.
#pragma once

#include <atomic>

#include "kernels/core/common.cuh"
#include "kernels/core/ptx_sm90.cuh"

namespace ck {

constexpr int kSplitConsumerThreads = 256;  // two consumer warpgroups: threads 0 .. 255
constexpr int kSplitThreads = 384;          // and the producer warpgroup
constexpr int kMaxSplit = 8;                // blocks per output tile at most: the portable cluster

// A split a launcher takes: 1, 2, 4 or 8 blocks per output tile, at most max_split.
inline bool split_allowed(int split, int max_split = kMaxSplit) {
    return split >= 1 && split <= max_split && (split & (split - 1)) == 0;
}

// The output tiles of an m x n call in blocks of `rows` rows of x by `cols` output columns.
inline int64_t output_tiles(int64_t m, int64_t n, int rows, int cols) {
    return ceil_div(m, int64_t(rows)) * ceil_div(n, int64_t(cols));
}

// The rows of x that the busiest SM runs when the SMs take those tiles in turn, one at a time:
// what the launchers weigh one block shape against another by.
inline double busiest_sm_rows(int64_t m, int64_t n, int rows, int cols) {
    return double(ceil_div(output_tiles(m, n, rows, cols), int64_t(std::max(sm_count(), 1)))) *
           rows;
}

// A block's share of the K chunks when `split` blocks (a cluster) share one output tile: rank r
// of the cluster takes chunks [chunks r / split, chunks (r + 1) / split), possibly none.
struct ChunkRange {
    int begin, end;
};
__host__ __device__ inline ChunkRange split_chunks(int chunks, int split, int rank) {
    return {int(int64_t(chunks) * rank / split), int(int64_t(chunks) * (rank + 1) / split)};
}

// The registers of a 384-thread block at kBlocksPerSm blocks per SM: what ptxas gives each thread
// at launch (168 or 80), what the producer warpgroup keeps after setmaxnreg.dec (40 or 32), and
// what the two consumer warpgroups may raise theirs to (232 or 104): setmaxnreg moves registers
// between the warpgroups, never adds.
template <int kBlocksPerSm> struct SplitRegisters {
    static constexpr int kLaunch = 65536 / (kSplitThreads * kBlocksPerSm) / 8 * 8;
    static constexpr int kProducer = kBlocksPerSm == 1 ? 40 : 32;
    static constexpr int kConsumer =
        (kLaunch * kSplitThreads - kProducer * (kSplitThreads - kSplitConsumerThreads)) /
        kSplitConsumerThreads / 8 * 8;
    static_assert(kProducer * (kSplitThreads - kSplitConsumerThreads) +
                          kConsumer * kSplitConsumerThreads <= kLaunch * kSplitThreads,
                  "setmaxnreg moves registers, never adds");
};
static_assert(SplitRegisters<1>::kConsumer == 232 && SplitRegisters<2>::kConsumer == 104,
              "the consumer register counts the kernels' comments and ptxas notes give");

#ifdef CK_SM90A_DEVICE
// The consumers' side of the sum, after their last wgmma has retired and both consumer
// warpgroups are done with the shared memory at `smem` (the ring, reused): each consumer thread
// (ctid 0 .. 255) writes its kAcc accumulators there as [kAcc / 4][256] float4 (consecutive
// threads, consecutive 16 bytes; the thread at the same place in every block of the cluster
// holds the same outputs), then block `rank` sums the float4s j with j % split == rank (split a
// power of two) over the cluster's blocks in rank order (the result does not depend on which
// block sums) into acc, skipping the j whose 8 rows all lie past m (row0 + 8 j >= m). The
// producer warpgroup calls cluster_split_producer_wait instead: both pass two cluster barriers.
template <int kAcc>
__device__ __forceinline__ void cluster_split_sum(float (&acc)[kAcc], uint8_t* smem, int ctid,
                                                  int rank, int split, int64_t row0, int64_t m) {
    float4* partial = reinterpret_cast<float4*>(smem) + ctid;
#pragma unroll
    for (int j = 0; j < kAcc / 4; ++j)
        partial[j * kSplitConsumerThreads] =
            make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
    cluster_sync();
#pragma unroll
    for (int j = 0; j < kAcc / 4; ++j) {
        // Another block's rows, or none of the call's.
        if ((j & (split - 1)) != rank || row0 + 8 * j >= m) continue;
        const float4 sum = cluster_sum_f4(shared_address(partial + j * kSplitConsumerThreads),
                                          split);
        acc[4 * j] = sum.x, acc[4 * j + 1] = sum.y;
        acc[4 * j + 2] = sum.z, acc[4 * j + 3] = sum.w;
    }
    cluster_sync();  // no block leaves while another reads its shared memory
}

// The producer warpgroup's side: it stays for the consumers' two cluster barriers.
__device__ __forceinline__ void cluster_split_producer_wait() {
    cluster_sync();  // the partials are written ...
    cluster_sync();  // ... and read
}
#endif  // CK_SM90A_DEVICE

// The launch configuration of `blocks` blocks of kSplitThreads with `smem_bytes` of dynamic
// shared memory, in clusters of `split` consecutive blocks (none for 1), as a programmatic
// dependent of the stream's previous kernel when `dependent` (the kernel waits for it, see
// wait_for_prior_grid). Not copyable: the config points at the attributes.
struct ClusterLaunch {
    cudaLaunchAttribute attribute[2] = {};
    cudaLaunchConfig_t config = {};
    ClusterLaunch(int64_t blocks, int split, int smem_bytes, cudaStream_t stream,
                  bool dependent = false) {
        unsigned n = 0;
        if (split > 1) {
            attribute[n].id = cudaLaunchAttributeClusterDimension;
            attribute[n].val.clusterDim.x = unsigned(split);
            attribute[n].val.clusterDim.y = attribute[n].val.clusterDim.z = 1;
            ++n;
        }
        if (dependent) {
            attribute[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            attribute[n].val.programmaticStreamSerializationAllowed = 1;
            ++n;
        }
        config.gridDim = dim3(unsigned(blocks)), config.blockDim = dim3(kSplitThreads);
        config.dynamicSmemBytes = size_t(smem_bytes), config.stream = stream;
        config.attrs = attribute, config.numAttrs = n;
    }
    ClusterLaunch(const ClusterLaunch&) = delete;
    ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// How many blocks of `split`-block clusters of `kernel` (with smem_bytes of dynamic shared
// memory) the GPU runs at once (clusters fill a GPC's SMs only in whole clusters), cached in
// `cache` (the caller's static, one per kernel: split 1, 2, 4, 8 on up to 16 devices); 0 where
// the query fails.
struct ClusterOccupancyCache {
    std::atomic<int> slot[16][4];  // blocks + 1; 0: not asked yet (static storage starts zeroed)
};
template <class Kernel>
int cluster_blocks(Kernel kernel, int smem_bytes, int split, ClusterOccupancyCache& cache) {
    int device = 0, log2_split = 0;
    while ((2 << log2_split) <= split) ++log2_split;
    if (cudaGetDevice(&device) != cudaSuccess || device < 0 || log2_split >= 4) return 0;
    std::atomic<int>* slot = device < 16 ? &cache.slot[device][log2_split] : nullptr;
    if (slot && slot->load(std::memory_order_relaxed) > 0)
        return slot->load(std::memory_order_relaxed) - 1;
    int clusters = 0;
    if (allow_dynamic_smem(kernel, smem_bytes) == cudaSuccess) {
        const ClusterLaunch launch(split, split, smem_bytes, nullptr);
        if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch.config) != cudaSuccess) {
            (void)cudaGetLastError();  // a refused query is not the stream's error
            clusters = 0;
        }
    }
    if (slot) slot->store(clusters * split + 1, std::memory_order_relaxed);
    return clusters * split;
}

// The split of a call of `tiles` output tiles and `chunks` K chunks: what the environment
// variable `forced` says (1, 2, 4 or 8; for tests and benchmarks), else the largest of 2, 4 or 8
// whose blocks (tiles * split) all run at once (`blocks_at(s)`: cluster_blocks for split s) and
// still get min_chunks chunks each (a split block pays its pipeline's fill and the sum in
// distributed shared memory), else 1.
template <class BlocksAt>
int plan_split(const char* forced, int64_t tiles, int64_t chunks, int min_chunks,
               BlocksAt blocks_at) {
    if (const int split = forced_plan_value(forced, {1, 2, 4, 8})) return split;
    int split = 1;
    for (int s = 2; s <= kMaxSplit; s *= 2)
        if (chunks >= int64_t(min_chunks) * s && tiles * s <= blocks_at(s)) split = s;
    return split;
}

}  // namespace ck
