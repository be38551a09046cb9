/*
 * smoke.c - a plain C99 program that uses libcuda_kernels.so through cuda_kernels.h alone.
 *
 * Host part (runs anywhere): the run-time version equals the header's, every status has its
 * name, a NULL argument is rejected with CK_STATUS_INVALID_VALUE and a message naming it.
 * GPU part (where a device exists): per-tensor dynamic INT8 quantization of 1000 floats and
 * back, each value within half a quantization step of the original; a small INT8 GEMM (int32
 * and scaled fp32 outputs) and a float32 linear layer on integer data, whose results are exact;
 * a small W4A8 GEMM (ck_gemm_w4a8) on integer data with power-of-two scales, exact too where the
 * GPU has FP8 tensor cores (compute capability 8.9+), CK_STATUS_UNSUPPORTED before.
 *
 *   make build/c_smoke && build/c_smoke        (exit status 0: all good)
 */
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_kernels.h"

#define ROWS 8
#define COLS 125 /* 8 x 125 = 1000 values; an odd row length takes the scalar path */
#define N (ROWS * COLS)

static int failures = 0;

static void expect(int ok, const char* what) {
    if (!ok) {
        fprintf(stderr, "FAIL: %s\n", what);
        ++failures;
    }
}

static int cuda_ok(cudaError_t err, const char* what) {
    if (err == cudaSuccess) return 1;
    fprintf(stderr, "FAIL: %s: %s\n", what, cudaGetErrorString(err));
    ++failures;
    return 0;
}

/* A library call that must succeed: on failure, report its status and message. */
static int ck_ok(ck_status_t st, const char* what) {
    if (st == CK_STATUS_SUCCESS) return 1;
    fprintf(stderr, "FAIL: %s: %s: %s\n", what, ck_status_string(st), ck_last_error_message());
    ++failures;
    return 0;
}

/* A 256-byte aligned address for calls that validation rejects before touching the GPU. */
#define FAKE_DEVICE_PTR ((void*)(uintptr_t)0x7F000000)

static float absf(float v) { return v < 0.0f ? -v : v; }

static void check_version(void) {
    const int v = ck_version();
    printf("libcuda_kernels %d.%d.%d (header %d.%d.%d)\n", v / 10000, v / 100 % 100, v % 100,
           CK_VERSION_MAJOR, CK_VERSION_MINOR, CK_VERSION_PATCH);
    expect(v == CK_VERSION, "ck_version() == CK_VERSION");
}

static void check_status_strings(void) {
    static const char* const names[] = {
        "CK_STATUS_SUCCESS",     "CK_STATUS_INVALID_VALUE", "CK_STATUS_MISALIGNED",
        "CK_STATUS_UNSUPPORTED", "CK_STATUS_NO_DEVICE",     "CK_STATUS_CUDA_ERROR",
        "CK_STATUS_CUBLAS_ERROR", "CK_STATUS_INTERNAL_ERROR"};
    int s;
    for (s = CK_STATUS_SUCCESS; s <= CK_STATUS_INTERNAL_ERROR; ++s) {
        const char* name = ck_status_string((ck_status_t)s);
        if (!name || strcmp(name, names[s]) != 0) {
            fprintf(stderr, "FAIL: ck_status_string(%d) = %s, expected %s\n", s,
                    name ? name : "NULL", names[s]);
            ++failures;
        }
    }
    expect(ck_status_string((ck_status_t)99) != NULL, "ck_status_string(99) is not NULL");
}

