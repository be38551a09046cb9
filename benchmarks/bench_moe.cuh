// benchmarks/bench_moe.cuh - family "moe": the whole Mixture-of-Experts feed-forward layer
// (ck_moe_forward: routing, grouping by expert, gate+up with SwiGLU, down, combine) on INT4
// experts, beside the dense fp16 pipelines a user runs without it, on the same run.
//
// Problems: the two MoE models of DESIGN.md section 4 (Mixtral-8x7B: E = 8, top-2, H = 4096,
// I = 14336, renormalized weights; a many-small-experts model: E = 64, top-6, H = 2048, I = 1408,
// weights not renormalized) at T tokens (--quick: the small model at two T; --size does not
// apply). fp16 activations, symmetric INT4 experts in groups of 128 along the input dimension.
// Rows of each (model, T):
//   ck_moe_forward int4 g128     the layer from router logits (fp32) to out, on w13 [E, 2I, H]
//                                and w2 [E, H, I] put through ck_moe_prepack once, outside timing.
//                                Baseline "naive fp16" (the row below, timed once).
//   naive fp16 (...)             the layer as a plain loop over experts on the dequantized fp16
//                                weights: per active expert, gather its tokens, cublasGemmEx for
//                                gate+up [rows, 2I], silu(g) * u, cublasGemmEx for down, and a
//                                scatter-add with the routing weight into an fp32 [T, H] buffer;
//                                then one conversion to fp16. Routing is computed on the host at
//                                setup (the expert loop needs the counts on the host).
//   cuBLAS grouped fp16 (...)    the same on cublasGemmGroupedBatchedEx (cuBLAS >= 12.5): one
//                                gather of every pair in expert order, one grouped GEMM over the
//                                active experts for gate+up, silu(g) * u, one grouped GEMM for
//                                down, one combine kernel (out[t] = sum_j w[t, j] y[t, j]).
// Every row times one replay of a CUDA graph per call: each sequence is run once directly (its
// output compared with the naive one: ||out - naive|| / ||naive|| in the notes and the summary,
// a check, not a target), then captured once per rotation copy, so that host
// launch overhead (the naive loop launches 5 kernels per expert) is out of the comparison, as in
// a serving engine that replays graphs. A sequence that cannot be captured is timed as direct
// launches, and its note says so.
// Floor: every row's `bytes` is its minimum DRAM traffic: the weights of the experts that the
// routing activates (an expert is active if any pair routes to it; ours: prepacked INT4 +
// scales, as ck_moe_prepacked_bytes/_groups size them; the baselines: fp16) + x + out (ours also
// the router logits). The floor of the layer is ours' bytes at the measured copy bandwidth: the
// summary table gives it in us, and ours' "% copy" is floor / time. flops = 2 * T * k * 3 * H * I
// (the intermediate h and the per-pair outputs are not counted: a fused layer need not write
// them; at large T the layer is compute-bound and the TFLOP/s column is the one to read).
// Rotation: the weights are the big operand. Copies of the expert weights (INT4 and fp16) are
// rotated so that each call's active weights come from DRAM (only the small model at small T
// needs more than one: its T = 1 touches 6 experts, ~26 MB in INT4); x, logits and out are one
// buffer per problem, and the routing is the same for every copy.
#pragma once

#include <numeric>
#include <optional>

#include "bench.cuh"

// cublasGemmGroupedBatchedEx appeared in cuBLAS 12.5.
#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120500
#define CK_BENCH_HAVE_GROUPED_GEMM 1
#else
#define CK_BENCH_HAVE_GROUPED_GEMM 0
#endif

