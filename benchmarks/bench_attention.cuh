// benchmarks/bench_attention.cuh - family "attention": prefill attention (ck_attention_forward)
// beside the unfused pipelines it replaces, and decode attention over a KV cache
// (ck_attention_decode) against the copy bandwidth, on the same run.
//
// Prefill. Problems: the prefill shapes of the attention targets (batch B of equal sequences of
// S queries and S keys, Hq query heads over Hkv kv heads, head dim D, causal or not), bf16 and
// fp16 (--quick: one small shape; --size does not apply). Rows of each (shape, dtype):
//   ck_attention_forward          the fused kernel (one launch; the automatic choice, wgmma on
//                                 Hopper, unless CK_ATTENTION_KERNEL forces one: the row's note
//                                 says so); baseline "cuBLAS + softmax".
//   cuBLAS + softmax              the unfused pipeline on cuBLAS: per sequence (and kv head under
//                                 GQA), a strided-batched GEMM S = scale Q K^T into float32, a
//                                 softmax kernel (mask, max, exp, sum) writing P in the dtype,
//                                 and a strided-batched GEMM O = P V, fp32 accumulation.
//   tiled sequential              the same four steps as the naive pipeline (QK^T, scale + mask,
//                                 softmax, PV), with 16 x 16 shared-memory tiled GEMM kernels.
//   naive sequential              four kernels, one thread per output element: S = Q K^T,
//                                 scale + mask, a row softmax, O = P V (bf16 only: slow).
// The unfused pipelines write and read the S x S scores (float32) and P (dtype) of a chunk of
// heads at a time (one sequence, one kv head's group); each call is one CUDA graph replay, so
// their many launches cost no host time. Every row's output is compared with ours
// (||O - ours|| / ||ours||, in the notes: a check, not a target).
// flops = 4 D Hq x (query, key) pairs the mask allows (S^2 per head, S (S + 1) / 2 causal);
// bytes = q + k + v + out (the fused kernel's floor; the unfused ones move far more).
//
// Decode (ck_attention_decode, split-KV plus the combine). Problems: fp16, Hq = 32 query heads
// over Hkv = 8 kv heads, D = 128, one new token per sequence, (batch, KV length) = (1, 4096),
// (16, 4096), (64, 2048), (1, 32768) (--quick: the first two), every sequence of the full
// length. Rows of each: a contiguous cache [B, KV, Hkv, D] and paged caches of 16- and 64-key
// pages (the block table a random permutation of the pages, so that a sequence's pages are
// scattered as a serving engine's are); each of an fp16 cache and of quantized ones ("kv=":
// FP8 E4M3 with per-head or per-token scales, int8 with per-token scales, the codes
// ck_quantize_fp8 / ck_quantize_int8 make of uniform values, per row). Splits: the library's
// automatic rule (the note gives the count).
// Floor: `bytes` is the K and V bytes of the sequences (tests/reference.py
// attention_decode_kv_bytes: B KV Hkv D 2 x 2 bytes for fp16, x 1 byte for codes, plus 8 bytes
// of scales per key and kv head per token) plus q and out; the block table and the partials
// are not counted. "% copy" is that at the measured copy bandwidth: the target of a
// memory-bound decode kernel.
// Timing: each row replays one CUDA graph of kDecodeCallsPerGraph calls (each the split kernel
// and the combine) over rotated copies of every buffer, so that each call reads its K and V from
// DRAM (rotation_copies: twice L2 of traffic between two uses of a byte); the time per call is
// the replay's over the calls. A serving engine captures a whole decode step likewise: a graph
// of one call would time the replay's own gap, several microseconds, beside a 10 us kernel.
// bench_sdpa.py times SDPA's decode the same way.
#pragma once

#include <iterator>
#include <numeric>
#include <random>

#include "bench.cuh"