static void check_null_rejected(void) {
    int8_t q[4];
    float scales[1];
    const ck_status_t st = ck_quantize_int8(NULL, CK_DTYPE_FP32, 1, 4, CK_PER_TENSOR,
                                            CK_SCALE_DYNAMIC, scales, q, 0);
    const char* msg = ck_last_error_message();
    printf("NULL x -> %s: %s\n", ck_status_string(st), msg ? msg : "(null)");
    expect(st == CK_STATUS_INVALID_VALUE, "NULL x gives CK_STATUS_INVALID_VALUE");
    expect(msg != NULL && msg[0] != '\0', "a rejected call leaves a message");

    expect(ck_quantize_fp8(NULL, CK_DTYPE_FP32, 1, 4, CK_FP8_E4M3, CK_PER_BLOCK_128X128,
                           CK_SCALE_DYNAMIC, scales, (uint8_t*)q, 0) == CK_STATUS_INVALID_VALUE,
           "ck_quantize_fp8 with NULL x gives CK_STATUS_INVALID_VALUE");
    expect(ck_quantize_int8(FAKE_DEVICE_PTR, CK_DTYPE_FP32, 1, 4, CK_PER_BLOCK_1X128,
                            CK_SCALE_DYNAMIC, scales, q, 0) == CK_STATUS_INVALID_VALUE,
           "ck_quantize_int8 rejects FP8's block granularity");
    expect(ck_gemm_int8(NULL, q, CK_LAYOUT_NK, 1, 1, 16, (int32_t*)scales, 0) ==
               CK_STATUS_INVALID_VALUE, "ck_gemm_int8 with NULL a gives CK_STATUS_INVALID_VALUE");
    expect(ck_gemm_w4a8(NULL, scales, CK_PER_TENSOR, (const uint8_t*)q, FAKE_DEVICE_PTR,
                        CK_DTYPE_FP16, 128, NULL, CK_ACTIVATION_NONE, 1, 1, 32, FAKE_DEVICE_PTR,
                        CK_DTYPE_FP32, 0) == CK_STATUS_INVALID_VALUE,
           "ck_gemm_w4a8 with NULL a gives CK_STATUS_INVALID_VALUE");
    /* 64 is an INT4 group size, but not one of W4A8's (128 or CK_GROUP_ROW) */
    expect(ck_gemm_w4a8((const uint8_t*)FAKE_DEVICE_PTR, (const float*)FAKE_DEVICE_PTR,
                        CK_PER_ROW, (const uint8_t*)FAKE_DEVICE_PTR, FAKE_DEVICE_PTR,
                        CK_DTYPE_BF16, 64, NULL, CK_ACTIVATION_NONE, 1, 8, 64, FAKE_DEVICE_PTR,
                        CK_DTYPE_FP16, 0) == CK_STATUS_UNSUPPORTED,
           "ck_gemm_w4a8 with group_size 64 gives CK_STATUS_UNSUPPORTED");
    /* fp16 rows of 12 elements do not start 16-byte aligned: K must be a multiple of 8 */
    expect(ck_linear(FAKE_DEVICE_PTR, FAKE_DEVICE_PTR, NULL, CK_DTYPE_FP16, 1, 8, 12,
                     CK_ACTIVATION_NONE, FAKE_DEVICE_PTR, 0) == CK_STATUS_UNSUPPORTED,
           "ck_linear with K=12 (fp16) gives CK_STATUS_UNSUPPORTED");
}

