// benchmarks/bench.cu - ck_bench: every kernel of libcuda_kernels against its roofline (and, for
// GEMMs and the MoE layer, beside cuBLAS) on one GPU; writes benchmarks/results/<gpu>.{json,md}.
//
//   make bench                     builds build/ck_bench and runs it with --sample (a first look)
//   make bench-full                the whole sweep, --out benchmarks/results (what results/ keeps)
//   build/ck_bench --sample        representative rows only (kSampleFilters), fully measured
//   build/ck_bench --quick         a smoke test: small sizes, few reps (writes <gpu>-quick.*)
//   build/ck_bench --filter int4   only rows whose "family/kernel/dtype/shape" contains "int4"
//
// Adding a kernel family: write `void bench_<family>(Bench&, const Options&)` below (or in a
// benchmarks/bench_<family>.cuh included here), and add it to kFamilies at the bottom. Each row
// goes through bench.run(spec, launch): see bench.cuh for the harness and bench_quantize for an
// example. Exit status: 0 success, 1 a failed call or bad option, 2 no CUDA device.
#include <cerrno>

#include "bench.cuh"

// ================================================================================================
// Family "quantize": INT8 and packed INT4 quantize / dequantize (memory-bound).
//
// Floors: every variant but one must move (input read once + output written once + scales and
// zeros). Per-tensor dynamic INT8 needs the tensor's absmax before it can write the first code, so
// unless the tensor fits on chip it reads x twice; its % copy is still computed against the
// one-read minimum (the metric the targets use), and the note gives it against the two-read floor.
// Target: dynamic scales cost at most kDynamicOverStaticTarget x the static time.
// ================================================================================================
namespace quantize_bench {

constexpr float kInputAbsMax = 4.0f;                  // x uniform in [-4, 4]
constexpr float kStaticScale = kInputAbsMax / 127.0f;  // what calibration would find for that x
constexpr float kPerRowScaleSpread = 0.2f;            // per-row static scales within +-20% of it
constexpr float kInt4ScaleMin = 0.01f;                // random INT4 scales for the dequantizers
constexpr float kInt4ScaleMax = 0.5f;
constexpr int kInt4MaxCode = 15;                      // asymmetric zero points in [0, 15]
constexpr int kInt8MaxCode = 127;
constexpr int64_t kMainGroup = 128;
constexpr int64_t kSmallGroup = 32;                   // the most scales: sizes the scale buffer
constexpr int kLargeShapeFactor = 4;                  // fp16 also at 4x the elements (16384^2)
constexpr double kDynamicOverStaticTarget = 1.3;

// rows x cols with cols the largest power of two <= sqrt(elements): 64M -> 8192 x 8192.
inline std::pair<int64_t, int64_t> square_shape(int64_t elements) {
    int64_t cols = 1;
    while ((2 * cols) * (2 * cols) <= elements) cols *= 2;
    return {std::max<int64_t>(elements / cols, 1), cols};
}

inline const char* granularity_name(ck_granularity_t g) {
    return g == CK_PER_TENSOR ? "per-tensor" : "per-row";
}
inline const char* scale_mode_name(ck_scale_mode_t m) {
    return m == CK_SCALE_STATIC ? "static" : "dynamic";
}
inline std::string group_name(int64_t group_size) {
    return group_size == CK_GROUP_ROW ? "row" : "g" + std::to_string(group_size);
}

// One copy of every buffer the quantize kernels read or write.
struct BufferSet {
    DeviceBuffer x;               // [rows, cols] input dtype
    DeviceBuffer q8;              // [rows, cols] int8
    DeviceBuffer static_scales;   // [rows] float, positive, never written
    DeviceBuffer dynamic_scales;  // [rows] float, written by dynamic quantization
    DeviceBuffer packed4;         // [rows, (cols + 1) / 2] packed int4
    DeviceBuffer scales4;         // [rows, groups(kSmallGroup)] in the input dtype
    DeviceBuffer zeros4;          // [rows, groups(kSmallGroup)] uint8
    DeviceBuffer out;             // [rows, cols] dequantized, input dtype
};

// A dynamic-vs-static comparison, collected across problems for the family's extra table.
struct DynamicStaticPair {
    std::string dtype, shape, granularity;
    double static_us, dynamic_us;
};

// The quantize rows of one (dtype, rows, cols). Buffers are allocated on the first row the filter
// keeps, and rotated through when the problem is small enough for L2 to matter.
class Problem {
  public:
    Problem(Bench& bench, ck_dtype_t dtype, int64_t rows, int64_t cols)
        : bench_(bench), dtype_(dtype), rows_(rows), cols_(cols),
          elem_(dtype_size(dtype)), shape_(shape_string(rows, cols)) {}

