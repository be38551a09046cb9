// benchmarks/bench_qkv.cuh - family "qkv": the fused Q/K/V projection (ck_qkv_projection) in the
// four 4-bit formats beside the unfused pipeline a user would otherwise run, on the same run.
//
// Problems: Llama-3-8B's attention input projection (hidden 4096, Hq 32, Hkv 8, D 128: N = 6144)
// and Llama-3-70B's (hidden 8192, Hq 64, Hkv 8, D 128: N = 10240) at 1, 16, 512, 2048 and 8192
// tokens, fp16. Rows of each (shape, tokens):
//   cuBLAS fp16 (dequantized weight)   cublasGemmEx fp16 TN on the weight already dequantized to
//                                      fp16: y [T, N] only (no split, no rotation)
//   unfused <format>                   ck_dequantize_<format> of the native weight to fp16 [N, H],
//                                      cublasGemmEx into y, then three strided copies of y into
//                                      q, k, v (cudaMemcpy2DAsync): the pipeline without the
//                                      fused kernel (no rotation either: it favours this row)
//   qkv_projection <format>            ck_qkv_projection on the ck_qkv_prepack'd weight, RoPE
//                                      rotate-half on q and k (rotary_dim 128, positions spread
//                                      over a 8192-row table); baseline: the unfused row
// Formats: INT4 symmetric g128, NF4 blocks of 64, MXFP4, NVFP4. Above 16 tokens every format runs
// the wgmma kernel on Hopper; elsewhere the block formats run the simple tiled kernel (no tensor
// cores), measured there up to 512 tokens only.
// Floors: the fused row's bytes (weight codes + scales + x + q, k, v) over the copy bandwidth,
// and 2 T N H flops over the tensor cores' peak. Buffers are rotated (Bench::rotation_copies)
// so that every call reads its weight from DRAM.
#pragma once

#include "bench_gemm.cuh"

namespace qkv_bench {

struct Layer {
    const char* name;
    int64_t hidden, heads_q, heads_kv, head_dim;
    int64_t n() const { return (heads_q + 2 * heads_kv) * head_dim; }
};
constexpr Layer kLayers[] = {{"llama3-8b", 4096, 32, 8, 128}, {"llama3-70b", 8192, 64, 8, 128}};
constexpr int64_t kTokens[] = {1, 16, 512, 2048, 8192};
constexpr int64_t kBlockFormatMaxTokens = 512;   // without wgmma: the tiled fallback is slow
constexpr int64_t kMaxPosition = 8192;
constexpr float kFloatAbsMax = 1;

struct Format {
    ck_weight4_format_t format;
    const char* name;
    int64_t group;   // INT4 group, NF4 block; MXFP4 32, NVFP4 16
};
constexpr Format kFormats[] = {{CK_WEIGHT4_INT4, "int4 g128", 128},
                               {CK_WEIGHT4_NF4, "nf4 b64", 64},
                               {CK_WEIGHT4_MXFP4, "mxfp4", 32},
                               {CK_WEIGHT4_NVFP4, "nvfp4", 16}};
constexpr size_t kNumFormats = std::size(kFormats);

// One rotation copy: activations, positions, and every format's weight, native and prepacked.
struct Set {
    DeviceBuffer x, positions, dense;
    DeviceBuffer packed[kNumFormats], scales[kNumFormats];      // native storage
    DeviceBuffer w_pre[kNumFormats], s_pre[kNumFormats];        // ck_qkv_prepack'd
    DeviceBuffer g;                                             // NVFP4's global scale
};

class Problem {
  public:
    Problem(Bench& bench, const Layer& layer, int64_t tokens)
        : bench_(bench), layer_(layer), t_(tokens), k_(layer.hidden), n_(layer.n()),
          shape_name_(std::string(layer.name) + " T=" + std::to_string(tokens)) {}

    void run_all() {
        const Row* fp16 = dense_row();
        for (size_t f = 0; f < kNumFormats; ++f) {
            const Row* unfused = unfused_row(f);
            if (kFormats[f].format == CK_WEIGHT4_INT4 || t_ <= kBlockFormatMaxTokens ||
                bench_.device().cc_major == 9)
                fused_row(f, unfused, fp16);
        }
    }