/* Quantizes N floats per tensor (dynamic scale) and dequantizes them back. */
static void gpu_round_trip(void) {
    float x[N], y[N], scale = 0.0f, absmax = 0.0f, worst = 0.0f;
    unsigned int state = 12345u;
    void *d_x = NULL, *d_scale = NULL, *d_q = NULL, *d_y = NULL;
    ck_status_t st;
    int i;

    for (i = 0; i < N; ++i) { /* a fixed LCG: values in [-3, 3) */
        state = state * 1664525u + 1013904223u;
        x[i] = ((float)(state >> 8) / 16777216.0f - 0.5f) * 6.0f;
        if (absf(x[i]) > absmax) absmax = absf(x[i]);
    }
    if (!cuda_ok(cudaMalloc(&d_x, sizeof x), "cudaMalloc x") ||
        !cuda_ok(cudaMalloc(&d_scale, sizeof(float)), "cudaMalloc scale") ||
        !cuda_ok(cudaMalloc(&d_q, N), "cudaMalloc q") ||
        !cuda_ok(cudaMalloc(&d_y, sizeof y), "cudaMalloc y") ||
        !cuda_ok(cudaMemcpy(d_x, x, sizeof x, cudaMemcpyHostToDevice), "copy x"))
        goto done;

    st = ck_quantize_int8(d_x, CK_DTYPE_FP32, ROWS, COLS, CK_PER_TENSOR, CK_SCALE_DYNAMIC,
                          (float*)d_scale, (int8_t*)d_q, 0);
    if (st != CK_STATUS_SUCCESS) {
        fprintf(stderr, "FAIL: ck_quantize_int8: %s: %s\n", ck_status_string(st),
                ck_last_error_message());
        ++failures;
        goto done;
    }
    st = ck_dequantize_int8((const int8_t*)d_q, (const float*)d_scale, ROWS, COLS,
                            CK_PER_TENSOR, d_y, CK_DTYPE_FP32, 0);
    if (st != CK_STATUS_SUCCESS) {
        fprintf(stderr, "FAIL: ck_dequantize_int8: %s: %s\n", ck_status_string(st),
                ck_last_error_message());
        ++failures;
        goto done;
    }
    if (!cuda_ok(cudaDeviceSynchronize(), "kernels") ||
        !cuda_ok(cudaMemcpy(y, d_y, sizeof y, cudaMemcpyDeviceToHost), "copy y") ||
        !cuda_ok(cudaMemcpy(&scale, d_scale, sizeof scale, cudaMemcpyDeviceToHost), "copy scale"))
        goto done;

    /* scale = absmax / 127 exactly in float32 arithmetic */
    expect(scale == absmax / 127.0f, "scale == absmax / 127");
    for (i = 0; i < N; ++i)
        if (absf(y[i] - x[i]) > worst) worst = absf(y[i] - x[i]);
    /* half a step, plus the float32 rounding of q * scale and of x * (1 / scale) */
    printf("GPU round trip of %d floats: scale %.6g, max error %.6g (half step %.6g)\n", N,
           (double)scale, (double)worst, (double)(scale / 2));
    expect(worst <= scale * 0.5f * 1.0001f, "max |dequant(quant(x)) - x| <= scale / 2");

done:
    cudaFree(d_x);
    cudaFree(d_scale);
    cudaFree(d_q);
    cudaFree(d_y);
}

#define GM 3
#define GN 5
#define GK 32

/* c = a b^T (int8 -> int32), out = 0.125 * c (fp32 epilogue), y = relu(x w^T + bias) (fp32):
 * small integers and powers of two, so every result is exact and compared exactly. */