    void run_all(std::vector<DynamicStaticPair>& pairs) {
        for (ck_granularity_t g : {CK_PER_TENSOR, CK_PER_ROW}) {
            Row* stat = quantize_int8(g, CK_SCALE_STATIC);
            Row* dyn = quantize_int8(g, CK_SCALE_DYNAMIC);
            if (stat && dyn) {
                const double ratio = dyn->time.median_us / stat->time.median_us;
                Bench::append_note(*dyn, "dynamic/static " + format("%.2fx", ratio));
                pairs.push_back({dtype_name(dtype_), shape_, granularity_name(g),
                                 stat->time.median_us, dyn->time.median_us});
            }
        }
        for (ck_granularity_t g : {CK_PER_TENSOR, CK_PER_ROW}) dequantize_int8(g);
        quantize_int4(kMainGroup, CK_INT4_SYMMETRIC);
        quantize_int4(kMainGroup, CK_INT4_ASYMMETRIC);
        quantize_int4(kSmallGroup, CK_INT4_SYMMETRIC);
        quantize_int4(CK_GROUP_ROW, CK_INT4_SYMMETRIC);
        dequantize_int4(kMainGroup, CK_INT4_SYMMETRIC);
        dequantize_int4(kMainGroup, CK_INT4_ASYMMETRIC);
    }

  private:
    double elements() const { return double(rows_) * double(cols_); }
    double x_bytes() const { return elements() * double(elem_); }  // also the dequantized output
    double q8_bytes() const { return elements(); }
    double packed_bytes() const { return double(rows_) * double((cols_ + 1) / 2); }
    int64_t groups(int64_t group_size) const { return ck_int4_groups_per_row(cols_, group_size); }
    double int8_scale_bytes(ck_granularity_t g) const {
        return sizeof(float) * (g == CK_PER_TENSOR ? 1.0 : double(rows_));
    }
    double int4_meta_bytes(int64_t group_size, ck_int4_mode_t mode) const {
        const double per_group = double(elem_) + (mode == CK_INT4_ASYMMETRIC ? 1.0 : 0.0);
        return double(rows_) * double(groups(group_size)) * per_group;
    }

    Row* quantize_int8(ck_granularity_t g, ck_scale_mode_t mode) {
        RowSpec spec = spec_for(std::string("quantize_int8 ") + granularity_name(g) + " " +
                                    scale_mode_name(mode),
                                x_bytes() + q8_bytes() + int8_scale_bytes(g));
        const bool dynamic = mode == CK_SCALE_DYNAMIC;
        Row* row = run(spec, [this, g, mode, dynamic](int i) {
            const BufferSet& s = set(i);
            float* scales = dynamic ? s.dynamic_scales.as<float>() : s.static_scales.as<float>();
            CK_BENCH_CHECK(ck_quantize_int8(s.x.as(), dtype_, rows_, cols_, g, mode, scales,
                                            s.q8.as<int8_t>(), bench_.stream()));
        });
        if (row && dynamic && g == CK_PER_TENSOR) {
            const double two_reads = row->bytes + x_bytes();
            Bench::append_note(*row, "vs the two-read floor (x read twice): " +
                                         format("%.1f", bench_.percent_of_copy(
                                                            two_reads, row->time.median_us)) +
                                         "% of copy BW");
        }
        return row;
    }

