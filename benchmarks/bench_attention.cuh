// benchmarks/bench_attention.cuh - family "attention": decode attention over a KV cache
// (ck_attention_decode, split-KV plus the combine) against the copy bandwidth.
//
// Problems: fp16, Hq = 32 query heads over Hkv = 8 kv heads, D = 128, one new token per
// sequence, (batch, KV length) = (1, 4096), (16, 4096), (64, 2048), (1, 32768) (--quick: the
// first two), every sequence of the full length. Rows of each: a contiguous cache [B, KV, Hkv, D]
// and paged caches of 16- and 64-key pages (the block table a random permutation of the pages,
// so that a sequence's pages are scattered as a serving engine's are). Splits: the library's
// automatic rule (the note gives the count).
// Floor: `bytes` is the K and V bytes of the sequences (tests/reference.py
// attention_decode_kv_bytes: B KV Hkv D 2 x 2 bytes) plus q and out; the block table and the
// partials are not counted. "% copy" is that at the measured copy bandwidth: the target of a
// memory-bound decode kernel.
// Timing: each row replays a CUDA graph of one call (the split kernel and the combine), as a
// serving engine does; copies of every buffer are rotated so that each call reads its K and V
// from DRAM (rotation_copies: twice L2 of traffic between two uses of a byte).
#pragma once

#include <iterator>
#include <numeric>
#include <random>

#include "bench.cuh"