namespace prefill_bench {

struct Shape {
    int64_t batch, heads_q, heads_kv, seqlen, head_dim;
    bool causal;
};

constexpr Shape kShapes[] = {
    {1, 32, 32, 2048, 128, true},  {4, 32, 32, 2048, 128, false}, {1, 32, 8, 8192, 128, true},
    {8, 32, 8, 1024, 128, true},   {2, 16, 16, 4096, 64, true},   {16, 32, 8, 512, 128, true},
};
constexpr Shape kQuickShape = {1, 8, 8, 512, 64, true};

// Inputs uniform in +-sqrt(3) (variance 1): with the default scale 1 / sqrt(D) the logits have
// variance ~1 and the softmax is neither flat nor one-hot.
constexpr float kInputBound = 1.7320508f;

constexpr int kThreads = 256;
constexpr int kTile = 16;  // the tiled baseline's GEMM tile
// The slow baselines are timed with few samples (each call is milliseconds).
constexpr int kSlowWarmup = 1;
constexpr int kSlowReps = 3;

inline std::string prefill_shape(const Shape& s) {
    return "B=" + std::to_string(s.batch) + " H=" + std::to_string(s.heads_q) + "/" +
           std::to_string(s.heads_kv) + " S=" + std::to_string(s.seqlen) +
           " D=" + std::to_string(s.head_dim) + (s.causal ? " causal" : "");
}

inline double allowed_pairs(const Shape& s) {
    const double n = double(s.seqlen);
    return double(s.batch) * (s.causal ? n * (n + 1) / 2 : n * n);
}

// ------------------------------------------------------------------------------------------------
// One chunk of heads: `count` query heads of one sequence that the baselines process together.
// Element (token t, head h, d) of q / out sits at (t Hq + h) D + d, of k / v at (t Hkv + h) D + d;
// a chunk's query head c reads kv head kv0 + c * kv_step (kv_step 1 without GQA, 0 within one
// kv head's group). S and P are [count, S, S], row-major.
// ------------------------------------------------------------------------------------------------
struct Chunk {
    int64_t q_offset, kv_offset;  // element offsets of the chunk's first q head / kv head
    int64_t q_row, kv_row;        // elements between consecutive tokens: Hq D, Hkv D
    int64_t kv_step;              // elements between the kv heads of consecutive chunk heads
    int count;
};

template <typename T> __device__ inline float to_f(T v);
template <> __device__ inline float to_f(__half v) { return __half2float(v); }
template <> __device__ inline float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ inline T from_f(float v);
template <> __device__ inline __half from_f(float v) { return __float2half_rn(v); }
template <> __device__ inline __nv_bfloat16 from_f(float v) { return __float2bfloat16_rn(v); }

// S = scale S, and -inf where the causal mask hides the key (n queries, n keys: j > i).
__global__ void __launch_bounds__(kThreads)
    scale_mask_kernel(float* s, int n, float scale, bool causal) {
    const int j = blockIdx.x * kThreads + threadIdx.x;
    const int i = blockIdx.y, c = blockIdx.z;
    if (j >= n) return;
    float& x = s[(int64_t(c) * n + i) * n + j];
    x = causal && j > i ? -INFINITY : x * scale;
}

// P[c, i, :] = softmax(scale S[c, i, :]) in the dtype over the keys row i sees (the rest 0): one
// block per row, float32 max and sum. The cuBLAS pipeline's middle step; the sequential ones call
// it with scale 1 and no mask after their own scale + mask kernel.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    masked_softmax_kernel(const float* s, int n, float scale, bool causal, T* p) {
    __shared__ float red[kThreads / 32];
    const int i = blockIdx.x;
    const int64_t row = int64_t(blockIdx.y) * n + i;
    const float* x = s + row * n;
    const int visible = causal ? i + 1 : n;
    auto block_reduce = [&](float v, bool is_max) {
        for (int o = 16; o > 0; o >>= 1) {
            const float w = __shfl_xor_sync(0xffffffffu, v, o);
            v = is_max ? fmaxf(v, w) : v + w;
        }
        if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
        __syncthreads();
        v = red[0];
        for (int w = 1; w < kThreads / 32; ++w) v = is_max ? fmaxf(v, red[w]) : v + red[w];
        __syncthreads();
        return v;
    };
    float m = -INFINITY;
    for (int j = threadIdx.x; j < visible; j += kThreads) m = fmaxf(m, x[j] * scale);
    m = block_reduce(m, true);
    float sum = 0;
    for (int j = threadIdx.x; j < visible; j += kThreads) sum += __expf(x[j] * scale - m);
    sum = block_reduce(sum, false);
    const float inv = 1.f / sum;
    for (int j = threadIdx.x; j < n; j += kThreads)
        p[row * n + j] = from_f<T>(j < visible ? __expf(x[j] * scale - m) * inv : 0.f);
}

// C[c] (rows x cols) = A[c] op(B[c]), float32 sums: A row r at a + r lda (`inner` long,
// contiguous); kBT: op(B) = B^T, B row s at b + s ldb (scores: A = q, B = k); else op(B) = B,
// row-major (values: A = P, B = v). Head c of each at + c x_head.
template <typename Out> __device__ inline Out from_acc(float acc) {
    if constexpr (std::is_same_v<Out, float>) {
        return acc;
    } else {
        return from_f<Out>(acc);
    }
}