    void dequantize_int8(ck_granularity_t g) {
        RowSpec spec = spec_for(std::string("dequantize_int8 ") + granularity_name(g),
                                q8_bytes() + int8_scale_bytes(g) + x_bytes());
        run(spec, [this, g](int i) {
            const BufferSet& s = set(i);
            CK_BENCH_CHECK(ck_dequantize_int8(s.q8.as<int8_t>(), s.static_scales.as<float>(), rows_,
                                              cols_, g, s.out.as(), dtype_, bench_.stream()));
        });
    }

    void quantize_int4(int64_t group_size, ck_int4_mode_t mode) {
        const bool asym = mode == CK_INT4_ASYMMETRIC;
        RowSpec spec = spec_for(std::string("quantize_int4 ") + (asym ? "asym " : "sym ") +
                                    group_name(group_size),
                                x_bytes() + packed_bytes() + int4_meta_bytes(group_size, mode));
        run(spec, [this, group_size, mode, asym](int i) {
            const BufferSet& s = set(i);
            CK_BENCH_CHECK(ck_quantize_int4(s.x.as(), dtype_, rows_, cols_, group_size, mode,
                                            s.packed4.as<uint8_t>(), s.scales4.as(),
                                            asym ? s.zeros4.as<uint8_t>() : nullptr,
                                            bench_.stream()));
        });
    }

    void dequantize_int4(int64_t group_size, ck_int4_mode_t mode) {
        const bool asym = mode == CK_INT4_ASYMMETRIC;
        RowSpec spec = spec_for(std::string("dequantize_int4 ") + (asym ? "asym " : "sym ") +
                                    group_name(group_size),
                                packed_bytes() + int4_meta_bytes(group_size, mode) + x_bytes());
        run(spec, [this, group_size, mode, asym](int i) {
            const BufferSet& s = set(i);
            CK_BENCH_CHECK(ck_dequantize_int4(s.packed4.as<uint8_t>(), s.scales4.as(),
                                              asym ? s.zeros4.as<uint8_t>() : nullptr, rows_,
                                              cols_, group_size, mode, s.out.as(), dtype_,
                                              bench_.stream()));
        });
    }

    RowSpec spec_for(const std::string& kernel, double bytes) const {
        RowSpec spec = row_spec("quantize", kernel, dtype_name(dtype_), shape_);
        spec.bytes = bytes;
        return spec;
    }

    Row* run(RowSpec spec, const Launch& launch) {
        if (!bench_.wants(spec)) return nullptr;
        allocate();
        spec.copies = int(sets_.size());
        return bench_.run(spec, launch);
    }

    const BufferSet& set(int iteration) const { return sets_[size_t(iteration) % sets_.size()]; }

    // Allocates and fills the rotation copies. The smallest call (INT4 dequantize: packed codes in,
    // x-sized output out) decides how many copies L2 needs.
    void allocate() {
        if (!sets_.empty()) return;
        const double smallest_call = packed_bytes() + x_bytes();
        const double per_copy = 2 * x_bytes() + q8_bytes() + packed_bytes() +
                                2.0 * sizeof(float) * rows_ + int4_meta_bytes(kSmallGroup,
                                                                              CK_INT4_ASYMMETRIC);
        const int copies = bench_.rotation_copies(smallest_call, per_copy);
        for (int c = 0; c < copies; ++c) sets_.push_back(make_set(uint64_t(c)));
        CK_BENCH_CHECK(cudaStreamSynchronize(bench_.stream()));
    }