namespace moe_bench {

struct Model {
    const char* name;  // the rows' shape is "<name> T=<tokens>"
    int64_t experts, top_k, hidden, intermediate;
    bool renormalize;  // divide the k routing weights by their sum (Mixtral does; the small
                       // model's shape is DeepSeek-V2-Lite's routed experts, which do not)
};

constexpr Model kModels[] = {
    {"mixtral", 8, 2, 4096, 14336, true},
    {"e64-top6", 64, 6, 2048, 1408, false},
};
constexpr int64_t kTokens[] = {1, 16, 128, 1024, 4096};
constexpr int kQuickModel = 1;  // --quick: the small model only, at these T
constexpr int64_t kQuickTokens[] = {1, 16};

constexpr ck_dtype_t kDtype = CK_DTYPE_FP16;
constexpr int64_t kGroupSize = 128;
constexpr ck_int4_mode_t kMode = CK_INT4_SYMMETRIC;
constexpr ck_dtype_t kRouterDtype = CK_DTYPE_FP32;

// Random data with unit-variance products: x uniform in +-sqrt(3) (variance 1), each weight of
// a projection with K inputs uniform in +-sqrt(3 / K) (K terms of variance 1 / K), so that g, u,
// h and y have variance ~1 and fp16 stays far from its limits. The INT4 weights are
// ck_quantize_int4 of those; the fp16 baselines use exactly their dequantized values.
constexpr float kUnitVarianceBound = 1.7320508f;  // sqrt(3)
// Router logits uniform in +-kLogitAbsMax: softmax probabilities spread enough that the top k
// are well separated, and the load spreads evenly over the experts.
constexpr float kLogitAbsMax = 2.0f;

constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;  // cuBLAS's recommendation for sm_90

// The elementwise kernels of the baselines move 16 bytes (8 fp16) per thread: H and I must be
// multiples of kVec, and one grid row per matrix row limits the rows to kMaxGridRows.
constexpr int kThreads = 256;
constexpr int kVec = 8;
static_assert(kVec == 8, "a thread's columns are one 16-byte vector of fp16 (pack_half8)");
constexpr int64_t kMaxGridRows = 65535;

// ------------------------------------------------------------------------------------------------
// Host-side random logits and routing (the same arithmetic as ck_moe_route's contract: float32
// softmax, the k largest probabilities with ties to the lower expert, optional renormalization).
// ------------------------------------------------------------------------------------------------
inline float host_uniform(uint64_t seed, int64_t i, float lo, float hi) {
    return lo + (hi - lo) * bench_detail::uniform01(seed, i);
}

// The routing of one problem and its pairs (t, j) grouped by expert: what the dense baselines
// need on the host to size their calls, and on the device to gather and combine.
struct Routing {
    int64_t tokens = 0, top_k = 0, pairs = 0;
    std::vector<int32_t> ids;             // [T, k]
    std::vector<float> weights;           // [T, k]
    std::vector<int64_t> expert_rows;     // [E] pairs routed to expert e
    std::vector<int64_t> expert_offset;   // [E] its first row in expert order
    std::vector<int32_t> active;          // experts with at least one pair, ascending
    std::vector<int32_t> pair_token;      // [pairs] token of each row in expert order
    std::vector<float> pair_weight;       // [pairs] its routing weight
    std::vector<int32_t> row_of_pair;     // [T * k] row (in expert order) of pair t * k + j
};

inline Routing route_on_host(const std::vector<float>& logits, const Model& m, int64_t tokens) {
    Routing r;
    r.tokens = tokens;
    r.top_k = m.top_k;
    r.pairs = tokens * m.top_k;
    r.ids.resize(size_t(r.pairs));
    r.weights.resize(size_t(r.pairs));
    std::vector<float> p(size_t(m.experts));
    std::vector<int32_t> order(size_t(m.experts));
    for (int64_t t = 0; t < tokens; ++t) {
        const float* l = logits.data() + t * m.experts;
        const float max_logit = *std::max_element(l, l + m.experts);
        float sum = 0;
        for (int64_t e = 0; e < m.experts; ++e) sum += p[size_t(e)] = std::exp(l[e] - max_logit);
        for (float& v : p) v /= sum;
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + m.top_k, order.end(),
                          [&](int32_t a, int32_t b) {
                              return p[size_t(a)] > p[size_t(b)] ||
                                     (p[size_t(a)] == p[size_t(b)] && a < b);
                          });
        float kept = 0;
        for (int64_t j = 0; j < m.top_k; ++j) kept += p[size_t(order[size_t(j)])];
        for (int64_t j = 0; j < m.top_k; ++j) {
            const int32_t e = order[size_t(j)];
            r.ids[size_t(t * m.top_k + j)] = e;
            r.weights[size_t(t * m.top_k + j)] = m.renormalize ? p[size_t(e)] / kept : p[size_t(e)];
        }
    }
    // Rows in expert order, tokens ascending within an expert.
    r.expert_rows.assign(size_t(m.experts), 0);
    for (int32_t e : r.ids) ++r.expert_rows[size_t(e)];
    r.expert_offset.assign(size_t(m.experts), 0);
    for (int64_t e = 1; e < m.experts; ++e)
        r.expert_offset[size_t(e)] = r.expert_offset[size_t(e - 1)] + r.expert_rows[size_t(e - 1)];
    for (int64_t e = 0; e < m.experts; ++e)
        if (r.expert_rows[size_t(e)] > 0) r.active.push_back(int32_t(e));
    r.pair_token.resize(size_t(r.pairs));
    r.pair_weight.resize(size_t(r.pairs));
    r.row_of_pair.resize(size_t(r.pairs));
    std::vector<int64_t> next = r.expert_offset;
    for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t j = 0; j < m.top_k; ++j) {
            const int64_t pair = t * m.top_k + j;
            const int64_t row = next[size_t(r.ids[size_t(pair)])]++;
            r.pair_token[size_t(row)] = int32_t(t);
            r.pair_weight[size_t(row)] = r.weights[size_t(pair)];
            r.row_of_pair[size_t(pair)] = int32_t(row);
        }
    }
    return r;
}

// ------------------------------------------------------------------------------------------------
// The baselines' own kernels: memory-bound, 16 bytes per thread, one grid row per matrix row
// (rows of `cols` fp16, cols % kVec == 0, 16-byte aligned rows).
// ------------------------------------------------------------------------------------------------
__device__ inline int64_t vec_column() {
    return (int64_t(blockIdx.x) * kThreads + threadIdx.x) * kVec;
}

// out[r, :] = x[token[r], :]
__global__ void __launch_bounds__(kThreads)
    gather_rows_kernel(const __half* __restrict__ x, const int32_t* __restrict__ token,
                       int64_t cols, __half* __restrict__ out) {
    const int64_t c = vec_column();
    if (c >= cols) return;
    const int64_t r = blockIdx.y;
    *reinterpret_cast<uint4*>(out + r * cols + c) =
        *reinterpret_cast<const uint4*>(x + int64_t(token[r]) * cols + c);
}

// h[r, :] = fp16(silu(g) * u) with g = gate_up[r, 0 .. I-1], u = gate_up[r, I .. 2I-1], from
// the fp16 GEMM output (silu(g) = g / (1 + exp(-g)), in float32).
__global__ void __launch_bounds__(kThreads)
    swiglu_kernel(const __half* __restrict__ gate_up, int64_t inter, __half* __restrict__ h) {
    const int64_t c = vec_column();
    if (c >= inter) return;
    const int64_t r = blockIdx.y;
    const uint4 g_raw = *reinterpret_cast<const uint4*>(gate_up + r * 2 * inter + c);
    const uint4 u_raw = *reinterpret_cast<const uint4*>(gate_up + r * 2 * inter + inter + c);
    *reinterpret_cast<uint4*>(h + r * inter + c) = pack_half8([&](int i) {
        const float2 gf = half8_pair(g_raw, i), uf = half8_pair(u_raw, i);
        return make_float2(gf.x / (1.f + expf(-gf.x)) * uf.x, gf.y / (1.f + expf(-gf.y)) * uf.y);
    });
}

