/*
 * smoke.c - a plain C99 program that uses libcuda_kernels.so through cuda_kernels.h alone.
 *
 * Host part (runs anywhere): the run-time version equals the header's, every status has its
 * name, a NULL argument is rejected with CK_STATUS_INVALID_VALUE and a message naming it.
 * GPU part (where a device exists): per-tensor dynamic INT8 quantization of 1000 floats and
 * back, each value within half a quantization step of the original.
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
    }

    if (failures) {
        fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    printf("OK\n");
    return 0;
}
