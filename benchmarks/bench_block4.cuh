// benchmarks/bench_block4.cuh - family "block4": the weight-only GEMM on block 4-bit weights
// (ck_gemm_block4_prepacked: NF4 blocks of 64, MXFP4, NVFP4) beside the prepacked INT4 W4A16
// GEMM and cuBLAS fp16, on the same run.
//
// Problems: Llama-3-8B's QKV projection (K 4096, N 6144) and Llama-3-70B's (K 8192, N 10240) at
// decode M (1, 16). Rows of each (shape, M), fp16 activations, no bias, no activation:
//   cuBLAS fp16 (reference)        cublasGemmEx fp16 TN on the unquantized [N, K] weight
//   gemm_w4a16_prepacked fp16 g128 ck_gemm_w4a16_prepacked, symmetric INT4, groups of 128;
//                                  baseline cuBLAS fp16
//   gemm_block4 fp16 <format>      ck_gemm_block4_prepacked (auto variant) on the weight that
//                                  ck_quantize_<format> made of a random fp16 one, put through
//                                  ck_block4_prepack once, outside timing; baseline cuBLAS fp16.
//                                  Bytes: prepacked codes + scales + x + out. Notes: the weight
//                                  stream as a % of copy bandwidth, the time against the INT4 row.
// Floors: the weight bytes over the copy bandwidth (NF4 b64: 0.5 + 4/64 bytes per weight; MXFP4:
// 0.5 + 1/32; NVFP4: 0.5 + 2/32; INT4 g128: 0.5 + 2/128).
// Buffers are rotated (Bench::rotation_copies) so that every call reads its weight from DRAM.
#pragma once

#include "bench_gemm.cuh"

namespace block4_bench {

using gemm_bench::Shape;

constexpr Shape kShapes[] = {{4096, 6144}, {8192, 10240}};  // Llama-3-8B QKV, Llama-3-70B QKV
constexpr int64_t kTokens[] = {1, 16};
constexpr int64_t kNf4BlockSize = 64;   // bitsandbytes' default

struct Format {
    ck_block4_format_t format;
    const char* name;
    int64_t blocksize;
};
constexpr Format kFormats[] = {{CK_BLOCK4_NF4, "nf4 b64", kNf4BlockSize},
                               {CK_BLOCK4_MXFP4, "mxfp4", 32},
                               {CK_BLOCK4_NVFP4, "nvfp4", 16}};

// One rotation copy of a problem: activations, output, and every weight prepacked.
struct Set {
    DeviceBuffer x, out;                                // [M, K], [M, N] fp16
    DeviceBuffer int4_w, int4_s;                        // ck_w4a16_prepack'd, symmetric g128
    DeviceBuffer w[std::size(kFormats)], s[std::size(kFormats)];  // ck_block4_prepack'd
    DeviceBuffer g;                                     // NVFP4's global scale
    DeviceBuffer dense;                                 // [N, K] fp16 (cuBLAS's weight)
};

class Problem : public gemm_bench::WeightOnlyProblem<Problem, Set> {
  public:
    Problem(Bench& bench, Shape shape, int64_t m) : WeightOnlyProblem(bench, "block4", shape, m) {}

    void run_all() {
        Row* fp16 = reference_row();
        if (fp16) stream_note(*fp16, dense_weight_bytes());
        Row* int4 = int4_row(fp16);
        if (int4) {
            kernel_override_note(*int4, "CK_GEMM_W4A16_KERNEL");
            stream_note(*int4, int4_weight_bytes());
        }
        for (size_t f = 0; f < std::size(kFormats); ++f) block4_row(f, fp16, int4);
    }

  private:
    friend WeightOnlyProblem;