// acc[token[r], :] += weight[r] * y[r, :]. The rows of one launch (one expert) name distinct
// tokens, and launches run in stream order, so plain read-modify-writes do not race.
__global__ void __launch_bounds__(kThreads)
    scatter_add_kernel(const __half* __restrict__ y, const int32_t* __restrict__ token,
                       const float* __restrict__ weight, int64_t cols, float* __restrict__ acc) {
    const int64_t c = vec_column();
    if (c >= cols) return;
    const int64_t r = blockIdx.y;
    const float w = weight[r];
    const uint4 y_raw = *reinterpret_cast<const uint4*>(y + r * cols + c);
    float4* a = reinterpret_cast<float4*>(acc + int64_t(token[r]) * cols + c);
    float4 a0 = a[0], a1 = a[1];
    const float2 y0 = half8_pair(y_raw, 0), y1 = half8_pair(y_raw, 1);
    const float2 y2 = half8_pair(y_raw, 2), y3 = half8_pair(y_raw, 3);
    a0.x += w * y0.x; a0.y += w * y0.y; a0.z += w * y1.x; a0.w += w * y1.y;
    a1.x += w * y2.x; a1.y += w * y2.y; a1.z += w * y3.x; a1.w += w * y3.y;
    a[0] = a0;
    a[1] = a1;
}

// out[t, :] = fp16(acc[t, :])
__global__ void __launch_bounds__(kThreads)
    to_half_kernel(const float* __restrict__ acc, int64_t cols, __half* __restrict__ out) {
    const int64_t c = vec_column();
    if (c >= cols) return;
    const int64_t offset = int64_t(blockIdx.y) * cols + c;
    const float4 a0 = *reinterpret_cast<const float4*>(acc + offset);
    const float4 a1 = *reinterpret_cast<const float4*>(acc + offset + 4);
    const float2 v[4] = {{a0.x, a0.y}, {a0.z, a0.w}, {a1.x, a1.y}, {a1.z, a1.w}};
    *reinterpret_cast<uint4*>(out + offset) = pack_half8([&](int i) { return v[i]; });
}

// out[t, :] = fp16(sum_{j < k} weight[t k + j] * y[row_of_pair[t k + j], :]), j in order (the
// header's combine order), float32 sums.
__global__ void __launch_bounds__(kThreads)
    combine_kernel(const __half* __restrict__ y, const int32_t* __restrict__ row_of_pair,
                   const float* __restrict__ weight, int top_k, int64_t cols,
                   __half* __restrict__ out) {
    const int64_t c = vec_column();
    if (c >= cols) return;
    const int64_t t = blockIdx.y;
    float sum[kVec] = {};
    for (int j = 0; j < top_k; ++j) {
        const int64_t pair = t * top_k + j;
        const float w = weight[pair];
        const uint4 y_raw =
            *reinterpret_cast<const uint4*>(y + int64_t(row_of_pair[pair]) * cols + c);
#pragma unroll
        for (int i = 0; i < kVec / 2; ++i) {
            const float2 v = half8_pair(y_raw, i);
            sum[2 * i] += w * v.x;
            sum[2 * i + 1] += w * v.y;
        }
    }
    *reinterpret_cast<uint4*>(out + t * cols + c) =
        pack_half8([&](int i) { return make_float2(sum[2 * i], sum[2 * i + 1]); });
}

inline dim3 row_grid(int64_t cols, int64_t rows) {
    const int64_t chunks = cols / kVec;
    return dim3(unsigned((chunks + kThreads - 1) / kThreads), unsigned(rows));
}

// ------------------------------------------------------------------------------------------------
// What the family shares: its own cuBLAS handle on the bench stream, with a workspace set once so
// that no cuBLAS call allocates during a capture (the bench's shared handle stays untouched).
// ------------------------------------------------------------------------------------------------
struct Context {
    Bench& bench;
    bool quick;
    cublasHandle_t cublas = nullptr;
    DeviceBuffer cublas_workspace{kCublasWorkspaceBytes};

    Context(Bench& b, bool q) : bench(b), quick(q) {
        CK_BENCH_CHECK(cublasCreate(&cublas));
        CK_BENCH_CHECK(cublasSetStream(cublas, bench.stream()));
        CK_BENCH_CHECK(cublasSetWorkspace(cublas, cublas_workspace.as(), cublas_workspace.bytes()));
    }
    ~Context() { cublasDestroy(cublas); }
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;
};

// ------------------------------------------------------------------------------------------------
// The expert weights of one model, in rotation copies. Each copy: random fp16 weights,
// ck_quantize_int4 (expert by expert) into the interchange format, ck_dequantize_int4 back into
// the fp16 buffer (so the baselines compute on exactly the INT4 weights' values), ck_moe_prepack
// of the whole [E, n, k] tensor. The interchange weights are scratch.
// ------------------------------------------------------------------------------------------------
struct WeightCopy {
    DeviceBuffer w13, w13_scales;  // prepacked gate+up: ck_moe_prepacked_bytes(E, 2I, H), groups
    DeviceBuffer w2, w2_scales;    // prepacked down: ck_moe_prepacked_bytes(E, H, I), groups
    DeviceBuffer w13_dense;        // [E, 2I, H] fp16: rows 0 .. I-1 gate, I .. 2I-1 up
    DeviceBuffer w2_dense;         // [E, H, I] fp16
};