// The naive form: one thread per element of C, the sum in order of k (grid: cols / kThreads
// blocks, rows, heads).
template <bool kBT, typename T, typename Out>
__global__ void __launch_bounds__(kThreads)
    naive_gemm_kernel(const T* a, int64_t lda, int64_t a_head, const T* b, int64_t ldb,
                      int64_t b_head, int rows, int cols, int inner, Out* c, int64_t ldc,
                      int64_t c_head) {
    const int s = blockIdx.x * kThreads + threadIdx.x;
    const int r = blockIdx.y, z = blockIdx.z;
    if (r >= rows || s >= cols) return;
    const T* ar = a + z * a_head + int64_t(r) * lda;
    const T* bz = b + z * b_head;
    float acc = 0;
    for (int k = 0; k < inner; ++k)
        acc += to_f(ar[k]) * to_f(kBT ? bz[int64_t(s) * ldb + k] : bz[int64_t(k) * ldb + s]);
    c[z * c_head + int64_t(r) * ldc + s] = from_acc<Out>(acc);
}

// The tiled form: 16 x 16 shared-memory tiles.
template <bool kBT, typename T, typename Out>
__global__ void __launch_bounds__(kTile * kTile)
    tiled_gemm_kernel(const T* a, int64_t lda, int64_t a_head, const T* b, int64_t ldb,
                      int64_t b_head, int rows, int cols, int inner, Out* c, int64_t ldc,
                      int64_t c_head) {
    __shared__ float as[kTile][kTile + 1], bs[kTile][kTile + 1];
    const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
    const int r = blockIdx.y * kTile + ty, s = blockIdx.x * kTile + tx;
    const int z = blockIdx.z;
    a += z * a_head;
    b += z * b_head;
    float acc = 0;
    for (int k0 = 0; k0 < inner; k0 += kTile) {
        as[ty][tx] = r < rows && k0 + tx < inner ? to_f(a[int64_t(r) * lda + k0 + tx]) : 0.f;
        if constexpr (kBT) {
            const int br = blockIdx.x * kTile + ty;  // B's row this thread loads
            bs[ty][tx] = br < cols && k0 + tx < inner ? to_f(b[int64_t(br) * ldb + k0 + tx]) : 0.f;
        } else {
            bs[ty][tx] = k0 + ty < inner && s < cols ? to_f(b[int64_t(k0 + ty) * ldb + s]) : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kTile; ++kk) acc += as[ty][kk] * (kBT ? bs[tx][kk] : bs[kk][tx]);
        __syncthreads();
    }
    if (r < rows && s < cols) c[z * c_head + int64_t(r) * ldc + s] = from_acc<Out>(acc);
}

// ------------------------------------------------------------------------------------------------
// One (shape, dtype): inputs in rotation copies, the baselines' scratch, and the rows.
// ------------------------------------------------------------------------------------------------
struct Copy {
    DeviceBuffer q, k, v, out;
};

class Problem {
  public:
    Problem(Bench& bench, const Shape& shape, ck_dtype_t dtype)
        : bench_(bench), s_(shape), dtype_(dtype), elem_(dtype_size(dtype)),
          shape_(prefill_shape(shape)) {}

    void run_all(bool with_naive) {
        const RowSpec ours = spec("ck_attention_forward");
        const RowSpec cublas = spec("cuBLAS + softmax");
        const RowSpec tiled = spec("tiled sequential");
        const RowSpec naive = spec("naive sequential");
        if (!bench_.wants(ours) && !bench_.wants(cublas) && !bench_.wants(tiled) &&
            !bench_.wants(naive))
            return;
        allocate();
        Row* ours_row = time_ours(ours);
        const std::vector<float> reference = download(copies_[0].out);
        Row* cublas_row = time_baseline(cublas, cublas_sequence(), reference, false);
        if (ours_row && cublas_row) Bench::set_baseline(*ours_row, cublas.kernel, cublas_row->time);
        time_baseline(tiled, tiled_sequence(), reference, true);
        if (with_naive) time_baseline(naive, naive_sequence(), reference, true);
    }

  private:
    using Sequence = ::Sequence;