    double scales_bytes(const Format& f) const {
        return double(ck_block4_prepacked_scales_bytes(f.format, n_, k_, f.blocksize));
    }
    double block4_weight_bytes(const Format& f) const {
        return double(ck_w4a16_prepacked_bytes(n_, k_)) + scales_bytes(f);
    }
    void block4_row(size_t f, const Row* fp16, const Row* int4) {
        const Format& fmt = kFormats[f];
        RowSpec spec = spec_for(std::string("gemm_block4 fp16 ") + fmt.name,
                                block4_weight_bytes(fmt) + activation_bytes());
        if (!bench_.wants(spec)) return;
        Row* row = bench_.run(spec, [this, f, &fmt](int i) {
            const Set& s = set(i);
            CK_BENCH_CHECK(ck_gemm_block4_prepacked(
                s.x.as(), CK_DTYPE_FP16, fmt.format, s.w[f].as<uint8_t>(), s.s[f].as(),
                fmt.format == CK_BLOCK4_NVFP4 ? s.g.as<float>() : nullptr, fmt.blocksize, nullptr,
                CK_ACTIVATION_NONE, m_, n_, k_, s.out.as(), bench_.stream()));
        });
        if (fp16) Bench::set_baseline(*row, "cuBLAS fp16", fp16->time);
        kernel_override_note(*row, "CK_GEMM_BLOCK4_KERNEL");
        stream_note(*row, block4_weight_bytes(fmt));
        if (int4)
            Bench::append_note(*row, "vs INT4 g128 " +
                                         format("%.2f", int4->time.median_us / row->time.median_us) +
                                         "x");
    }

    // The rotation copies: each weight is the library's own format of a random fp16 [N, K]
    // weight (ck_quantize_*, then the prepacks).
    std::vector<Set> make_sets() {
        double per_copy = dense_weight_bytes() + activation_bytes() + int4_weight_bytes();
        double smallest = int4_weight_bytes();
        for (const Format& f : kFormats) {
            per_copy += block4_weight_bytes(f);
            smallest = std::min(smallest, block4_weight_bytes(f));
        }
        const int copies = bench_.rotation_copies(smallest + activation_bytes(), per_copy);
        cudaStream_t st = bench_.stream();
        // Native storage, reused for every copy (outside timing).
        DeviceBuffer packed(size_t(n_ * k_ / 2));
        DeviceBuffer native_scales(sizeof(float) * size_t(n_ * (k_ / 16)));
        DeviceBuffer int4_scales(sizeof(__half) * size_t(n_ * (k_ / kInt4GroupSize)));
        std::vector<Set> sets;
        for (int c = 0; c < copies; ++c) {
            Set s = new_copy(31000 + 100 * uint64_t(c), packed, int4_scales, st);
            s.g = DeviceBuffer(sizeof(float));
            for (size_t f = 0; f < std::size(kFormats); ++f) {
                const Format& fmt = kFormats[f];
                switch (fmt.format) {
                    case CK_BLOCK4_NF4:
                        CK_BENCH_CHECK(ck_quantize_nf4(s.dense.as(), CK_DTYPE_FP16, n_, k_,
                                                       fmt.blocksize, packed.as<uint8_t>(),
                                                       native_scales.as<float>(), st));
                        break;
                    case CK_BLOCK4_MXFP4:
                        CK_BENCH_CHECK(ck_quantize_mxfp4(s.dense.as(), CK_DTYPE_FP16, n_, k_,
                                                         packed.as<uint8_t>(),
                                                         native_scales.as<uint8_t>(), st));
                        break;
                    default:
                        CK_BENCH_CHECK(ck_quantize_nvfp4(s.dense.as(), CK_DTYPE_FP16, n_, k_,
                                                         CK_SCALE_DYNAMIC, s.g.as<float>(),
                                                         packed.as<uint8_t>(),
                                                         native_scales.as<uint8_t>(), st));
                        break;
                }
                s.w[f] = DeviceBuffer(size_t(ck_w4a16_prepacked_bytes(n_, k_)));
                s.s[f] = DeviceBuffer(size_t(scales_bytes(fmt)));
                CK_BENCH_CHECK(ck_block4_prepack(fmt.format, packed.as<uint8_t>(),
                                                 native_scales.as(), n_, k_, fmt.blocksize,
                                                 s.w[f].as<uint8_t>(), s.s[f].as(), st));
            }
            sets.push_back(std::move(s));
        }
        CK_BENCH_CHECK(cudaStreamSynchronize(st));
        return sets;
    }
};

}  // namespace block4_bench

inline void bench_block4(Bench& bench, const Options&) {
    using namespace block4_bench;
    for (const Shape& shape : kShapes)
        for (int64_t m : kTokens) Problem(bench, shape, m).run_all();
}