class ModelWeights {
  public:
    ModelWeights(Bench& bench, const Model& model, int index)
        : bench_(bench), m_(model), index_(index) {}

    // One expert's prepacked INT4 weights + scales (both projections), and its fp16 weights.
    double int4_expert_bytes() {
        query_sizes();
        return (double(w13_bytes_) + double(w2_bytes_) +
                sizeof(__half) * double(w13_groups_ + w2_groups_)) /
               double(m_.experts);
    }
    double fp16_expert_bytes() const {
        return sizeof(__half) * 3.0 * double(m_.hidden) * double(m_.intermediate);
    }

    // Allocates the copies on first use: as many as a call moving `call_bytes` needs to read
    // DRAM (Bench::rotation_copies, limited by free memory).
    void ensure(double call_bytes) {
        if (!copies_.empty()) return;
        const double per_copy = double(m_.experts) * (int4_expert_bytes() + fp16_expert_bytes());
        const int copies = bench_.rotation_copies(call_bytes, per_copy);
        for (int c = 0; c < copies; ++c) copies_.push_back(make_copy(c));
        CK_BENCH_CHECK(cudaStreamSynchronize(bench_.stream()));
    }

    int copies() const { return int(copies_.size()); }
    const WeightCopy& copy(int c) const { return copies_[size_t(c)]; }

  private:
    // The prepacked sizes, asked of the library once (only when a row of the model runs).
    void query_sizes() {
        if (w13_bytes_ > 0) return;
        w13_bytes_ = ck_moe_prepacked_bytes(m_.experts, 2 * m_.intermediate, m_.hidden);
        w2_bytes_ = ck_moe_prepacked_bytes(m_.experts, m_.hidden, m_.intermediate);
        w13_groups_ = ck_moe_prepacked_groups(m_.experts, 2 * m_.intermediate, m_.hidden,
                                              kGroupSize);
        w2_groups_ = ck_moe_prepacked_groups(m_.experts, m_.hidden, m_.intermediate, kGroupSize);
        if (w13_bytes_ <= 0 || w2_bytes_ <= 0 || w13_groups_ <= 0 || w2_groups_ <= 0) {
            std::fprintf(stderr, "moe: no prepacked layout for %s (E=%lld H=%lld I=%lld)\n",
                         m_.name, (long long)m_.experts, (long long)m_.hidden,
                         (long long)m_.intermediate);
            std::exit(kExitFailure);
        }
    }

    WeightCopy make_copy(int c) {
        const uint64_t seed = 50000 + 1000 * uint64_t(index_) + 10 * uint64_t(c);
        WeightCopy w;
        make_projection(2 * m_.intermediate, m_.hidden, /*gate_up=*/1, seed + 1, w.w13,
                        w.w13_scales, w.w13_dense, w13_bytes_, w13_groups_);
        make_projection(m_.hidden, m_.intermediate, /*gate_up=*/0, seed + 2, w.w2, w.w2_scales,
                        w.w2_dense, w2_bytes_, w2_groups_);
        return w;
    }

    // E experts of [n, k]: dense fp16 -> interchange INT4 -> dense (dequantized) and prepacked.
    void make_projection(int64_t n, int64_t k, int gate_up, uint64_t seed, DeviceBuffer& prepacked,
                         DeviceBuffer& scales_prepacked, DeviceBuffer& dense,
                         int64_t prepacked_bytes, int64_t prepacked_groups) {
        cudaStream_t st = bench_.stream();
        const int64_t groups = ck_int4_groups_per_row(k, kGroupSize);
        const int64_t expert_elements = n * k;
        const float bound = kUnitVarianceBound / std::sqrt(float(k));
        dense = DeviceBuffer(sizeof(__half) * size_t(m_.experts * expert_elements));
        DeviceBuffer packed(size_t(m_.experts * expert_elements / 2));
        DeviceBuffer scales(sizeof(__half) * size_t(m_.experts * n * groups));
        fill_uniform(dense.as(), kDtype, m_.experts * expert_elements, seed, -bound, bound, st);
        for (int64_t e = 0; e < m_.experts; ++e) {
            __half* w = dense.as<__half>() + e * expert_elements;
            uint8_t* q = packed.as<uint8_t>() + e * expert_elements / 2;
            __half* s = scales.as<__half>() + e * n * groups;
            CK_BENCH_CHECK(ck_quantize_int4(w, kDtype, n, k, kGroupSize, kMode, q, s, nullptr, st));
            CK_BENCH_CHECK(
                ck_dequantize_int4(q, s, nullptr, n, k, kGroupSize, kMode, w, kDtype, st));
        }
        prepacked = DeviceBuffer(size_t(prepacked_bytes));
        scales_prepacked = DeviceBuffer(sizeof(__half) * size_t(prepacked_groups));
        CK_BENCH_CHECK(ck_moe_prepack(packed.as<uint8_t>(), scales.as(), nullptr, kDtype,
                                      m_.experts, n, k, kGroupSize, kMode, gate_up,
                                      prepacked.as<uint8_t>(), scales_prepacked.as(), nullptr,
                                      st));
        CK_BENCH_CHECK(cudaStreamSynchronize(st));  // before the scratch buffers are freed
    }

    Bench& bench_;
    Model m_;
    int index_;
    int64_t w13_bytes_ = 0, w2_bytes_ = 0, w13_groups_ = 0, w2_groups_ = 0;
    std::vector<WeightCopy> copies_;
};

// One line of the summary table: the rows of one (model, T), any of them possibly filtered out.
struct Summary {
    const Model* model = nullptr;
    int64_t tokens = 0;
    int64_t active = 0;     // experts with at least one pair
    double floor_us = 0;    // ours' bytes at the copy bandwidth
    const Row* ours = nullptr;
    double naive_us = 0;    // 0: not measured
    const Row* grouped = nullptr;
    std::string ours_diff, grouped_diff;  // ||out - naive|| / ||naive||
};