    int64_t tokens() const { return s_.batch * s_.seqlen; }
    int64_t q_elems() const { return tokens() * s_.heads_q * s_.head_dim; }
    int64_t kv_elems() const { return tokens() * s_.heads_kv * s_.head_dim; }
    int group() const { return int(s_.heads_q / s_.heads_kv); }
    // Query heads per chunk: all of a sequence's heads without GQA (k and v step with them),
    // one kv head's group with it (k and v shared).
    int chunk_heads() const { return group() == 1 ? int(s_.heads_q) : group(); }
    int64_t chunks() const { return s_.batch * (s_.heads_q / chunk_heads()); }
    float scale() const { return 1.0f / std::sqrt(float(s_.head_dim)); }

    RowSpec spec(const std::string& kernel) const {
        RowSpec r = row_spec("attention", kernel, dtype_name(dtype_), shape_);
        r.bytes = double(elem_) * double(2 * q_elems() + 2 * kv_elems());
        r.flops = 4.0 * double(s_.head_dim) * double(s_.heads_q) * allowed_pairs(s_);
        return r;
    }

    Chunk chunk(int64_t index) const {
        const int64_t per_seq = s_.heads_q / chunk_heads();
        const int64_t b = index / per_seq, first = (index % per_seq) * chunk_heads();
        Chunk c;
        c.q_row = s_.heads_q * s_.head_dim;
        c.kv_row = s_.heads_kv * s_.head_dim;
        c.q_offset = b * s_.seqlen * c.q_row + first * s_.head_dim;
        c.kv_offset = b * s_.seqlen * c.kv_row + (first / group()) * s_.head_dim;
        c.kv_step = group() == 1 ? s_.head_dim : 0;
        c.count = chunk_heads();
        return c;
    }

    void allocate() {
        const double per_call = spec("").bytes;
        const int copies = bench_.rotation_copies(per_call, per_call);
        for (int c = 0; c < copies; ++c) {
            Copy cp{DeviceBuffer(size_t(q_elems()) * elem_), DeviceBuffer(size_t(kv_elems()) * elem_),
                    DeviceBuffer(size_t(kv_elems()) * elem_), DeviceBuffer(size_t(q_elems()) * elem_)};
            const uint64_t seed = 1000 + 10 * uint64_t(c);
            fill_uniform(cp.q.as(), dtype_, q_elems(), seed, -kInputBound, kInputBound, bench_.stream());
            fill_uniform(cp.k.as(), dtype_, kv_elems(), seed + 1, -kInputBound, kInputBound,
                         bench_.stream());
            fill_uniform(cp.v.as(), dtype_, kv_elems(), seed + 2, -kInputBound, kInputBound,
                         bench_.stream());
            copies_.push_back(std::move(cp));
        }
        baseline_out_ = DeviceBuffer(size_t(q_elems()) * elem_);
        const size_t scores = size_t(chunk_heads()) * size_t(s_.seqlen) * size_t(s_.seqlen);
        scores_ = DeviceBuffer(scores * sizeof(float));
        probs_ = DeviceBuffer(scores * elem_);
        CK_BENCH_CHECK(cudaStreamSynchronize(bench_.stream()));
    }

    ck_attention_params_t params(const Copy& c) const {
        ck_attention_params_t p{};
        p.struct_size = sizeof(p);
        p.dtype = dtype_;
        p.q = c.q.as();
        p.k = c.k.as();
        p.v = c.v.as();
        p.out = c.out.as();
        p.total_q = p.total_k = tokens();
        p.num_heads_q = s_.heads_q;
        p.num_heads_kv = s_.heads_kv;
        p.head_dim = s_.head_dim;
        p.causal = s_.causal ? 1 : 0;
        if (s_.batch > 1) {  // equal sequences: offsets b S
            p.batch = s_.batch;
            p.cu_seqlens_q = p.cu_seqlens_k = offsets();
            p.max_seqlen_q = p.max_seqlen_k = s_.seqlen;
        }
        return p;
    }

    const int32_t* offsets() const {
        if (!cu_seqlens_.bytes()) {
            std::vector<int32_t> host(size_t(s_.batch + 1));
            for (int64_t b = 0; b <= s_.batch; ++b) host[size_t(b)] = int32_t(b * s_.seqlen);
            cu_seqlens_ = DeviceBuffer(host.size() * sizeof(int32_t));
            CK_BENCH_CHECK(cudaMemcpy(cu_seqlens_.as(), host.data(), cu_seqlens_.bytes(),
                                      cudaMemcpyHostToDevice));
        }
        return cu_seqlens_.as<int32_t>();
    }