    BufferSet make_set(uint64_t copy) const {
        const int64_t n = rows_ * cols_;
        const int64_t meta = rows_ * groups(kSmallGroup);
        const int64_t packed = rows_ * ((cols_ + 1) / 2);
        BufferSet s;
        s.x = DeviceBuffer(size_t(n) * elem_);
        s.q8 = DeviceBuffer(size_t(n));
        s.static_scales = DeviceBuffer(sizeof(float) * size_t(rows_));
        s.dynamic_scales = DeviceBuffer(sizeof(float) * size_t(rows_));
        s.packed4 = DeviceBuffer(size_t(packed));
        s.scales4 = DeviceBuffer(size_t(meta) * elem_);
        s.zeros4 = DeviceBuffer(size_t(meta));
        s.out = DeviceBuffer(size_t(n) * elem_);

        // Distinct seeds per buffer and per copy; every input random, never zeros.
        const uint64_t seed = 1000 * (copy + 1);
        cudaStream_t st = bench_.stream();
        fill_uniform(s.x.as(), dtype_, n, seed + 1, -kInputAbsMax, kInputAbsMax, st);
        fill_uniform(s.static_scales.as(), CK_DTYPE_FP32, rows_, seed + 2,
                     kStaticScale * (1 - kPerRowScaleSpread), kStaticScale * (1 + kPerRowScaleSpread),
                     st);
        fill_uniform(s.dynamic_scales.as(), CK_DTYPE_FP32, rows_, seed + 3, kStaticScale,
                     kStaticScale, st);
        fill_uniform(s.q8.as(), CK_DTYPE_INT8, n, seed + 4, -kInt8MaxCode, kInt8MaxCode, st);
        fill_random_bytes(s.packed4.as(), packed, seed + 5, st);
        fill_uniform(s.scales4.as(), dtype_, meta, seed + 6, kInt4ScaleMin, kInt4ScaleMax, st);
        fill_uniform(s.zeros4.as(), CK_DTYPE_UINT8, meta, seed + 7, 0, kInt4MaxCode, st);
        fill_uniform(s.out.as(), dtype_, n, seed + 8, -kInputAbsMax, kInputAbsMax, st);
        return s;
    }

    Bench& bench_;
    ck_dtype_t dtype_;
    int64_t rows_, cols_;
    size_t elem_;
    std::string shape_;
    std::vector<BufferSet> sets_;
};

inline ExtraTable dynamic_static_table(const std::vector<DynamicStaticPair>& pairs) {
    ExtraTable t;
    t.family = "quantize";
    t.title = "INT8 dynamic vs static scales (target: dynamic <= " +
              format("%.1f", kDynamicOverStaticTarget) + "x static)";
    t.headers = {"dtype", "shape", "granularity", "static us", "dynamic us", "dynamic/static",
                 "target"};
    for (const auto& p : pairs) {
        const double ratio = p.dynamic_us / p.static_us;
        t.cells.push_back({p.dtype, p.shape, p.granularity, format("%.1f", p.static_us),
                           format("%.1f", p.dynamic_us), format("%.2fx", ratio),
                           ratio <= kDynamicOverStaticTarget ? "met" : "MISSED"});
    }
    return t;
}

}  // namespace quantize_bench

void bench_quantize(Bench& bench, const Options& options) {
    using namespace quantize_bench;
    std::vector<DynamicStaticPair> pairs;
    const auto [rows, cols] = square_shape(options.size);
    for (ck_dtype_t dtype : {CK_DTYPE_FP32, CK_DTYPE_FP16, CK_DTYPE_BF16}) {
        Problem(bench, dtype, rows, cols).run_all(pairs);
    }
    const auto [big_rows, big_cols] = square_shape(options.size * kLargeShapeFactor);
    Problem(bench, CK_DTYPE_FP16, big_rows, big_cols).run_all(pairs);
    if (!pairs.empty()) bench.add_table(dynamic_static_table(pairs));
}

// ================================================================================================
// Family "gemm": INT8 GEMMs and the cuBLASLt linear layer beside cuBLAS(Lt) (bench_gemm.cuh).
// ================================================================================================
#include "bench_gemm.cuh"

// ================================================================================================
// Family "fp8": the FP8 W8A8 GEMM beside cuBLASLt FP8, the INT8 GEMM and cuBLAS fp16
// (bench_fp8.cuh).
// ================================================================================================
#include "bench_fp8.cuh"

// ================================================================================================
// Family "moe": the Mixture-of-Experts layer (ck_moe_forward) beside dense fp16 pipelines on
// cuBLAS (bench_moe.cuh).
// ================================================================================================
#include "bench_moe.cuh"

// ================================================================================================
// Family "block4": the weight-only GEMM on NF4 / MXFP4 / NVFP4 weights beside INT4 and cuBLAS
// fp16 on the Llama-3 QKV shapes (bench_block4.cuh).
// ================================================================================================
#include "bench_block4.cuh"