// ||a - ref|| / ||ref|| of two fp16 outputs, as "1.2e-03" ("nan" when a has non-finite values).
inline std::string difference_note(const std::vector<float>& a, const std::vector<float>& ref) {
    return format("%.1e", relative_difference(a, ref));
}

// ------------------------------------------------------------------------------------------------
// The rows of one (model, T). Buffers are allocated when the filter keeps one of them.
// ------------------------------------------------------------------------------------------------
class Problem {
  public:
    Problem(Context& ctx, ModelWeights& weights, const Model& model, int64_t tokens)
        : ctx_(ctx), bench_(ctx.bench), weights_(weights), m_(model), t_(tokens),
          pairs_(tokens * model.top_k),
          shape_(std::string(model.name) + " T=" + std::to_string(tokens)) {}

    Summary run_all() {
        Summary summary;  // model stays null when the filter skips every row
        const RowSpec ours = spec("ck_moe_forward int4 g" + std::to_string(kGroupSize));
        const RowSpec naive =
            spec("naive fp16 (per expert: gather + cublasGemmEx + swiglu + cublasGemmEx + "
                 "scatter-add)");
        const RowSpec grouped =
            spec("cuBLAS grouped fp16 (gather + cublasGemmGroupedBatchedEx + swiglu + "
                 "cublasGemmGroupedBatchedEx + combine)");
        const bool want_grouped = bench_.wants(grouped);
        if (!bench_.wants(ours) && !bench_.wants(naive) && !want_grouped) return summary;

        setup();
        summary.model = &m_;
        summary.tokens = t_;
        summary.active = int64_t(routing_.active.size());
        summary.floor_us = ours_bytes() / (bench_.copy_gbps() * kBytesPerGB) * 1e6;

        // The naive pipeline's output is the reference of the other two; its timing is ours'
        // baseline (the naive row records the same timing).
        std::string naive_how;
        const Timing naive_time = time_sequence(naive_sequence(), &naive_how);
        summary.naive_us = naive_time.median_us;
        const std::vector<float> reference =
            download_as_float(out_naive_, kDtype, bench_.stream());

        Row* ours_row = bench_.wants(ours) ? time_ours(ours, naive_time, reference, &summary)
                                           : nullptr;
        if (bench_.wants(naive)) {
            Row& row = record(naive, naive_time, fp16_bytes());
            Bench::append_note(row, naive_how);
        }
        if (want_grouped) summary.grouped = time_grouped(grouped, reference, &summary);
        if (ours_row && summary.grouped)
            Bench::append_note(*ours_row, "vs cuBLAS grouped fp16 " +
                                              format("%.2f", summary.grouped->time.median_us /
                                                                 ours_row->time.median_us) +
                                              "x");
        summary.ours = ours_row;
        return summary;
    }

  private:
    double io_bytes() const {  // x read + out written, fp16
        return 2.0 * sizeof(__half) * double(t_) * double(m_.hidden);
    }
    double active_experts() const { return double(routing_.active.size()); }
    double ours_bytes() {
        return active_experts() * weights_.int4_expert_bytes() + io_bytes() +
               sizeof(float) * double(t_) * double(m_.experts);
    }
    double fp16_bytes() {
        return active_experts() * weights_.fp16_expert_bytes() + io_bytes();
    }

    RowSpec spec(const std::string& kernel) const {
        RowSpec s = row_spec("moe", kernel, dtype_name(kDtype), shape_);
        s.flops = 2.0 * double(pairs_) * 3.0 * double(m_.hidden) * double(m_.intermediate);
        return s;
    }

    // Logits, routing, activations and the baselines' scratch; the weights (first problem of the
    // model: the smallest T, the most rotation copies).
    void setup() {
        cudaStream_t st = bench_.stream();
        if (m_.hidden % kVec != 0 || m_.intermediate % kVec != 0 || pairs_ > kMaxGridRows) {
            std::fprintf(stderr, "moe: %s needs H, I multiples of %d and T * k <= %lld\n",
                         shape_.c_str(), kVec, (long long)kMaxGridRows);
            std::exit(kExitFailure);
        }
        const uint64_t seed = 70000 + 100 * uint64_t(t_) + uint64_t(m_.experts);
        std::vector<float> logits(size_t(t_ * m_.experts));
        for (size_t i = 0; i < logits.size(); ++i)
            logits[i] = host_uniform(seed, int64_t(i), -kLogitAbsMax, kLogitAbsMax);
        routing_ = route_on_host(logits, m_, t_);

        weights_.ensure(ours_bytes());
        copies_ = std::min(weights_.copies(),
                           rotation_copies_for_l2(ours_bytes(), bench_.device().l2_bytes));

        const size_t act = sizeof(__half) * size_t(t_ * m_.hidden);
        x_ = DeviceBuffer(act);
        logits_ = DeviceBuffer(sizeof(float) * logits.size());
        out_ = DeviceBuffer(act);
        out_naive_ = DeviceBuffer(act);
        out_grouped_ = DeviceBuffer(act);
        fill_uniform(x_.as(), kDtype, t_ * m_.hidden, seed + 1, -kUnitVarianceBound,
                     kUnitVarianceBound, st);
        CK_BENCH_CHECK(cudaMemcpyAsync(logits_.as(), logits.data(), logits_.bytes(),
                                       cudaMemcpyHostToDevice, st));
        for (DeviceBuffer* out : {&out_, &out_naive_, &out_grouped_})
            fill_random_bytes(out->as(), int64_t(out->bytes()), seed + 2, st);  // poison

        const size_t rows = size_t(pairs_);
        xg_ = DeviceBuffer(sizeof(__half) * rows * size_t(m_.hidden));
        gate_up_ = DeviceBuffer(sizeof(__half) * rows * size_t(2 * m_.intermediate));
        h_ = DeviceBuffer(sizeof(__half) * rows * size_t(m_.intermediate));
        y_ = DeviceBuffer(sizeof(__half) * rows * size_t(m_.hidden));
        acc_ = DeviceBuffer(sizeof(float) * size_t(t_ * m_.hidden));
        pair_token_ = upload(routing_.pair_token);
        pair_weight_ = upload(routing_.pair_weight);
        row_of_pair_ = upload(routing_.row_of_pair);
        topk_weight_ = upload(routing_.weights);

        ck_moe_params_t p = params(0);
        size_t workspace_bytes = 0;
        CK_BENCH_CHECK(ck_moe_workspace_size(&p, &workspace_bytes));
        workspace_ = DeviceBuffer(std::max<size_t>(workspace_bytes, 1));
        CK_BENCH_CHECK(cudaStreamSynchronize(st));
    }