    Row* time_ours(const RowSpec& spec) {
        if (!bench_.wants(spec)) {  // the baselines still compare with ours' output
            const ck_attention_params_t p = params(copies_[0]);
            CK_BENCH_CHECK(ck_attention_forward(&p, bench_.stream()));
            return nullptr;
        }
        RowSpec s = spec;
        s.copies = int(copies_.size());
        Row* row = bench_.run(s, [this](int i) {
            const ck_attention_params_t p = params(copies_[size_t(i) % copies_.size()]);
            CK_BENCH_CHECK(ck_attention_forward(&p, bench_.stream()));
        });
        if (row) kernel_override_note(*row, "CK_ATTENTION_KERNEL");
        // The last call wrote copy (calls - 1) % copies; recompute copy 0 for the comparisons.
        const ck_attention_params_t p = params(copies_[0]);
        CK_BENCH_CHECK(ck_attention_forward(&p, bench_.stream()));
        return row;
    }

    Row* time_baseline(const RowSpec& spec, const Sequence& sequence,
                       const std::vector<float>& reference, bool slow) {
        if (!bench_.wants(spec)) return nullptr;
        TimingConfig config = bench_.options().timing();
        if (slow) {
            config.warmup = std::min(config.warmup, kSlowWarmup);
            config.reps = std::min(config.reps, kSlowReps);
        }
        std::string how;
        const Timing t = time_sequence(bench_, sequence, int(copies_.size()),
                                       "attention: " + shape_, &how, &config);
        // Copy 0's output for the comparison (the timed replays rotated through the copies).
        StepStatus once;
        sequence(once, 0);
        once.require(shape_.c_str());
        RowSpec s = spec;
        s.copies = int(copies_.size());
        Row& added = bench_.record(s, t);
        Bench::append_note(added, "||O - ours|| / ||ours|| " +
                                      format("%.2e", relative_difference(download(baseline_out_),
                                                                         reference)));
        Bench::append_note(added, how);
        return &added;
    }

    std::vector<float> download(const DeviceBuffer& buf) const {
        return download_as_float(buf, dtype_, bench_.stream());
    }

    cudaDataType_t cuda_type() const { return dtype_ == CK_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F; }

    // Dispatches a baseline step on the dtype's element type.
    template <typename F> void with_type(F&& f) const {
        if (dtype_ == CK_DTYPE_BF16) {
            f(__nv_bfloat16{});
        } else {
            f(__half{});
        }
    }