  private:
    double activation_bytes() const { return 2.0 * double(t_) * double(k_ + n_); }
    double native_scale_bytes(const Format& f) const {
        switch (f.format) {
            case CK_WEIGHT4_INT4: return 2.0 * double(n_) * double(k_ / f.group);
            case CK_WEIGHT4_NF4: return 4.0 * double(n_) * double(k_ / f.group);
            default: return double(n_) * double(k_ / f.group);
        }
    }
    double prepacked_scale_bytes(const Format& f) const {
        if (f.format == CK_WEIGHT4_INT4) return 2.0 * double(ck_w4a16_prepacked_groups(n_, k_, f.group));
        return double(ck_block4_prepacked_scales_bytes(ck_block4_format_t(f.format - 1), n_, k_, f.group));
    }
    double prepacked_bytes(const Format& f) const {
        return double(ck_w4a16_prepacked_bytes(n_, k_)) + prepacked_scale_bytes(f);
    }

    RowSpec spec_for(const std::string& kernel, double bytes) {
        return gemm_bench::weight_only_spec("qkv", kernel, shape_name_, bytes, t_, n_, k_,
                                            int(sets().size()));
    }

    ck_qkv_params_t params(const Format& f, const Set& s) const {
        ck_qkv_params_t p{};
        p.struct_size = sizeof(p);
        p.tokens = t_;
        p.hidden = k_;
        p.num_heads_q = layer_.heads_q;
        p.num_heads_kv = layer_.heads_kv;
        p.head_dim = layer_.head_dim;
        p.dtype = CK_DTYPE_FP16;
        p.format = f.format;
        p.group_size = f.group;
        p.mode = CK_INT4_SYMMETRIC;
        p.rope_style = CK_ROPE_NEOX;
        p.rotary_dim = layer_.head_dim;
        p.x = s.x.as();
        p.global_scale = f.format == CK_WEIGHT4_NVFP4 ? s.g.as<float>() : nullptr;
        p.positions = s.positions.as<int32_t>();
        p.cos_sin = cos_sin_.as<float>();
        p.max_position = kMaxPosition;
        p.q = q_.as();
        p.k = k_out_.as();
        p.v = v_.as();
        return p;
    }

    void gemm(const void* w, const void* x, void* y) {
        gemm_bench::cublas_fp16_linear(bench_, w, x, y, t_, n_, k_);
    }

    const Row* dense_row() {
        RowSpec spec = spec_for("cuBLAS fp16 (dequantized weight)",
                                2.0 * double(n_) * double(k_) + activation_bytes());
        if (!bench_.wants(spec)) return nullptr;
        return bench_.run(spec, [this](int i) {
            const Set& s = set(i);
            gemm(s.dense.as(), s.x.as(), y_.as());
        });
    }

    // The weight dequantized to fp16 [N, H] by the format's own entry point.
    void dequantize(size_t f, const Set& s, cudaStream_t st) {
        const Format& fmt = kFormats[f];
        const uint8_t* packed = s.packed[f].as<uint8_t>();
        switch (fmt.format) {
            case CK_WEIGHT4_INT4:
                CK_BENCH_CHECK(ck_dequantize_int4(packed, s.scales[f].as(), nullptr, n_, k_,
                                                  fmt.group, CK_INT4_SYMMETRIC, scratch_.as(),
                                                  CK_DTYPE_FP16, st));
                break;
            case CK_WEIGHT4_NF4:
                CK_BENCH_CHECK(ck_dequantize_nf4(packed, s.scales[f].as<float>(), n_, k_,
                                                 fmt.group, scratch_.as(), CK_DTYPE_FP16, st));
                break;
            case CK_WEIGHT4_MXFP4:
                CK_BENCH_CHECK(ck_dequantize_mxfp4(packed, s.scales[f].as<uint8_t>(), n_, k_,
                                                   scratch_.as(), CK_DTYPE_FP16, st));
                break;
            default:
                CK_BENCH_CHECK(ck_dequantize_nvfp4(packed, s.scales[f].as<uint8_t>(),
                                                   s.g.as<float>(), n_, k_, scratch_.as(),
                                                   CK_DTYPE_FP16, st));
        }
    }