    template <typename T>
    DeviceBuffer upload(const std::vector<T>& host) {
        DeviceBuffer buf(sizeof(T) * host.size());
        CK_BENCH_CHECK(cudaMemcpyAsync(buf.as(), host.data(), buf.bytes(), cudaMemcpyHostToDevice,
                                       bench_.stream()));
        return buf;
    }

    ck_moe_params_t params(int copy) const {
        const WeightCopy& w = weights_.copy(copy);
        ck_moe_params_t p{};
        p.struct_size = sizeof(p);
        p.tokens = t_;
        p.hidden = m_.hidden;
        p.intermediate = m_.intermediate;
        p.experts = m_.experts;
        p.top_k = m_.top_k;
        p.dtype = kDtype;
        p.group_size = kGroupSize;
        p.mode = kMode;
        p.x = x_.as();
        p.router_logits = logits_.as();
        p.router_dtype = kRouterDtype;
        p.renormalize = m_.renormalize ? 1 : 0;
        p.topk_ids = nullptr;
        p.topk_weights = nullptr;
        p.w13 = w.w13.as<uint8_t>();
        p.w13_scales = w.w13_scales.as();
        p.w13_zeros = nullptr;
        p.w2 = w.w2.as<uint8_t>();
        p.w2_scales = w.w2_scales.as();
        p.w2_zeros = nullptr;
        p.activation = CK_MOE_SWIGLU;
        p.out = out_.as();
        return p;
    }

    // --- the sequences --------------------------------------------------------------------------
    Sequence ours_sequence() {
        return [this](StepStatus& s, int copy) {
            const ck_moe_params_t p = params(copy);
            CK_BENCH_STEP(s, ck_moe_forward(&p, workspace_.as(), workspace_.bytes(),
                                          bench_.stream()));
        };
    }