// ================================================================================================
// Family "sparse": the W4A16 GEMM on 2:4 and 16:32 sparse INT4 weights beside the dense INT4
// GEMM and cuBLAS fp16 (bench_sparse.cuh).
// ================================================================================================
#include "bench_sparse.cuh"

// ================================================================================================
// Family "qkv": the fused Q/K/V projection with RoPE in the four 4-bit formats beside the unfused
// pipeline (dequantize + cuBLAS + split) and cuBLAS fp16 on the Llama-3 shapes (bench_qkv.cuh).
// ================================================================================================
#include "bench_qkv.cuh"

// ================================================================================================
// Family "attention": decode attention over a contiguous or paged KV cache (ck_attention_decode)
// against the copy bandwidth (bench_attention.cuh).
// ================================================================================================
#include "bench_attention.cuh"

// ================================================================================================
// The program
// ================================================================================================
struct Family {
    const char* name;
    void (*run)(Bench&, const Options&);
};

// Every kernel family, in the order they run and appear in the results.
static const Family kFamilies[] = {
    {"quantize", bench_quantize},
    {"gemm", bench_gemm},
    {"fp8", bench_fp8},
    {"moe", bench_moe},
    {"block4", bench_block4},
    {"sparse", bench_sparse},
    {"qkv", bench_qkv},
    {"attention", bench_attention},
};

// --sample: a first look in a minute or two, measured as the full sweep measures: every quantizer
// on the main fp16 tensor, every GEMM row (beside cuBLAS) at one weight shape for a decode and a
// prefill batch, the MoE layer (beside its fp16 baselines) at the same two regimes, the block
// 4-bit GEMMs, one causal prefill attention shape beside its unfused pipelines, and decode
// attention on a contiguous and two paged caches at one batch.
static const char* const kSampleFilters[] = {
    "/fp16/8192x8192$",
    "/M=1 K=4096 N=4096$",
    "/M=256 K=4096 N=4096$",
    "/mixtral T=16$",
    "/mixtral T=1024$",
    "block4/",
    "/bf16/B=1 H=32/32 S=2048 D=128 causal$",
    "/B=16 KV=4096 Hq=32 Hkv=8 D=128$",
};

static void print_usage(FILE* to) {
    std::fprintf(to,
                 "usage: ck_bench [--out DIR] [--filter SUBSTR[,SUBSTR...]] [--sample] [--quick]\n"
                 "                [--size N] [--reps N] [--warmup N] [--batch N]\n"
                 "  --out DIR      results directory (default benchmarks/results): DIR/<gpu>.json, .md\n"
                 "  --filter S     run only rows whose key family/kernel/dtype/shape contains S\n"
                 "                 (repeatable; commas separate alternatives; a trailing $ anchors S\n"
                 "                 at the key's end), e.g. /dequantize_int4 or '/M=1 K=4096 N=4096$'\n"
                 "  --sample       representative rows only (one shape per family, two batch sizes),\n"
                 "                 fully measured; writes DIR/<gpu>-sample.*\n"
                 "  --quick        smoke test: %lldM elements, %d reps; writes DIR/<gpu>-quick.*\n"
                 "  --size N       elements of memory-bound problems (K/M/G suffixes; default %lldM)\n"
                 "  --reps N       timed runs per row (default %d)\n"
                 "  --warmup N     untimed runs first (default %d)\n"
                 "  --batch N      calls per event pair, launched back to back (default 1): the\n"
                 "                 time per call without the gap between two timed samples\n"
                 "Exit status: 0 success, 1 failure, 2 no CUDA device.\n",
                 (long long)(kQuickSize >> 20), kQuickReps, (long long)(kDefaultSize >> 20),
                 kDefaultReps, kDefaultWarmup);
}

[[noreturn]] static void usage_error(const std::string& message) {
    std::fprintf(stderr, "ck_bench: %s\n", message.c_str());
    print_usage(stderr);
    std::exit(kExitFailure);
}