    const Row* unfused_row(size_t f) {
        const Format& fmt = kFormats[f];
        // Native weight read, fp16 weight written and read back, y written and read, q/k/v written.
        const double bytes = double(n_) * double(k_) / 2 + native_scale_bytes(fmt) +
                             4.0 * double(n_) * double(k_) + 2.0 * double(t_) * double(k_) +
                             6.0 * double(t_) * double(n_);
        RowSpec spec = spec_for(std::string("unfused ") + fmt.name +
                                    " (dequantize + cuBLAS + split)", bytes);
        if (!bench_.wants(spec)) return nullptr;
        return bench_.run(spec, [this, f](int i) {
            const Set& s = set(i);
            cudaStream_t st = bench_.stream();
            dequantize(f, s, st);
            gemm(scratch_.as(), s.x.as(), y_.as());
            const size_t row = size_t(n_) * 2, dq = size_t(layer_.heads_q * layer_.head_dim) * 2,
                         dkv = size_t(layer_.heads_kv * layer_.head_dim) * 2;
            const char* y = static_cast<const char*>(y_.as());
            CK_BENCH_CHECK(cudaMemcpy2DAsync(q_.as(), dq, y, row, dq, size_t(t_),
                                             cudaMemcpyDeviceToDevice, st));
            CK_BENCH_CHECK(cudaMemcpy2DAsync(k_out_.as(), dkv, y + dq, row, dkv, size_t(t_),
                                             cudaMemcpyDeviceToDevice, st));
            CK_BENCH_CHECK(cudaMemcpy2DAsync(v_.as(), dkv, y + dq + dkv, row, dkv, size_t(t_),
                                             cudaMemcpyDeviceToDevice, st));
        });
    }

    void fused_row(size_t f, const Row* unfused, const Row* fp16) {
        const Format& fmt = kFormats[f];
        const double weight = prepacked_bytes(fmt);
        RowSpec spec = spec_for(std::string("qkv_projection ") + fmt.name + " rope",
                                weight + activation_bytes() + 4.0 * double(t_));
        if (!bench_.wants(spec)) return;
        Row* row = bench_.run(spec, [this, f](int i) {
            const ck_qkv_params_t p = params_of(f, i);
            CK_BENCH_CHECK(ck_qkv_projection(&p, bench_.stream()));
        });
        if (unfused) Bench::set_baseline(*row, "unfused", unfused->time);
        kernel_override_note(*row, fmt.format == CK_WEIGHT4_INT4 ? "CK_GEMM_W4A16_KERNEL"
                                                                             : "CK_GEMM_BLOCK4_KERNEL");
        Bench::append_note(*row, "weight stream " +
                                     format("%.1f", bench_.percent_of_copy(weight, row->time.median_us)) +
                                     "% of copy BW");
        if (fp16)
            Bench::append_note(*row, "vs cuBLAS fp16 " +
                                         format("%.2f", fp16->time.median_us / row->time.median_us) +
                                         "x");
    }

    ck_qkv_params_t params_of(size_t f, int i) {
        const Set& s = set(i);
        ck_qkv_params_t p = params(kFormats[f], s);
        p.w_prepacked = s.w_pre[f].as<uint8_t>();
        p.scales_prepacked = s.s_pre[f].as();
        return p;
    }

    const Set& set(int i) { return sets()[size_t(i) % sets().size()]; }