static void gpu_gemm(void) {
    int8_t a[GM * GK], b[GN * GK];
    int32_t c[GM * GN], want[GM * GN];
    float out[GM * GN], sa = 0.5f, sb = 0.25f;
    float x[2 * 4] = {1, 2, 3, 4, -1, 0, 2, -3};
    float w[4 * 4] = {1, 0, 0, 0, 0, 1, 0, 0, 1, 1, 1, 1, 0, -1, 0, 2};
    float bias[4] = {0.5f, -10.0f, 0.0f, 1.0f}, y[2 * 4], y_want[2 * 4];
    void *d_a = NULL, *d_b = NULL, *d_c = NULL, *d_out = NULL, *d_s = NULL;
    void *d_x = NULL, *d_w = NULL, *d_bias = NULL, *d_y = NULL;
    unsigned int state = 777u;
    int i, j, kk, bad = 0;

    for (i = 0; i < GM * GK; ++i) a[i] = (int8_t)((state = state * 1664525u + 1013904223u) >> 24);
    for (i = 0; i < GN * GK; ++i) b[i] = (int8_t)((state = state * 1664525u + 1013904223u) >> 24);
    for (i = 0; i < GM; ++i)
        for (j = 0; j < GN; ++j) {
            int32_t sum = 0;
            for (kk = 0; kk < GK; ++kk) sum += (int32_t)a[i * GK + kk] * (int32_t)b[j * GK + kk];
            want[i * GN + j] = sum;
        }
    for (i = 0; i < 2; ++i)
        for (j = 0; j < 4; ++j) {
            float sum = bias[j];
            for (kk = 0; kk < 4; ++kk) sum += x[i * 4 + kk] * w[j * 4 + kk];
            y_want[i * 4 + j] = sum > 0.0f ? sum : 0.0f;
        }
    if (!cuda_ok(cudaMalloc(&d_a, sizeof a), "cudaMalloc a") ||
        !cuda_ok(cudaMalloc(&d_b, sizeof b), "cudaMalloc b") ||
        !cuda_ok(cudaMalloc(&d_c, sizeof c), "cudaMalloc c") ||
        !cuda_ok(cudaMalloc(&d_out, sizeof out), "cudaMalloc out") ||
        !cuda_ok(cudaMalloc(&d_s, 2 * sizeof(float)), "cudaMalloc scales") ||
        !cuda_ok(cudaMalloc(&d_x, sizeof x), "cudaMalloc x") ||
        !cuda_ok(cudaMalloc(&d_w, sizeof w), "cudaMalloc w") ||
        !cuda_ok(cudaMalloc(&d_bias, sizeof bias), "cudaMalloc bias") ||
        !cuda_ok(cudaMalloc(&d_y, sizeof y), "cudaMalloc y") ||
        !cuda_ok(cudaMemcpy(d_a, a, sizeof a, cudaMemcpyHostToDevice), "copy a") ||
        !cuda_ok(cudaMemcpy(d_b, b, sizeof b, cudaMemcpyHostToDevice), "copy b") ||
        !cuda_ok(cudaMemcpy(d_s, &sa, sizeof sa, cudaMemcpyHostToDevice), "copy scale_a") ||
        !cuda_ok(cudaMemcpy((float*)d_s + 1, &sb, sizeof sb, cudaMemcpyHostToDevice), "copy sb") ||
        !cuda_ok(cudaMemcpy(d_x, x, sizeof x, cudaMemcpyHostToDevice), "copy x") ||
        !cuda_ok(cudaMemcpy(d_w, w, sizeof w, cudaMemcpyHostToDevice), "copy w") ||
        !cuda_ok(cudaMemcpy(d_bias, bias, sizeof bias, cudaMemcpyHostToDevice), "copy bias"))
        goto done;

    if (!ck_ok(ck_gemm_int8((const int8_t*)d_a, (const int8_t*)d_b, CK_LAYOUT_NK, GM, GN, GK,
                            (int32_t*)d_c, 0), "ck_gemm_int8") ||
        !ck_ok(ck_gemm_int8_scaled((const int8_t*)d_a, (const int8_t*)d_b, CK_LAYOUT_NK, GM, GN,
                                   GK, (const float*)d_s, CK_PER_TENSOR, (const float*)d_s + 1,
                                   CK_PER_TENSOR, NULL, CK_ACTIVATION_NONE, d_out, CK_DTYPE_FP32,
                                   0), "ck_gemm_int8_scaled") ||
        !ck_ok(ck_linear(d_x, d_w, d_bias, CK_DTYPE_FP32, 2, 4, 4, CK_ACTIVATION_RELU, d_y, 0),
               "ck_linear"))
        goto done;
    if (!cuda_ok(cudaDeviceSynchronize(), "GEMM kernels") ||
        !cuda_ok(cudaMemcpy(c, d_c, sizeof c, cudaMemcpyDeviceToHost), "copy c") ||
        !cuda_ok(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost), "copy out") ||
        !cuda_ok(cudaMemcpy(y, d_y, sizeof y, cudaMemcpyDeviceToHost), "copy y"))
        goto done;
    for (i = 0; i < GM * GN; ++i) {
        bad += c[i] != want[i];
        bad += out[i] != (float)want[i] * 0.125f;
    }
    for (i = 0; i < 2 * 4; ++i) bad += y[i] != y_want[i];
    printf("GPU GEMM %dx%dx%d (int32, scaled fp32) and linear 2x4x4: %d wrong values\n", GM, GN,
           GK, bad);
    expect(bad == 0, "GEMM and linear results are exact");