// "64M" -> 67108864 (binary suffixes K, M, G).
static int64_t parse_count(const std::string& text, const char* option) {
    constexpr int64_t kMaxCount = int64_t(1) << 40;
    char* end = nullptr;
    errno = 0;
    const long long value = std::strtoll(text.c_str(), &end, 10);
    int64_t multiplier = 1;
    const std::string suffix = end ? end : "";
    if (suffix == "K" || suffix == "k") multiplier = int64_t(1) << 10;
    else if (suffix == "M" || suffix == "m") multiplier = int64_t(1) << 20;
    else if (suffix == "G" || suffix == "g") multiplier = int64_t(1) << 30;
    else if (!suffix.empty()) usage_error(std::string(option) + ": cannot parse '" + text + "'");
    if (errno != 0 || end == text.c_str() || value < 1 || value > kMaxCount / multiplier)
        usage_error(std::string(option) + ": '" + text + "' is not a count in [1, 2^40]");
    return int64_t(value) * multiplier;
}

static std::string shell_quote(const std::string& arg) {
    if (!arg.empty() && arg.find_first_of(" \t'\"$\\") == std::string::npos) return arg;
    std::string out = "'";
    for (char c : arg) out += (c == '\'') ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

static Options parse_options(int argc, char** argv) {
    Options options;
    bool size_given = false, reps_given = false, warmup_given = false;
    for (int i = 0; i < argc; ++i) options.command_line += (i ? " " : "") + shell_quote(argv[i]);

    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) usage_error(arg + " needs a value");
            return argv[++i];
        };
        if (arg == "--help" || arg == "-h") {
            print_usage(stdout);
            std::exit(0);
        } else if (arg == "--out") {
            options.out_dir = value();
        } else if (arg == "--filter") {
            std::stringstream alternatives(value());
            for (std::string f; std::getline(alternatives, f, ',');)
                if (!f.empty()) options.filters.push_back(f);
        } else if (arg == "--sample") {
            options.sample = true;
        } else if (arg == "--quick") {
            options.quick = true;
        } else if (arg == "--size") {
            options.size = parse_count(value(), "--size");
            size_given = true;
        } else if (arg == "--reps") {
            options.reps = int(std::min<int64_t>(parse_count(value(), "--reps"), 100000));
            reps_given = true;
        } else if (arg == "--warmup") {
            options.warmup = int(std::min<int64_t>(parse_count(value(), "--warmup"), 100000));
            warmup_given = true;
        } else if (arg == "--batch") {
            options.batch = int(std::min<int64_t>(parse_count(value(), "--batch"), 1000));
        } else {
            usage_error("unknown option '" + arg + "'");
        }
    }
    if (options.sample) {
        if (options.quick || size_given || !options.filters.empty())
            usage_error("--sample takes no --quick, --size or --filter");
        options.filters.insert(options.filters.end(), std::begin(kSampleFilters),
                               std::end(kSampleFilters));
    }
    if (options.quick) {
        if (!size_given) options.size = kQuickSize;
        if (!reps_given) options.reps = kQuickReps;
        if (!warmup_given) options.warmup = kQuickWarmup;
    }
    return options;
}

int main(int argc, char** argv) {
    const Options options = parse_options(argc, argv);

    // No GPU is an expected situation (CI, a laptop), not a crash: say so and exit with 2.
    int device_count = 0;
    const ck_status_t status = ck_device_count(&device_count);
    if (status == CK_STATUS_NO_DEVICE || (status == CK_STATUS_SUCCESS && device_count == 0)) {
        std::fprintf(stderr, "ck_bench: no CUDA device found; the benchmark needs an NVIDIA GPU\n");
        return kExitNoDevice;
    }
    CK_BENCH_CHECK(status);

    Bench bench(options, /*ordinal=*/0);
    std::printf("ck_bench%s\n%s",
                options.quick    ? " (--quick: a smoke test, not a measurement)"
                : options.sample ? " (--sample: representative rows; make bench-full runs them all)"
                                 : "",
                bench.header_lines("  ").c_str());
    std::fflush(stdout);

    for (const Family& family : kFamilies) {
        std::fprintf(stderr, "[%s]\n", family.name);
        family.run(bench, options);
        bench.print_family(family.name);
    }
    CK_BENCH_CHECK(cudaDeviceSynchronize());

    const std::string base = bench.write_results();
    std::printf("\nwrote %s.json and %s.md\n", base.c_str(), base.c_str());
    return 0;
}