    // The rotation copies and the shared outputs, allocated on first use: each format's weight is
    // the library's own quantization of a random fp16 [N, H] weight, prepacked by ck_qkv_prepack.
    const std::vector<Set>& sets() {
        if (!sets_.empty()) return sets_;
        double per_copy = 2.0 * double(n_) * double(k_) + 2.0 * double(t_) * double(k_);
        double smallest = 1e300;
        for (const Format& f : kFormats) {
            per_copy += double(n_) * double(k_) / 2 + native_scale_bytes(f) + prepacked_bytes(f);
            smallest = std::min(smallest, prepacked_bytes(f));
        }
        const int copies = bench_.rotation_copies(smallest + activation_bytes(), per_copy);
        cudaStream_t st = bench_.stream();
        y_ = DeviceBuffer(2 * size_t(t_ * n_));
        q_ = DeviceBuffer(2 * size_t(t_ * layer_.heads_q * layer_.head_dim));
        k_out_ = DeviceBuffer(2 * size_t(t_ * layer_.heads_kv * layer_.head_dim));
        v_ = DeviceBuffer(2 * size_t(t_ * layer_.heads_kv * layer_.head_dim));
        scratch_ = DeviceBuffer(2 * size_t(n_ * k_));
        cos_sin_ = DeviceBuffer(sizeof(float) * size_t(kMaxPosition * layer_.head_dim));
        fill_uniform(cos_sin_.as(), CK_DTYPE_FP32, kMaxPosition * layer_.head_dim, 41000, -1.f, 1.f, st);
        for (int c = 0; c < copies; ++c) {
            const uint64_t seed = 42000 + 100 * uint64_t(c);
            Set s;
            s.x = DeviceBuffer(2 * size_t(t_ * k_));
            s.dense = DeviceBuffer(2 * size_t(n_ * k_));
            s.positions = DeviceBuffer(sizeof(int32_t) * size_t(t_));
            s.g = DeviceBuffer(sizeof(float));
            fill_uniform(s.x.as(), CK_DTYPE_FP16, t_ * k_, seed + 1, -kFloatAbsMax, kFloatAbsMax, st);
            fill_uniform(s.dense.as(), CK_DTYPE_FP16, n_ * k_, seed + 2, -kFloatAbsMax, kFloatAbsMax, st);
            fill_uniform(s.positions.as(), CK_DTYPE_INT32, t_, seed + 3, 0.f, float(kMaxPosition - 1), st);
            for (size_t f = 0; f < kNumFormats; ++f) {
                const Format& fmt = kFormats[f];
                s.packed[f] = DeviceBuffer(size_t(n_ * k_ / 2));
                s.scales[f] = DeviceBuffer(size_t(native_scale_bytes(fmt)));
                uint8_t* packed = s.packed[f].as<uint8_t>();
                switch (fmt.format) {
                    case CK_WEIGHT4_INT4:
                        CK_BENCH_CHECK(ck_quantize_int4(s.dense.as(), CK_DTYPE_FP16, n_, k_, fmt.group,
                                                        CK_INT4_SYMMETRIC, packed, s.scales[f].as(),
                                                        nullptr, st));
                        break;
                    case CK_WEIGHT4_NF4:
                        CK_BENCH_CHECK(ck_quantize_nf4(s.dense.as(), CK_DTYPE_FP16, n_, k_, fmt.group,
                                                       packed, s.scales[f].as<float>(), st));
                        break;
                    case CK_WEIGHT4_MXFP4:
                        CK_BENCH_CHECK(ck_quantize_mxfp4(s.dense.as(), CK_DTYPE_FP16, n_, k_, packed,
                                                         s.scales[f].as<uint8_t>(), st));
                        break;
                    default:
                        CK_BENCH_CHECK(ck_quantize_nvfp4(s.dense.as(), CK_DTYPE_FP16, n_, k_,
                                                         CK_SCALE_DYNAMIC, s.g.as<float>(), packed,
                                                         s.scales[f].as<uint8_t>(), st));
                }
                s.w_pre[f] = DeviceBuffer(size_t(ck_w4a16_prepacked_bytes(n_, k_)));
                s.s_pre[f] = DeviceBuffer(size_t(prepacked_scale_bytes(fmt)));
                const ck_qkv_params_t p = params(fmt, s);
                CK_BENCH_CHECK(ck_qkv_prepack(&p, packed, s.scales[f].as(), nullptr,
                                              s.w_pre[f].as<uint8_t>(), s.s_pre[f].as(), nullptr, st));
            }
            sets_.push_back(std::move(s));
        }
        CK_BENCH_CHECK(cudaStreamSynchronize(st));
        return sets_;
    }

    Bench& bench_;
    const Layer& layer_;
    int64_t t_, k_, n_;
    std::string shape_name_;
    std::vector<Set> sets_;
    DeviceBuffer y_, q_, k_out_, v_, scratch_, cos_sin_;
};

}  // namespace qkv_bench

inline void bench_qkv(Bench& bench, const Options&) {
    using namespace qkv_bench;
    for (const Layer& layer : kLayers)
        for (int64_t t : kTokens) Problem(bench, layer, t).run_all();
}