namespace attention_bench {

struct Problem {
    int64_t batch, kv_len;
};
constexpr Problem kProblems[] = {{1, 4096}, {16, 4096}, {64, 2048}, {1, 32768}};
constexpr int kQuickProblems = 2;
constexpr int64_t kHeadsQ = 32, kHeadsKv = 8, kHeadDim = 128, kNewTokens = 1;
constexpr int64_t kPageSizes[] = {0, 16, 64};  // 0: the contiguous cache
constexpr ck_dtype_t kDtype = CK_DTYPE_FP16;

// One copy of a call's buffers and its captured graph.
struct Copy {
    DeviceBuffer q, k, v, out, seqlens, table, workspace;
    cudaGraphExec_t graph = nullptr;
};

inline std::string layout_name(int64_t page_size) {
    return page_size == 0 ? "contiguous" : "paged" + std::to_string(page_size);
}

inline void run_problem(Bench& bench, const Problem& problem, int64_t page_size) {
    RowSpec spec;
    spec.family = "attention";
    spec.kernel = "decode " + layout_name(page_size);
    spec.dtype = "fp16";
    spec.shape = "B=" + std::to_string(problem.batch) + " KV=" + std::to_string(problem.kv_len) +
                 " Hq=32 Hkv=8 D=128";
    if (!bench.wants(spec)) return;

    const int64_t batch = problem.batch, kv = problem.kv_len;
    const int64_t kv_bytes = batch * kv * kHeadsKv * kHeadDim * 2 * 2;
    const int64_t q_bytes = batch * kNewTokens * kHeadsQ * kHeadDim * 2;
    spec.bytes = double(kv_bytes + 2 * q_bytes);
    const int64_t pages_per_seq = page_size ? (kv + page_size - 1) / page_size : 0;
    const int64_t num_pages = batch * pages_per_seq;

    ck_attention_decode_params_t p = {sizeof(p)};
    p.dtype = kDtype;
    p.batch = batch, p.seqlen_q = kNewTokens, p.num_heads_q = kHeadsQ;
    p.num_heads_kv = kHeadsKv, p.head_dim = kHeadDim, p.max_seqlen_k = kv;
    if (page_size) {
        p.block_table = reinterpret_cast<const int32_t*>(uintptr_t(256));  // a flag for the query
        p.num_pages = num_pages, p.page_size = page_size, p.max_blocks_per_seq = pages_per_seq;
    }
    size_t ws_bytes = 0;
    CK_BENCH_CHECK(ck_attention_decode_workspace_size(&p, &ws_bytes));

    const int copies = bench.rotation_copies(spec.bytes, spec.bytes);
    spec.copies = copies;
    std::vector<Copy> sets(copies);
    std::mt19937 rng(1234);
    const std::vector<int32_t> lengths(batch, int32_t(kv));
    cudaStream_t stream = bench.stream();
    for (int c = 0; c < copies; ++c) {
        Copy& s = sets[c];
        s.q = DeviceBuffer(q_bytes);
        s.out = DeviceBuffer(q_bytes);
        s.k = DeviceBuffer(kv_bytes / 2);
        s.v = DeviceBuffer(kv_bytes / 2);
        s.seqlens = DeviceBuffer(batch * 4);
        s.workspace = DeviceBuffer(std::max<size_t>(ws_bytes, 256));
        fill_uniform(s.q.as(), kDtype, q_bytes / 2, 3 * c + 1, -1.f, 1.f, stream);
        fill_uniform(s.k.as(), kDtype, kv_bytes / 4, 3 * c + 2, -1.f, 1.f, stream);
        fill_uniform(s.v.as(), kDtype, kv_bytes / 4, 3 * c + 3, -1.f, 1.f, stream);
        CK_BENCH_CHECK(cudaMemcpyAsync(s.seqlens.as(), lengths.data(), batch * 4,
                                       cudaMemcpyHostToDevice, stream));
        if (page_size) {
            std::vector<int32_t> table(num_pages);
            std::iota(table.begin(), table.end(), 0);
            std::shuffle(table.begin(), table.end(), rng);
            s.table = DeviceBuffer(num_pages * 4);
            CK_BENCH_CHECK(cudaMemcpyAsync(s.table.as(), table.data(), num_pages * 4,
                                           cudaMemcpyHostToDevice, stream));
        }
        CK_BENCH_CHECK(cudaStreamSynchronize(stream));  // the host vectors outlive the copies

        ck_attention_decode_params_t call = p;
        call.q = s.q.as(), call.k_cache = s.k.as(), call.v_cache = s.v.as();
        call.seqlens_k = s.seqlens.as<int32_t>(), call.out = s.out.as();
        call.block_table = page_size ? s.table.as<int32_t>() : nullptr;
        CK_BENCH_CHECK(ck_attention_decode(&call, s.workspace.as(), s.workspace.bytes(),
                                           stream));  // once directly: errors surface here
        CK_BENCH_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        CK_BENCH_CHECK(ck_attention_decode(&call, s.workspace.as(), s.workspace.bytes(),
                                           stream));
        cudaGraph_t graph = nullptr;
        CK_BENCH_CHECK(cudaStreamEndCapture(stream, &graph));
        CK_BENCH_CHECK(cudaGraphInstantiate(&s.graph, graph, 0));
        CK_BENCH_CHECK(cudaGraphDestroy(graph));
    }
    CK_BENCH_CHECK(cudaStreamSynchronize(stream));

    Row* row = bench.run(spec, [&](int iteration) {
        CK_BENCH_CHECK(cudaGraphLaunch(sets[size_t(iteration) % sets.size()].graph, stream));
    });
    if (row) {
        // The splits the library chose: 0 workspace bytes is one split, else the workspace
        // formula's O_s and lse_s (their 256-byte padding is less than one split's share).
        const int64_t rows = batch * kNewTokens * kHeadsQ;
        const int64_t splits = ws_bytes == 0 ? 1 : int64_t(ws_bytes) / (rows * (kHeadDim + 1) * 4);
        Bench::append_note(*row, format("%.0f%% copy on K/V bytes", bench.percent_of_copy(
                                            double(kv_bytes), row->time.median_us)));
        Bench::append_note(*row, std::to_string(splits) + " splits");
    }
    for (Copy& s : sets) CK_BENCH_CHECK(cudaGraphExecDestroy(s.graph));
}

}  // namespace attention_bench

inline void bench_attention(Bench& bench, const Options& options) {
    using namespace attention_bench;
    const int count = options.quick ? kQuickProblems : int(std::size(kProblems));
    for (int i = 0; i < count; ++i)
        for (int64_t page_size : kPageSizes) run_problem(bench, kProblems[i], page_size);
}
