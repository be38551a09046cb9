/*
 * smoke.c - a plain C99 program that uses libcuda_kernels.so through cuda_kernels.h alone.
 *
 * Host part (runs anywhere): the run-time version equals the header's, every status has its
 * name, a NULL argument is rejected with CK_STATUS_INVALID_VALUE and a message naming it.
 * GPU part (where a device exists): per-tensor dynamic INT8 quantization of 1000 floats and
 * back, each value within half a quantization step of the original; a small INT8 GEMM (int32
 * and scaled fp32 outputs) and a float32 linear layer on integer data, whose results are exact.
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
    }

    if (failures) {
        fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    printf("OK\n");
    return 0;
}