    Sequence cublas_sequence() {
        return [this](StepStatus& st, int copy) {
            const Copy& c = copies_[size_t(copy)];
            const int n = int(s_.seqlen), d = int(s_.head_dim);
            const float one = 1.f, zero = 0.f, sc = scale();
            for (int64_t i = 0; i < chunks(); ++i) {
                const Chunk ch = chunk(i);
                const char* q = static_cast<const char*>(c.q.as()) + ch.q_offset * elem_;
                const char* k = static_cast<const char*>(c.k.as()) + ch.kv_offset * elem_;
                const char* v = static_cast<const char*>(c.v.as()) + ch.kv_offset * elem_;
                char* o = baseline_out_.as<char>() + ch.q_offset * elem_;
                const int64_t nn = int64_t(n) * n;
                // S^T (column-major n x n) = K (n x d) Q^T: scores row-major [i, j].
                CK_BENCH_STEP(st, cublasGemmStridedBatchedEx(
                                      bench_.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, n, n, d, &sc, k,
                                      cuda_type(), int(ch.kv_row), ch.kv_step, q, cuda_type(),
                                      int(ch.q_row), d, &zero, scores_.as(), CUDA_R_32F, n, nn,
                                      ch.count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
                with_type([&](auto t) {
                    using T = decltype(t);
                    masked_softmax_kernel<T><<<dim3(unsigned(n), unsigned(ch.count)), kThreads, 0,
                                               bench_.stream()>>>(scores_.as<float>(), n, 1.f,
                                                                  s_.causal, probs_.as<T>());
                });
                CK_BENCH_STEP(st, cudaGetLastError());
                // O^T (column-major d x n) = V^T (d x n) P^T.
                CK_BENCH_STEP(st, cublasGemmStridedBatchedEx(
                                      bench_.cublas(), CUBLAS_OP_N, CUBLAS_OP_N, d, n, n, &one, v,
                                      cuda_type(), int(ch.kv_row), ch.kv_step, probs_.as(),
                                      cuda_type(), n, nn, &zero, o, cuda_type(), int(ch.q_row), d,
                                      ch.count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            }
        };
    }

    // The naive and tiled pipelines: scores, scale + mask, softmax, PV, per chunk.
    Sequence sequential(bool tiled) {
        return [this, tiled](StepStatus& st, int copy) {
            const Copy& c = copies_[size_t(copy)];
            const int n = int(s_.seqlen), d = int(s_.head_dim);
            const cudaStream_t stream = bench_.stream();
            with_type([&](auto t) {
                using T = decltype(t);
                const T* q = c.q.as<T>();
                const T* k = c.k.as<T>();
                const T* v = c.v.as<T>();
                T* o = baseline_out_.as<T>();
                float* s = scores_.as<float>();
                T* p = probs_.as<T>();
                for (int64_t i = 0; i < chunks(); ++i) {
                    const Chunk ch = chunk(i);
                    const dim3 per_score(unsigned((n + kThreads - 1) / kThreads), unsigned(n),
                                         unsigned(ch.count));
                    const dim3 tiles(unsigned((n + kTile - 1) / kTile),
                                     unsigned((n + kTile - 1) / kTile), unsigned(ch.count));
                    // S[c] = q k^T, then P[c] = softmax(S[c]), O[c] = P[c] v.
                    const auto scores = [&](auto kernel, dim3 grid, int threads) {
                        kernel<<<grid, threads, 0, stream>>>(
                            q + ch.q_offset, ch.q_row, d, k + ch.kv_offset, ch.kv_row, ch.kv_step,
                            n, n, d, s, n, int64_t(n) * n);
                    };
                    const auto values = [&](auto kernel, dim3 grid, int threads) {
                        kernel<<<grid, threads, 0, stream>>>(
                            p, n, int64_t(n) * n, v + ch.kv_offset, ch.kv_row, ch.kv_step, n, d, n,
                            o + ch.q_offset, ch.q_row, d);
                    };
                    if (tiled) scores(tiled_gemm_kernel<true, T, float>, tiles, kTile * kTile);
                    else scores(naive_gemm_kernel<true, T, float>, per_score, kThreads);
                    scale_mask_kernel<<<per_score, kThreads, 0, stream>>>(s, n, scale(), s_.causal);
                    masked_softmax_kernel<T><<<dim3(unsigned(n), unsigned(ch.count)), kThreads,
                                               0, stream>>>(s, n, 1.f, false, p);
                    if (tiled) {
                        const dim3 out_tiles(unsigned((d + kTile - 1) / kTile),
                                             unsigned((n + kTile - 1) / kTile), unsigned(ch.count));
                        values(tiled_gemm_kernel<false, T, T>, out_tiles, kTile * kTile);
                    } else {
                        values(naive_gemm_kernel<false, T, T>,
                               dim3(unsigned((d + kThreads - 1) / kThreads), unsigned(n),
                                    unsigned(ch.count)),
                               kThreads);
                    }
                }
            });
            CK_BENCH_STEP(st, cudaGetLastError());
        };
    }
    Sequence tiled_sequence() { return sequential(true); }
    Sequence naive_sequence() { return sequential(false); }

    Bench& bench_;
    Shape s_;
    ck_dtype_t dtype_;
    size_t elem_;
    std::string shape_;
    std::vector<Copy> copies_;
    DeviceBuffer baseline_out_, scores_, probs_;
    mutable DeviceBuffer cu_seqlens_;
};

}  // namespace prefill_bench

namespace attention_bench {

struct Problem {
    int64_t batch, kv_len;
};
constexpr Problem kProblems[] = {{1, 4096}, {16, 4096}, {64, 2048}, {1, 32768}};
constexpr int kQuickProblems = 2;
constexpr int64_t kHeadsQ = 32, kHeadsKv = 8, kHeadDim = 128, kNewTokens = 1;
constexpr int64_t kPageSizes[] = {0, 16, 64};  // 0: the contiguous cache
constexpr ck_dtype_t kDtype = CK_DTYPE_FP16;

constexpr int kDecodeCallsPerGraph = 32;  // rounded up to a multiple of the copies

// What the cache holds.
struct KvCache {
    const char* name;  // appended to the row's kernel name
    ck_kv_format_t format;
    ck_kv_scaling_t scaling;
};
constexpr KvCache kKvCaches[] = {{"", CK_KV_DTYPE, CK_KV_SCALE_PER_HEAD},
                                 {" kv=fp8/head", CK_KV_FP8_E4M3, CK_KV_SCALE_PER_HEAD},
                                 {" kv=fp8/token", CK_KV_FP8_E4M3, CK_KV_SCALE_PER_TOKEN},
                                 {" kv=int8/token", CK_KV_INT8, CK_KV_SCALE_PER_TOKEN}};

// One copy of a call's buffers.
struct Copy {
    DeviceBuffer q, k, v, out, seqlens, table, workspace, k_scale, v_scale;
};

// A quantized cache's codes (and per-token scales) from uniform values: ck_quantize_fp8 or
// ck_quantize_int8 per row of D values into `codes` and `row_scales` (`rows` rows of Hkv heads).
inline void quantize_cache(const KvCache& kv, int64_t rows, uint64_t seed, DeviceBuffer& values,
                           void* codes, float* row_scales, cudaStream_t stream) {
    const int64_t heads = rows * kHeadsKv;
    fill_uniform(values.as(), kDtype, heads * kHeadDim, seed, -1.f, 1.f, stream);
    if (kv.format == CK_KV_FP8_E4M3)
        CK_BENCH_CHECK(ck_quantize_fp8(values.as(), kDtype, heads, kHeadDim, CK_FP8_E4M3,
                                       CK_PER_ROW, CK_SCALE_DYNAMIC, row_scales,
                                       static_cast<uint8_t*>(codes), stream));
    else
        CK_BENCH_CHECK(ck_quantize_int8(values.as(), kDtype, heads, kHeadDim, CK_PER_ROW,
                                        CK_SCALE_DYNAMIC, row_scales,
                                        static_cast<int8_t*>(codes), stream));
}

inline std::string layout_name(int64_t page_size) {
    return page_size == 0 ? "contiguous" : "paged" + std::to_string(page_size);
}

inline void run_problem(Bench& bench, const Problem& problem, int64_t page_size,
                        const KvCache& cache) {
    RowSpec spec;
    spec.family = "attention";
    spec.kernel = "decode " + layout_name(page_size) + cache.name;
    spec.dtype = "fp16";
    spec.shape = "B=" + std::to_string(problem.batch) + " KV=" + std::to_string(problem.kv_len) +
                 " Hq=32 Hkv=8 D=128";
    if (!bench.wants(spec)) return;

    const int64_t batch = problem.batch, kv = problem.kv_len;
    const bool quantized = cache.format != CK_KV_DTYPE;
    const bool per_token = quantized && cache.scaling == CK_KV_SCALE_PER_TOKEN;
    const int64_t pages_per_seq = page_size ? (kv + page_size - 1) / page_size : 0;
    const int64_t num_pages = batch * pages_per_seq;
    const int64_t rows = page_size ? num_pages * page_size : batch * kv;  // cache rows
    const int64_t cache_bytes = rows * kHeadsKv * kHeadDim * (quantized ? 1 : 2);  // K or V
    const int64_t scale_bytes = per_token ? rows * kHeadsKv * 4 : kHeadsKv * 4;
    const int64_t kv_bytes =
        batch * kv * kHeadsKv * 2 * (kHeadDim * (quantized ? 1 : 2) + (per_token ? 4 : 0));
    const int64_t q_bytes = batch * kNewTokens * kHeadsQ * kHeadDim * 2;
    spec.bytes = double(kv_bytes + 2 * q_bytes);

    ck_attention_decode_params_t p = {sizeof(p)};
    p.dtype = kDtype;
    p.batch = batch, p.seqlen_q = kNewTokens, p.num_heads_q = kHeadsQ;
    p.num_heads_kv = kHeadsKv, p.head_dim = kHeadDim, p.max_seqlen_k = kv;
    p.kv_format = cache.format, p.kv_scaling = cache.scaling;
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
    DeviceBuffer values(quantized ? rows * kHeadsKv * kHeadDim * 2 : 0);  // before quantizing
    for (int c = 0; c < copies; ++c) {
        Copy& s = sets[c];
        s.q = DeviceBuffer(q_bytes);
        s.out = DeviceBuffer(q_bytes);
        s.k = DeviceBuffer(cache_bytes);
        s.v = DeviceBuffer(cache_bytes);
        s.seqlens = DeviceBuffer(batch * 4);
        s.workspace = DeviceBuffer(std::max<size_t>(ws_bytes, 256));
        fill_uniform(s.q.as(), kDtype, q_bytes / 2, 3 * c + 1, -1.f, 1.f, stream);
        if (quantized) {
            // Per-token scales are the quantizers' row scales; per-head runs keep those (the
            // codes of different rows then mean different values: the time is the same).
            DeviceBuffer row_scales[2] = {DeviceBuffer(rows * kHeadsKv * 4),
                                          DeviceBuffer(rows * kHeadsKv * 4)};
            quantize_cache(cache, rows, 3 * c + 2, values, s.k.as(), row_scales[0].as<float>(),
                           stream);
            quantize_cache(cache, rows, 3 * c + 3, values, s.v.as(), row_scales[1].as<float>(),
                           stream);
            s.k_scale = DeviceBuffer(scale_bytes);
            s.v_scale = DeviceBuffer(scale_bytes);
            CK_BENCH_CHECK(cudaMemcpyAsync(s.k_scale.as(), row_scales[0].as(), scale_bytes,
                                           cudaMemcpyDeviceToDevice, stream));
            CK_BENCH_CHECK(cudaMemcpyAsync(s.v_scale.as(), row_scales[1].as(), scale_bytes,
                                           cudaMemcpyDeviceToDevice, stream));
            CK_BENCH_CHECK(cudaStreamSynchronize(stream));  // before row_scales are freed
        } else {
            fill_uniform(s.k.as(), kDtype, cache_bytes / 2, 3 * c + 2, -1.f, 1.f, stream);
            fill_uniform(s.v.as(), kDtype, cache_bytes / 2, 3 * c + 3, -1.f, 1.f, stream);
        }
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
    }

    const auto call_on = [&](const Copy& s) {
        ck_attention_decode_params_t call = p;
        call.q = s.q.as(), call.k_cache = s.k.as(), call.v_cache = s.v.as();
        call.seqlens_k = s.seqlens.as<int32_t>(), call.out = s.out.as();
        call.block_table = page_size ? s.table.as<int32_t>() : nullptr;
        if (quantized) call.k_scale = s.k_scale.as<float>(), call.v_scale = s.v_scale.as<float>();
        return ck_attention_decode(&call, s.workspace.as(), s.workspace.bytes(), stream);
    };
    for (const Copy& s : sets) CK_BENCH_CHECK(call_on(s));  // directly: errors surface here
    CK_BENCH_CHECK(cudaStreamSynchronize(stream));
    const int calls = copies * ((kDecodeCallsPerGraph + copies - 1) / copies);
    std::string why;
    const std::optional<Graph> graph = Graph::capture(
        stream,
        [&](StepStatus& status, int) {
            for (int i = 0; i < calls; ++i)
                CK_BENCH_STEP(status, call_on(sets[size_t(i) % copies]));
        },
        0, &why);
    if (!graph) {
        std::fprintf(stderr, "decode: graph capture failed: %s\n", why.c_str());
        std::exit(kExitFailure);
    }
    Timing t = bench.time([&](int) { graph->launch(stream); });
    t.median_us /= calls, t.min_us /= calls, t.max_us /= calls;
    Row& row = bench.record(spec, t);
    {
        // The splits the library chose: 0 workspace bytes is one split, else the workspace
        // formula's O_s and lse_s (their 256-byte padding is less than one split's share).
        const int64_t q_rows = batch * kNewTokens * kHeadsQ;
        const int64_t splits =
            ws_bytes == 0 ? 1 : int64_t(ws_bytes) / (q_rows * (kHeadDim + 1) * 4);
        Bench::append_note(row, format("%.0f%% copy on K/V bytes", bench.percent_of_copy(
                                           double(kv_bytes), row.time.median_us)));
        Bench::append_note(row, std::to_string(splits) + " splits");
        Bench::append_note(row, std::to_string(calls) + " calls per graph");
    }
}

}  // namespace attention_bench

inline void bench_attention(Bench& bench, const Options& options) {
    if (options.quick) {
        prefill_bench::Problem(bench, prefill_bench::kQuickShape, CK_DTYPE_BF16).run_all(true);
    } else {
        for (ck_dtype_t dtype : {CK_DTYPE_BF16, CK_DTYPE_FP16})
            for (const prefill_bench::Shape& shape : prefill_bench::kShapes)
                prefill_bench::Problem(bench, shape, dtype).run_all(dtype == CK_DTYPE_BF16);
    }
    using namespace attention_bench;
    const int count = options.quick ? kQuickProblems : int(std::size(kProblems));
    for (int i = 0; i < count; ++i)
        for (const KvCache& cache : kKvCaches)
            for (int64_t page_size : kPageSizes)
                run_problem(bench, kProblems[i], page_size, cache);
}