done:
    cudaFree(d_a);
    cudaFree(d_b);
    cudaFree(d_c);
    cudaFree(d_out);
    cudaFree(d_s);
    cudaFree(d_x);
    cudaFree(d_w);
    cudaFree(d_bias);
    cudaFree(d_y);
}

#define WM 3
#define WN 5
#define WK 160 /* two groups of 128: a whole one and a partial one */
#define WGROUPS 2

/* out = relu(acc * scale_a[m] + bias[n]), acc[m, n] = sum_kb s[n, kb] sum_k a q: E4M3 codes of
 * 0 and +-1, INT4 codes over -8 .. 7, power-of-two scales: every sum is a small integer (well
 * within the tensor cores' bits) and every result exact. */
static void gpu_w4a8(void) {
    static const uint8_t e4m3[3] = {0x00, 0x38, 0xB8}; /* 0, 1, -1 */
    static const float e4m3_value[3] = {0.0f, 1.0f, -1.0f};
    static const uint16_t fp16_bits[3] = {0x3400, 0x3800, 0x4000}; /* 0.25, 0.5, 2 */
    static const float fp16_value[3] = {0.25f, 0.5f, 2.0f};
    uint8_t a[WM * WK], w[WN * WK / 2];
    uint16_t ws[WN * WGROUPS];
    float av[WM * WK], wsv[WN * WGROUPS], sa[WM] = {1.0f, 0.5f, 4.0f};
    float bias[WN] = {0.5f, -1.0f, 0.0f, 2.0f, -0.25f}, out[WM * WN], want[WM * WN];
    int q[WN * WK];
    void *d_a = NULL, *d_sa = NULL, *d_w = NULL, *d_ws = NULL, *d_bias = NULL, *d_out = NULL;
    unsigned int state = 4242u;
    int i, j, kk, cc_major = 0, cc_minor = 0, device = 0, bad = 0;
    ck_status_t st;

    for (i = 0; i < WM * WK; ++i) {
        const unsigned int pick = ((state = state * 1664525u + 1013904223u) >> 16) % 3u;
        a[i] = e4m3[pick];
        av[i] = e4m3_value[pick];
    }
    for (i = 0; i < WN * WK; ++i)
        q[i] = (int)(((state = state * 1664525u + 1013904223u) >> 16) % 16u) - 8;
    for (i = 0; i < WN * WK / 2; ++i) /* element 2i in the low nibble, two's complement */
        w[i] = (uint8_t)((q[2 * i] & 0xF) | ((q[2 * i + 1] & 0xF) << 4));
    for (i = 0; i < WN * WGROUPS; ++i) {
        const unsigned int pick = ((state = state * 1664525u + 1013904223u) >> 16) % 3u;
        ws[i] = fp16_bits[pick];
        wsv[i] = fp16_value[pick];
    }
    for (i = 0; i < WM; ++i)
        for (j = 0; j < WN; ++j) {
            float acc = 0.0f, v;
            int kb;
            for (kb = 0; kb < WGROUPS; ++kb) {
                float block = 0.0f;
                for (kk = kb * 128; kk < WK && kk < kb * 128 + 128; ++kk)
                    block += av[i * WK + kk] * (float)q[j * WK + kk];
                acc += wsv[j * WGROUPS + kb] * block;
            }
            v = acc * sa[i] + bias[j];
            want[i * WN + j] = v > 0.0f ? v : 0.0f;
        }
    if (!cuda_ok(cudaGetDevice(&device), "cudaGetDevice") ||
        !cuda_ok(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, device),
                 "compute capability") ||
        !cuda_ok(cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, device),
                 "compute capability") ||
        !cuda_ok(cudaMalloc(&d_a, sizeof a), "cudaMalloc a") ||
        !cuda_ok(cudaMalloc(&d_sa, sizeof sa), "cudaMalloc scale_a") ||
        !cuda_ok(cudaMalloc(&d_w, sizeof w), "cudaMalloc w_packed") ||
        !cuda_ok(cudaMalloc(&d_ws, sizeof ws), "cudaMalloc w_scales") ||
        !cuda_ok(cudaMalloc(&d_bias, sizeof bias), "cudaMalloc bias") ||
        !cuda_ok(cudaMalloc(&d_out, sizeof out), "cudaMalloc out") ||
        !cuda_ok(cudaMemcpy(d_a, a, sizeof a, cudaMemcpyHostToDevice), "copy a") ||
        !cuda_ok(cudaMemcpy(d_sa, sa, sizeof sa, cudaMemcpyHostToDevice), "copy scale_a") ||
        !cuda_ok(cudaMemcpy(d_w, w, sizeof w, cudaMemcpyHostToDevice), "copy w_packed") ||
        !cuda_ok(cudaMemcpy(d_ws, ws, sizeof ws, cudaMemcpyHostToDevice), "copy w_scales") ||
        !cuda_ok(cudaMemcpy(d_bias, bias, sizeof bias, cudaMemcpyHostToDevice), "copy bias"))
        goto done;

    st = ck_gemm_w4a8((const uint8_t*)d_a, (const float*)d_sa, CK_PER_ROW, (const uint8_t*)d_w,
                      d_ws, CK_DTYPE_FP16, 128, d_bias, CK_ACTIVATION_RELU, WM, WN, WK, d_out,
                      CK_DTYPE_FP32, 0);
    if (cc_major * 10 + cc_minor < 89) {
        printf("GPU W4A8 GEMM: compute capability %d.%d has no FP8 tensor cores: %s\n", cc_major,
               cc_minor, ck_status_string(st));
        expect(st == CK_STATUS_UNSUPPORTED, "ck_gemm_w4a8 before 8.9 is CK_STATUS_UNSUPPORTED");
        goto done;
    }
    if (!ck_ok(st, "ck_gemm_w4a8") || !cuda_ok(cudaDeviceSynchronize(), "W4A8 kernel") ||
        !cuda_ok(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost), "copy out"))
        goto done;
    for (i = 0; i < WM * WN; ++i) bad += out[i] != want[i];
    printf("GPU W4A8 GEMM %dx%dx%d (group 128, fp16 scales, fp32 out): %d wrong values\n", WM, WN,
           WK, bad);
    expect(bad == 0, "W4A8 GEMM results are exact");

done:
    cudaFree(d_a);
    cudaFree(d_sa);
    cudaFree(d_w);
    cudaFree(d_ws);
    cudaFree(d_bias);
    cudaFree(d_out);
}

int main(void) {
    int count = -1;
    ck_status_t st;

    check_version();
    check_status_strings();
    check_null_rejected();

    st = ck_device_count(&count);
    if (st == CK_STATUS_NO_DEVICE) {
        expect(count == 0, "ck_device_count sets *count = 0 on CK_STATUS_NO_DEVICE");
        printf("no CUDA device: skipping GPU part\n");
    } else if (st != CK_STATUS_SUCCESS) {
        fprintf(stderr, "FAIL: ck_device_count: %s: %s\n", ck_status_string(st),
                ck_last_error_message());
        ++failures;
    } else {
        printf("%d CUDA device(s)\n", count);
        gpu_round_trip();
        gpu_gemm();
        gpu_w4a8();
    }

    if (failures) {
        fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    printf("OK\n");
    return 0;
}