    // c[rows, m] = b[rows, k] a[m, k]^T, fp16 in and out, float32 accumulation (TN through
    // column-major, as gemm_bench::Problem::gemm_ex).
    void gemm_tn(StepStatus& s, int64_t m, int64_t rows, int64_t k, const __half* a,
                 const __half* b, __half* c) const {
        const float alpha = 1.f, beta = 0.f;
        CK_BENCH_STEP(s, cublasGemmEx(ctx_.cublas, CUBLAS_OP_T, CUBLAS_OP_N, int(m), int(rows),
                                    int(k), &alpha, a, CUDA_R_16F, int(k), b, CUDA_R_16F, int(k),
                                    &beta, c, CUDA_R_16F, int(m), CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
    }

    Sequence naive_sequence() {
        return [this](StepStatus& s, int copy) {
            const WeightCopy& w = weights_.copy(copy);
            cudaStream_t st = bench_.stream();
            const int64_t H = m_.hidden, I = m_.intermediate;
            CK_BENCH_STEP(s, cudaMemsetAsync(acc_.as(), 0, acc_.bytes(), st));
            for (int32_t e : routing_.active) {
                const int64_t rows = routing_.expert_rows[size_t(e)];
                const int64_t first = routing_.expert_offset[size_t(e)];
                const int32_t* token = pair_token_.as<int32_t>() + first;
                __half* xg = xg_.as<__half>() + first * H;
                __half* gate_up = gate_up_.as<__half>() + first * 2 * I;
                __half* h = h_.as<__half>() + first * I;
                __half* y = y_.as<__half>() + first * H;
                gather_rows_kernel<<<row_grid(H, rows), kThreads, 0, st>>>(x_.as<__half>(), token,
                                                                           H, xg);
                CK_BENCH_STEP(s, cudaGetLastError());
                gemm_tn(s, 2 * I, rows, H, w.w13_dense.as<__half>() + int64_t(e) * 2 * I * H, xg,
                        gate_up);
                swiglu_kernel<<<row_grid(I, rows), kThreads, 0, st>>>(gate_up, I, h);
                CK_BENCH_STEP(s, cudaGetLastError());
                gemm_tn(s, H, rows, I, w.w2_dense.as<__half>() + int64_t(e) * H * I, h, y);
                scatter_add_kernel<<<row_grid(H, rows), kThreads, 0, st>>>(
                    y, token, pair_weight_.as<float>() + first, H, acc_.as<float>());
                CK_BENCH_STEP(s, cudaGetLastError());
            }
            to_half_kernel<<<row_grid(H, t_), kThreads, 0, st>>>(acc_.as<float>(), H,
                                                                 out_naive_.as<__half>());
            CK_BENCH_STEP(s, cudaGetLastError());
        };
    }

#if CK_BENCH_HAVE_GROUPED_GEMM
    // The grouped GEMMs' arguments: one group per active expert (one problem each, its own row
    // count); the host arrays are read at the call, the pointer arrays live on the device, one set
    // per rotation copy: [A1, B1, C1, A2, B2, C2] x active experts.
    struct GroupedArgs {
        std::vector<cublasOperation_t> trans_a, trans_b;
        std::vector<int> m1, k1, m2, k2, rows, group_size;
        std::vector<float> alpha, beta;
        std::vector<DeviceBuffer> pointers;  // per copy
    };

    void prepare_grouped() {
        if (!grouped_.pointers.empty()) return;
        const size_t n = routing_.active.size();
        const int64_t H = m_.hidden, I = m_.intermediate;
        GroupedArgs& g = grouped_;
        g.trans_a.assign(n, CUBLAS_OP_T);
        g.trans_b.assign(n, CUBLAS_OP_N);
        g.m1.assign(n, int(2 * I));
        g.k1.assign(n, int(H));
        g.m2.assign(n, int(H));
        g.k2.assign(n, int(I));
        g.group_size.assign(n, 1);
        g.alpha.assign(n, 1.f);
        g.beta.assign(n, 0.f);
        for (int32_t e : routing_.active) g.rows.push_back(int(routing_.expert_rows[size_t(e)]));
        for (int c = 0; c < copies_; ++c) {
            const WeightCopy& w = weights_.copy(c);
            std::vector<const void*> p(6 * n);
            for (size_t i = 0; i < n; ++i) {
                const int64_t e = routing_.active[i];
                const int64_t first = routing_.expert_offset[size_t(e)];
                p[0 * n + i] = w.w13_dense.as<__half>() + e * 2 * I * H;
                p[1 * n + i] = xg_.as<__half>() + first * H;
                p[2 * n + i] = gate_up_.as<__half>() + first * 2 * I;
                p[3 * n + i] = w.w2_dense.as<__half>() + e * H * I;
                p[4 * n + i] = h_.as<__half>() + first * I;
                p[5 * n + i] = y_.as<__half>() + first * H;
            }
            g.pointers.push_back(upload(p));
        }
        CK_BENCH_CHECK(cudaStreamSynchronize(bench_.stream()));
    }

    Sequence grouped_sequence() {
        prepare_grouped();
        return [this](StepStatus& s, int copy) {
            cudaStream_t st = bench_.stream();
            const GroupedArgs& g = grouped_;
            const int n = int(routing_.active.size());
            const int64_t H = m_.hidden, I = m_.intermediate;
            const void* const* p = grouped_.pointers[size_t(copy)].as<const void*>();
            void* const* out = grouped_.pointers[size_t(copy)].as<void*>();
            gather_rows_kernel<<<row_grid(H, pairs_), kThreads, 0, st>>>(
                x_.as<__half>(), pair_token_.as<int32_t>(), H, xg_.as<__half>());
            CK_BENCH_STEP(s, cudaGetLastError());
            // Row-major c[rows, m] = b[rows, k] a[m, k]^T per expert, TN as in gemm_tn.
            CK_BENCH_STEP(s, cublasGemmGroupedBatchedEx(
                               ctx_.cublas, g.trans_a.data(), g.trans_b.data(), g.m1.data(),
                               g.rows.data(), g.k1.data(), g.alpha.data(), p, CUDA_R_16F,
                               g.k1.data(), p + n, CUDA_R_16F, g.k1.data(), g.beta.data(),
                               out + 2 * n, CUDA_R_16F, g.m1.data(), n, g.group_size.data(),
                               CUBLAS_COMPUTE_32F));
            swiglu_kernel<<<row_grid(I, pairs_), kThreads, 0, st>>>(gate_up_.as<__half>(), I,
                                                                    h_.as<__half>());
            CK_BENCH_STEP(s, cudaGetLastError());
            CK_BENCH_STEP(s, cublasGemmGroupedBatchedEx(
                               ctx_.cublas, g.trans_a.data(), g.trans_b.data(), g.m2.data(),
                               g.rows.data(), g.k2.data(), g.alpha.data(), p + 3 * n, CUDA_R_16F,
                               g.k2.data(), p + 4 * n, CUDA_R_16F, g.k2.data(), g.beta.data(),
                               out + 5 * n, CUDA_R_16F, g.m2.data(), n, g.group_size.data(),
                               CUBLAS_COMPUTE_32F));
            combine_kernel<<<row_grid(H, t_), kThreads, 0, st>>>(
                y_.as<__half>(), row_of_pair_.as<int32_t>(), topk_weight_.as<float>(),
                int(m_.top_k), H, out_grouped_.as<__half>());
            CK_BENCH_STEP(s, cudaGetLastError());
        };
    }
#endif

    // --- timing ---------------------------------------------------------------------------------
    Timing time_sequence(const Sequence& sequence, std::string* how) {
        return ::time_sequence(bench_, sequence, copies_, "moe: " + shape_, how);
    }

    // Records a row timed by time_sequence (Bench::run's bookkeeping and progress line).
    Row& record(const RowSpec& s, const Timing& timing, double bytes) {
        RowSpec spec = s;
        spec.bytes = bytes;
        spec.copies = copies_;
        return bench_.record(spec, timing);
    }

    Row* time_ours(const RowSpec& s, const Timing& naive_time,
                   const std::vector<float>& reference, Summary* summary) {
        std::string how;
        const Timing t = time_sequence(ours_sequence(), &how);
        summary->ours_diff =
            difference_note(download_as_float(out_, kDtype, bench_.stream()), reference);
        Row& row = record(s, t, ours_bytes());
        Bench::set_baseline(row, "naive fp16", naive_time);
        Bench::append_note(row, "E=" + std::to_string(m_.experts) + " top-" +
                                    std::to_string(m_.top_k) + " H=" + std::to_string(m_.hidden) +
                                    " I=" + std::to_string(m_.intermediate) + ", " +
                                    std::to_string(routing_.active.size()) + " experts active");
        Bench::append_note(row, "floor " + format("%.1f", summary->floor_us) + " us (ours " +
                                    format("%.2f", t.median_us / summary->floor_us) + "x)");
        Bench::append_note(row, "||out - naive|| / ||naive|| " + summary->ours_diff);
        Bench::append_note(row, how);
        return &row;
    }

    const Row* time_grouped(const RowSpec& s, const std::vector<float>& reference,
                            Summary* summary) {
#if CK_BENCH_HAVE_GROUPED_GEMM
        // A cuBLAS that cannot run this call (e.g. no fp16 support in its grouped GEMM) skips
        // the row rather than the run.
        {
            StepStatus probe;
            grouped_sequence()(probe, 0);
            if (!probe.ok()) {
                cudaGetLastError();
                std::fprintf(stderr, "  moe: %s: cuBLAS grouped fp16 row skipped: %s\n",
                             shape_.c_str(), probe.message().c_str());
                return nullptr;
            }
        }
        std::string how;
        const Timing t = time_sequence(grouped_sequence(), &how);
        summary->grouped_diff =
            difference_note(download_as_float(out_grouped_, kDtype, bench_.stream()), reference);
        Row& row = record(s, t, fp16_bytes());
        Bench::append_note(row, "||out - naive|| / ||naive|| " + summary->grouped_diff);
        Bench::append_note(row, how);
        return &row;
#else
        (void)s, (void)reference, (void)summary;
        std::fprintf(stderr,
                     "  moe: %s: cuBLAS grouped fp16 row skipped: built against cuBLAS %d, "
                     "cublasGemmGroupedBatchedEx needs 12.5 or newer\n",
                     shape_.c_str(), int(CUBLAS_VERSION));
        return nullptr;
#endif
    }

    Context& ctx_;
    Bench& bench_;
    ModelWeights& weights_;
    const Model& m_;
    int64_t t_, pairs_;
    std::string shape_;
    Routing routing_;
    int copies_ = 1;
    DeviceBuffer x_, logits_, out_, out_naive_, out_grouped_, workspace_;
    // The baselines' scratch, rows in expert order: gathered x [pairs, H], gate+up [pairs, 2I],
    // h [pairs, I], y [pairs, H]; the naive fp32 accumulator [T, H].
    DeviceBuffer xg_, gate_up_, h_, y_, acc_;
    DeviceBuffer pair_token_, pair_weight_, row_of_pair_, topk_weight_;
#if CK_BENCH_HAVE_GROUPED_GEMM
    GroupedArgs grouped_;
#endif
};

// Ours beside both baselines and the floor, per (model, T).
inline ExtraTable summary_table(const std::vector<Summary>& summaries) {
    ExtraTable t;
    t.family = "moe";
    t.title = "MoE layer, INT4 g" + std::to_string(kGroupSize) +
              " experts (ck_moe_forward, from router logits) vs dense fp16 on cuBLAS (vs = their "
              "time / ours; floor = the active experts' INT4 weights + scales + x + logits + out "
              "at the copy bandwidth; diff = ||out - naive|| / ||naive||)";
    t.headers = {"model", "T", "active experts", "ours us", "naive fp16 us", "grouped fp16 us",
                 "floor us", "vs naive", "vs grouped", "ours / floor", "ours TFLOP/s",
                 "ours diff", "grouped diff"};
    auto us = [](double v) { return v > 0 ? format("%.1f", v) : std::string(); };
    for (const Summary& s : summaries) {
        if (!s.model) continue;
        const double ours = s.ours ? s.ours->time.median_us : 0;
        const double grouped = s.grouped ? s.grouped->time.median_us : 0;
        const std::string model = std::string(s.model->name) + " (E=" +
                                  std::to_string(s.model->experts) + " top-" +
                                  std::to_string(s.model->top_k) + ")";
        t.cells.push_back(
            {model, std::to_string(s.tokens),
             std::to_string(s.active) + "/" + std::to_string(s.model->experts), us(ours),
             us(s.naive_us), us(grouped), us(s.floor_us),
             ours > 0 && s.naive_us > 0 ? format("%.2fx", s.naive_us / ours) : "",
             ours > 0 && grouped > 0 ? format("%.2fx", grouped / ours) : "",
             ours > 0 && s.floor_us > 0 ? format("%.2fx", ours / s.floor_us) : "",
             s.ours ? format("%.1f", s.ours->tera_ops()) : "", s.ours_diff, s.grouped_diff});
    }
    return t;
}

}  // namespace moe_bench

inline void bench_moe(Bench& bench, const Options& options) {
    using namespace moe_bench;
    Context ctx(bench, options.quick);
    std::vector<Summary> summaries;
    for (int i = 0; i < int(std::size(kModels)); ++i) {
        if (options.quick && i != kQuickModel) continue;
        const Model& model = kModels[i];
        std::vector<int64_t> tokens(std::begin(kTokens), std::end(kTokens));
        if (options.quick) tokens.assign(std::begin(kQuickTokens), std::end(kQuickTokens));
        // The weights live across the model's T (ascending: the first problem needs the most
        // rotation copies, and sizes them).
        ModelWeights weights(bench, model, i);
        for (int64_t t : tokens) summaries.push_back(Problem(ctx, weights, model, t).run_all());
    }
    ExtraTable table = summary_table(summaries);
    if (!table.cells.empty()) bench.add_table(std::move(table));
}
