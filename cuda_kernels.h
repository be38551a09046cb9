/*
 * cuda_kernels.h - the public C ABI of libcuda_kernels.so: quantized kernels for LLM inference.
 *
 * Conventions (every entry point follows them):
 *   - Every function returns ck_status_t. On failure, ck_last_error_message() says, for the
 *     calling thread, exactly what was wrong.
 *   - Arguments are raw device pointers, sizes as int64_t, dtypes as ck_dtype_t, and the stream
 *     last. ck_stream_t is the same type as cudaStream_t (this header needs no CUDA header);
 *     0 is the legacy default stream.
 *   - Matrices are row-major and densely packed: element (r, c) of a [rows, cols] matrix is at
 *     index r * cols + c.
 *   - Arguments are validated on the host before anything is launched: a rejected call launches
 *     nothing, writes nothing and does not touch the GPU.
 *   - No entry point allocates memory, synchronizes or copies between host and device, so every
 *     call can be captured in a CUDA graph. Work is enqueued on `stream`; results are ready when
 *     the stream reaches them.
 *   - Pointers must be aligned to their element size (4 bytes for float, 2 for fp16/bf16);
 *     16-byte alignment and a column count divisible by 8 select the vectorized fast path.
 *   - Non-finite inputs: NaN encodes as 0 and is ignored when computing absmax/min/max. An
 *     infinite input makes its scale infinite and every code of its segment 0: inputs are
 *     expected to be finite. (The block 4-bit formats and FP8 follow their publishers instead;
 *     their sections say how.)
 *   - Outputs must not overlap inputs (no entry point works in place); each function says so.
 *     A call given overlapping buffers writes nothing outside its outputs and none of its other
 *     inputs, but the values it writes are unspecified (ck_moe_forward rejects the overlaps it
 *     can see, with CK_STATUS_INVALID_VALUE).
 *   - Sizes: any product of sizes whose byte count fits in int64_t is accepted unless a function
 *     states a limit; past that, CK_STATUS_INVALID_VALUE. A GEMM whose output needs more thread
 *     blocks than one launch holds (2^31 - 1) returns CK_STATUS_UNSUPPORTED and launches
 *     nothing: M x N beyond 2^43 (the smallest tiles are 64 x 64), or N beyond 2^34 for the
 *     weight-streaming kernels of M <= 16 (8 output columns per block at least).
 *   - A call reports the errors of its own launches only: a non-sticky CUDA error that earlier
 *     calls on the thread left pending (cudaGetLastError) is cleared before the launch.
 *   - Arguments of entry points with many of them (the Mixture-of-Experts and attention
 *     families): one documented parameter struct per entry point, ck_<family>_params_t, passed
 *     by const pointer, followed by the workspace (where one is needed) and the stream. Its
 *     first field is `size_t struct_size`, which the caller sets to sizeof(the struct) it was
 *     compiled with (as cuBLASLt descriptors and flash-attention's params carry their layout):
 *     fields are only ever appended in later versions, the library reads the fields that
 *     struct_size covers and gives the others their defaults, and a struct_size it does not know
 *     is rejected with CK_STATUS_INVALID_VALUE. A zero-initialized struct (= {sizeof(s)}) means
 *     every optional field at its default (no bias, no activation, defaults documented per
 *     field). Why a struct: a dozen pointers, shapes and flags in a flat list are easy to pass in
 *     the wrong order from an FFI and cannot grow without breaking the ABI. Functions with a
 *     short, stable list of arguments (all functions below) keep flat argument lists.
 *
 * Quantization formats (tests/reference.py implements each exactly; results are bitwise equal):
 *   Arithmetic is float32 with round-half-to-even; rint() below is round-half-to-even.
 *   INT8 symmetric:  scale = absmax / 127 (float32 division); a zero scale becomes 1.
 *                    q = clamp(rint(x * inv), -127, 127) with inv = 1 / scale (float32).
 *                    x' = (float)q * scale, rounded to the output dtype.
 *   INT4 symmetric:  scale = absmax / 7, stored in the dtype of x (a stored scale of 0 becomes 1);
 *                    q = clamp(rint(x * inv), -8, 7), inv = 1 / (float)scale; x' = q * scale.
 *   INT4 asymmetric: lo = min(min(x), 0), hi = max(max(x), 0); scale = (hi - lo) / 15, stored as
 *                    above (0 becomes 1); zero = clamp(rint(-lo * inv), 0, 15) stored as uint8;
 *                    q = clamp(rint(x * inv) + zero, 0, 15); x' = (float)(q - zero) * scale.
 *   FP8 (E4M3, E5M2): scale = amax / FMAX (FMAX = 448 or 57344; a zero or subnormal scale
 *                    becomes 1); q = fp8(x * inv) with inv = 1 / scale (float32), rounded to
 *                    nearest even and saturating at +-FMAX; x' = fp8_value(q) * scale.
 *   Packed INT4:     two values per byte along the row: element 2i in the low nibble, 2i+1 in
 *                    the high nibble; signed values in two's complement. A row of `cols` values
 *                    takes (cols + 1) / 2 bytes; when cols is odd the last high nibble is 0.
 *   Groups:          group_size consecutive elements of a row share a scale (32, 64, 128, or
 *                    CK_GROUP_ROW = -1 for the whole row). A row has ceil(cols / group_size)
 *                    groups; the last one may be partial. Scales and zeros are [rows, groups].
 */
#ifndef CUDA_KERNELS_H
#define CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define CK_API
#else
#define CK_API __attribute__((visibility("default")))
#endif

/* ---------------------------------------------------------------------------------------------
 * Version
 * ------------------------------------------------------------------------------------------- */
#define CK_VERSION_MAJOR 0
#define CK_VERSION_MINOR 1
#define CK_VERSION_PATCH 0
/* CK_VERSION_MAJOR * 10000 + CK_VERSION_MINOR * 100 + CK_VERSION_PATCH */
#define CK_VERSION (CK_VERSION_MAJOR * 10000 + CK_VERSION_MINOR * 100 + CK_VERSION_PATCH)

/* The version of the library actually loaded, encoded as CK_VERSION. */
CK_API int ck_version(void);

/* ---------------------------------------------------------------------------------------------
 * Status codes and errors
 * ------------------------------------------------------------------------------------------- */
typedef enum ck_status {
    CK_STATUS_SUCCESS = 0,
    CK_STATUS_INVALID_VALUE = 1,  /* null pointer, non-positive or overflowing size, bad enum */
    CK_STATUS_MISALIGNED = 2,     /* a pointer is not aligned as the function requires */
    CK_STATUS_UNSUPPORTED = 3,    /* valid but unsupported: dtype, group size, shape, GPU arch */
    CK_STATUS_NO_DEVICE = 4,      /* no CUDA device or no usable driver */
    CK_STATUS_CUDA_ERROR = 5,     /* a CUDA runtime call or a launch failed; see
                                     ck_last_cuda_error() */
    CK_STATUS_CUBLAS_ERROR = 6,   /* a cuBLAS call failed */
    CK_STATUS_INTERNAL_ERROR = 7  /* a bug in the library; please report it */
} ck_status_t;

/* A static, human-readable name for a status ("CK_STATUS_MISALIGNED"). Never NULL. */
CK_API const char* ck_status_string(ck_status_t status);

/* What exactly went wrong in the calling thread's last failed call, e.g.
 * "ck_quantize_int4: group_size=48 is not supported (use 32, 64, 128 or -1)".
 * Empty string if the last call on this thread succeeded. Valid until the thread's next call. */
CK_API const char* ck_last_error_message(void);

/* The cudaError_t value behind the calling thread's last CK_STATUS_CUDA_ERROR or
 * CK_STATUS_NO_DEVICE (0 if none). */
CK_API int ck_last_cuda_error(void);

/* ---------------------------------------------------------------------------------------------
 * Types
 * ------------------------------------------------------------------------------------------- */
/* Identical to cudaStream_t. */
typedef struct CUstream_st* ck_stream_t;

typedef enum ck_dtype {
    CK_DTYPE_FP32 = 0,
    CK_DTYPE_FP16 = 1,  /* IEEE binary16 (__half) */
    CK_DTYPE_BF16 = 2,  /* bfloat16 (__nv_bfloat16) */
    CK_DTYPE_INT8 = 3,
    CK_DTYPE_INT32 = 4,
    CK_DTYPE_UINT8 = 5
} ck_dtype_t;

/* How many scales a quantized [rows, cols] tensor has. INT8 (and the scales of the integer
 * GEMMs) take CK_PER_TENSOR and CK_PER_ROW, and reject the block values with
 * CK_STATUS_INVALID_VALUE; FP8 takes all four. A partial last block (rows or cols not a
 * multiple of 128) takes its scale from the elements it has. */
typedef enum ck_granularity {
    CK_PER_TENSOR = 0,        /* one scale for the whole tensor: scales[0] */
    CK_PER_ROW = 1,           /* one scale per row (per token / per output channel): scales[rows] */
    CK_PER_BLOCK_1X128 = 2,   /* one scale per row per 128 consecutive columns (DeepSeek-V3's
                                 activations): scales [rows, ceil(cols / 128)] */
    CK_PER_BLOCK_128X128 = 3  /* one scale per 128 x 128 tile (DeepSeek-V3's weights): scales
                                 [ceil(rows / 128), ceil(cols / 128)] */
} ck_granularity_t;

/* The FP8 element formats (OCP 8-bit Floating Point Specification, OFP8). */
typedef enum ck_fp8_format {
    CK_FP8_E4M3 = 0,  /* E4M3 'fn': bias 7, max 448, subnormals down to 2^-9, no infinity;
                         NaN is S.1111.111 (0x7F / 0xFF) */
    CK_FP8_E5M2 = 1   /* E5M2: bias 15, max 57344, subnormals down to 2^-16, +-inf
                         (0x7C / 0xFC); NaN is S.11111.{01,10,11} */
} ck_fp8_format_t;

/* Where quantization scales come from. */
typedef enum ck_scale_mode {
    CK_SCALE_STATIC = 0,  /* read from `scales`, given by the caller (must be finite, > 0) */
    CK_SCALE_DYNAMIC = 1  /* computed on the device from the data and written to `scales` */
} ck_scale_mode_t;

/* Packed INT4 flavours. */
typedef enum ck_int4_mode {
    CK_INT4_SYMMETRIC = 0,  /* signed [-8, 7], scale only */
    CK_INT4_ASYMMETRIC = 1  /* unsigned [0, 15] with a uint8 zero point per group */
} ck_int4_mode_t;

/* group_size value meaning "one group per row". */
#define CK_GROUP_ROW (-1)

/* ---------------------------------------------------------------------------------------------
 * Device query
 * ------------------------------------------------------------------------------------------- */
/* Number of CUDA devices visible to this process. Returns CK_STATUS_NO_DEVICE (and sets *count
 * to 0) where there is no device or no driver, instead of failing in any other way. */
CK_API ck_status_t ck_device_count(int* count);

/* ---------------------------------------------------------------------------------------------
 * INT8 quantization (symmetric, [-127, 127])
 * ------------------------------------------------------------------------------------------- */
/* Quantizes x [rows, cols] (float32, float16 or bfloat16) to int8 q [rows, cols].
 *
 * scales: float32, 1 value (CK_PER_TENSOR) or `rows` values (CK_PER_ROW). With
 *         CK_SCALE_STATIC they are read (each must be finite and > 0: device data is not
 *         checked); with CK_SCALE_DYNAMIC
 *         they are written, scale = absmax / 127 of the tensor or of the row.
 * Writes q (rows * cols bytes) and, if dynamic, scales.
 * Requirements: rows, cols >= 1 (with CK_PER_ROW, rows * 4 bytes of scales within int64_t);
 * x aligned to its element size, scales to 4 bytes.
 * A dynamic per-tensor call reads x twice (absmax first, then encode); every other variant
 * reads it once. x and q must not overlap. */
CK_API ck_status_t ck_quantize_int8(const void* x, ck_dtype_t x_dtype, int64_t rows, int64_t cols,
                                    ck_granularity_t granularity, ck_scale_mode_t scale_mode,
                                    float* scales, int8_t* q, ck_stream_t stream);

/* Dequantizes int8 q [rows, cols] with float32 scales (1 or `rows` values, per `granularity`):
 * out = (float)q * scale, written as out_dtype (float32, float16 or bfloat16) to out [rows, cols].
 * Requirements: rows, cols >= 1 (with CK_PER_ROW, rows * 4 bytes of scales within int64_t);
 * scales aligned to 4 bytes, out to its element size. out must not overlap q or scales. */
CK_API ck_status_t ck_dequantize_int8(const int8_t* q, const float* scales, int64_t rows,
                                      int64_t cols, ck_granularity_t granularity, void* out,
                                      ck_dtype_t out_dtype, ck_stream_t stream);

/* ---------------------------------------------------------------------------------------------
 * FP8 quantization (E4M3 and E5M2, scaled per tensor, row or block)
 *
 * q holds one FP8 byte per element, [rows, cols]; the float32 scales are laid out as the
 * granularity says (ck_granularity_t): 1 value, `rows` values, [rows, ceil(cols / 128)] or
 * [ceil(rows / 128), ceil(cols / 128)], row-major. tests/reference.py implements the formats
 * and both functions exactly and the kernels match it bit for bit (float32 IEEE arithmetic,
 * no fused multiply-add):
 *   amax  = max |x| over the scale's scope (the tensor, a row or a block), NaN ignored;
 *   scale = amax / FMAX (FMAX = 448 for E4M3, 57344 for E5M2); a scale of 0 (an all-zero or
 *           all-NaN scope) becomes 1, as INT8's does, and so does a subnormal one (amax below
 *           FMAX * 2^-126), which keeps 1 / scale finite;
 *   q     = fp8(x * inv) with inv = 1 / scale (float32), fp8() rounding to nearest, ties to
 *           even, and saturating (PTX cvt.rn.satfinite, the OCP saturating mode): a finite
 *           value past +-FMAX and +-inf become +-FMAX (E4M3 0x7E / 0xFE, E5M2 0x7B / 0xFB), so
 *           E5M2's infinities are never written; NaN becomes 0x7F (either sign: the byte
 *           cvt writes, on every GPU); -0.0 becomes 0x80;
 *   x'    = fp8_value(q) * scale (float32; NaN codes give NaN and E5M2's +-inf codes +-inf),
 *           rounded to the output dtype.
 * An infinite input makes its dynamic scale infinite (inv = 0): the scope's finite elements
 * encode as +-0 and its infinities as NaN (inf * 0). Static scales are the caller's: finite,
 * > 0 and not subnormal (device data is not checked); under them +-inf saturates to +-FMAX.
 * Requirements (both): rows, cols >= 1; x, out aligned to their element size, scales to 4
 * bytes (q: any address). With cols % 8 == 0 (for CK_PER_TENSOR: rows * cols % 8 == 0), x (or
 * out) 16-byte aligned and q 8-byte aligned, the kernels take their vectorized path. Sizes: the
 * byte counts of x (or out) and of the scales must fit in int64_t (CK_STATUS_INVALID_VALUE
 * beyond).
 * ------------------------------------------------------------------------------------------- */
/* Quantizes x [rows, cols] (float32, float16 or bfloat16) to FP8 q [rows, cols] (uint8 bytes in
 * `format`), with the scales of `granularity`. With CK_SCALE_STATIC the scales are read; with
 * CK_SCALE_DYNAMIC they are computed as above and written. Kernels: static scales, dynamic
 * CK_PER_ROW and dynamic CK_PER_BLOCK_1X128 read x once in one launch; dynamic
 * CK_PER_BLOCK_128X128 runs one block of threads per 128 x 128 tile (x read once, one launch);
 * dynamic CK_PER_TENSOR reads x twice (absmax first, as ck_quantize_int8) unless the tensor is
 * small enough for one block (16384 fp16/bf16 or 8192 fp32 values: one launch).
 * x, q and scales must not overlap. */
CK_API ck_status_t ck_quantize_fp8(const void* x, ck_dtype_t x_dtype, int64_t rows, int64_t cols,
                                   ck_fp8_format_t format, ck_granularity_t granularity,
                                   ck_scale_mode_t scale_mode, float* scales, uint8_t* q,
                                   ck_stream_t stream);

/* Dequantizes FP8 q [rows, cols] (bytes in `format`) with the float32 scales of `granularity`:
 * out = fp8_value(q) * scale, written as out_dtype (float32, float16 or bfloat16) to
 * out [rows, cols]. out must not overlap q or scales. */
CK_API ck_status_t ck_dequantize_fp8(const uint8_t* q, ck_fp8_format_t format, const float* scales,
                                     int64_t rows, int64_t cols, ck_granularity_t granularity,
                                     void* out, ck_dtype_t out_dtype, ck_stream_t stream);

/* ---------------------------------------------------------------------------------------------
 * Packed INT4 quantization (group-wise along the row, scales computed on the device)
 * ------------------------------------------------------------------------------------------- */
/* Number of groups in one row: ceil(cols / group_size), or 1 for CK_GROUP_ROW. Returns 0 for an
 * invalid cols or group_size. The scales (and zeros) of a [rows, cols] tensor hold
 * rows * ck_int4_groups_per_row(cols, group_size) values. */
CK_API int64_t ck_int4_groups_per_row(int64_t cols, int64_t group_size);

/* Quantizes x [rows, cols] (float32, float16 or bfloat16) to packed int4.
 *
 * group_size: 32, 64, 128 or CK_GROUP_ROW (-1).
 * Writes q_packed [rows, (cols + 1) / 2] bytes, scales [rows, groups] in the dtype of x and,
 * for CK_INT4_ASYMMETRIC, zeros [rows, groups] uint8. For CK_INT4_SYMMETRIC, zeros must be NULL.
 * Requirements: rows, cols >= 1; x and scales aligned to their element size. No output may
 * overlap x or another output. */
CK_API ck_status_t ck_quantize_int4(const void* x, ck_dtype_t x_dtype, int64_t rows, int64_t cols,
                                    int64_t group_size, ck_int4_mode_t mode, uint8_t* q_packed,
                                    void* scales, uint8_t* zeros, ck_stream_t stream);

/* Dequantizes packed int4 q_packed [rows, (cols + 1) / 2] with scales [rows, groups] of dtype
 * out_dtype (float32, float16 or bfloat16) and, for CK_INT4_ASYMMETRIC, zeros [rows, groups]
 * (NULL for CK_INT4_SYMMETRIC), writing out [rows, cols] as out_dtype.
 * Requirements: rows, cols >= 1; scales and out aligned to their element size. out must not
 * overlap q_packed, scales or zeros. */
CK_API ck_status_t ck_dequantize_int4(const uint8_t* q_packed, const void* scales,
                                      const uint8_t* zeros, int64_t rows, int64_t cols,
                                      int64_t group_size, ck_int4_mode_t mode, void* out,
                                      ck_dtype_t out_dtype, ck_stream_t stream);

/* ---------------------------------------------------------------------------------------------
 * Block 4-bit formats: NF4, MXFP4, NVFP4 (scales computed on the device)
 *
 * A block of consecutive elements of a row shares one scale; every element is a 4-bit code.
 * Layout of all three: packed uint8 [rows, (cols + 1) / 2], two codes per byte along the row,
 * and scales [rows, ceil(cols / block)]. The last block of a row may be partial: its scale
 * comes from the elements it has. tests/reference.py implements each format exactly and the
 * kernels match it bit for bit; arithmetic is float32 (IEEE division, no fused multiply-add),
 * rounding half to even.
 *
 *   NF4 (bitsandbytes, QLoRA): block = blocksize (32, 64, 128, 256, 512, 1024, 2048 or 4096;
 *       64 is bitsandbytes' default); scales are the float32 absmax of each block. Element 2i
 *       goes to the HIGH nibble of byte i, 2i+1 to the low one (bitsandbytes' order).
 *         absmax = max |x| (NaN ignored); inv = 1 / absmax (inf for a zero block);
 *         code   = the number of bitsandbytes' 15 float32 thresholds t with (float)x * inv > t
 *                  (its decision tree: NaN gives code 0);
 *         x'     = NF4_TABLE[code] * absmax, rounded to the output dtype.
 *       An odd row's last low nibble holds the code of 0 * inv, as bitsandbytes writes it
 *       (7, or 0 in a zero block). An all-zero block stores absmax 0 and codes 0 (it
 *       dequantizes to -0.0); an infinite element makes absmax inf (the block dequantizes to
 *       NaN and -inf), as in bitsandbytes.
 *   MXFP4 (OCP Microscaling Formats v1.0): blocks of 32 E2M1 elements (values 0, 0.5, 1, 1.5,
 *       2, 3, 4, 6 and their negatives), scales uint8 E8M0 (2^(s - 127); 0xFF is NaN). Element
 *       2i goes to the LOW nibble of byte i.
 *         e      = clamp(floor(log2(max |x|)) - 2, -127, 127), -127 for a zero block;
 *         scale  = e + 127; code = e2m1((float)x * 2^-e), ties to even, saturating at +-6;
 *         x'     = e2m1_value * 2^(scale - 127), rounded to the output dtype.
 *       A block holding a NaN or an infinity gets scale 0xFF and codes 0 (it dequantizes to
 *       NaN). An odd row's last high nibble is 0.
 *   NVFP4 (NVIDIA): blocks of 16 E2M1 elements, scales uint8 FP8 E4M3 ('fn': max 448, no
 *       infinity, 0x7F / 0xFF NaN), and one float32 global scale g for the tensor, g = 2688 /
 *       amax(|x|) (448 * 6; 1 where that is not a positive finite number) when computed.
 *       Element 2i goes to the LOW nibble of byte i.
 *         amax_b = max |x| over the block (NaN ignored);
 *         scale  = e4m3(g * (amax_b * float32(1/6))), ties to even, saturating at 448;
 *         out    = 1 / (e4m3_value(scale) * (1 / g)), or 0 where e4m3_value(scale) is 0;
 *         code   = e2m1((float)x * out);
 *         x'     = e2m1_value * (e4m3_value(scale) / g), rounded to the output dtype.
 *       NaN elements encode as 0; an infinity gives its block the scale 448 and saturates to
 *       +-6. An odd row's last high nibble is 0.
 *
 * Requirements (all six): rows, cols >= 1; x, out aligned to their element size; NF4's absmax
 * and NVFP4's global_scale aligned to 4 bytes (packed and the uint8 scales: any address). With
 * cols % 8 == 0, x (or out) 16-byte aligned and packed 4-byte aligned, the kernels take their
 * vectorized path. Sizes: the byte counts of x (or out) and of the scales must fit in int64_t
 * (CK_STATUS_INVALID_VALUE beyond). No output may overlap an input or another output.
 * ------------------------------------------------------------------------------------------- */
/* Quantizes x [rows, cols] (float32, float16 or bfloat16) to NF4: writes packed
 * [rows, (cols + 1) / 2] and absmax float32 [rows, ceil(cols / blocksize)].
 * blocksize: 32, 64, 128, 256, 512, 1024, 2048 or 4096 (else CK_STATUS_UNSUPPORTED).
 * x, packed and absmax must not overlap. */
CK_API ck_status_t ck_quantize_nf4(const void* x, ck_dtype_t x_dtype, int64_t rows, int64_t cols,
                                   int64_t blocksize, uint8_t* packed, float* absmax,
                                   ck_stream_t stream);

/* Dequantizes NF4 packed [rows, (cols + 1) / 2] with absmax float32
 * [rows, ceil(cols / blocksize)] into out [rows, cols] of out_dtype (float32, float16 or
 * bfloat16). out must not overlap packed or absmax. */
CK_API ck_status_t ck_dequantize_nf4(const uint8_t* packed, const float* absmax, int64_t rows,
                                     int64_t cols, int64_t blocksize, void* out,
                                     ck_dtype_t out_dtype, ck_stream_t stream);

/* Quantizes x [rows, cols] (float32, float16 or bfloat16) to MXFP4: writes packed
 * [rows, (cols + 1) / 2] and scales uint8 E8M0 [rows, ceil(cols / 32)].
 * x, packed and scales must not overlap. */
CK_API ck_status_t ck_quantize_mxfp4(const void* x, ck_dtype_t x_dtype, int64_t rows, int64_t cols,
                                     uint8_t* packed, uint8_t* scales, ck_stream_t stream);

/* Dequantizes MXFP4 packed [rows, (cols + 1) / 2] with scales uint8 E8M0 [rows, ceil(cols / 32)]
 * into out [rows, cols] of out_dtype (float32, float16 or bfloat16). out must not overlap
 * packed or scales. */
CK_API ck_status_t ck_dequantize_mxfp4(const uint8_t* packed, const uint8_t* scales, int64_t rows,
                                       int64_t cols, void* out, ck_dtype_t out_dtype,
                                       ck_stream_t stream);

/* Quantizes x [rows, cols] (float32, float16 or bfloat16) to NVFP4: writes packed
 * [rows, (cols + 1) / 2] and scales uint8 E4M3 [rows, ceil(cols / 16)].
 * global_scale: one float32 on the device. With CK_SCALE_STATIC it is read (a calibrated
 * scale: it must be finite and > 0; device data is not checked); with CK_SCALE_DYNAMIC it is
 * computed from x (2688 / amax, see above) and written, which reads x twice.
 * x, packed, scales and global_scale must not overlap. */
CK_API ck_status_t ck_quantize_nvfp4(const void* x, ck_dtype_t x_dtype, int64_t rows, int64_t cols,
                                     ck_scale_mode_t scale_mode, float* global_scale,
                                     uint8_t* packed, uint8_t* scales, ck_stream_t stream);

/* Dequantizes NVFP4 packed [rows, (cols + 1) / 2] with scales uint8 E4M3 [rows, ceil(cols / 16)]
 * and the float32 global_scale (one value on the device, the one the quantizer used) into
 * out [rows, cols] of out_dtype (float32, float16 or bfloat16). out must not overlap packed,
 * scales or global_scale. */
CK_API ck_status_t ck_dequantize_nvfp4(const uint8_t* packed, const uint8_t* scales,
                                       const float* global_scale, int64_t rows, int64_t cols,
                                       void* out, ck_dtype_t out_dtype, ck_stream_t stream);

/* ---------------------------------------------------------------------------------------------
 * Matrix products (GEMM): out[M, N] = A[M, K] x B
 *
 * A is row-major [M, K]. B, the weight, is either [N, K] row-major (CK_LAYOUT_NK, the
 * nn.Linear layout: out = A B^T) or [K, N] row-major (CK_LAYOUT_KN: out = A B). Any M, N >= 1;
 * each function states its rules for K, N and the pointers (violations get
 * CK_STATUS_UNSUPPORTED or CK_STATUS_MISALIGNED and launch nothing). The kernel variant (a
 * weight-streaming path for M <= 16, tensor-core tiles for larger M, wgmma on Hopper) is chosen
 * from the shape and the GPU; every variant computes the same result. For testing and
 * benchmarking, the environment variable CK_GEMM_INT8_KERNEL (read on every call, after the
 * arguments are validated) forces one: "reference" (simple dp4a tiles, any GPU), "mma"
 * (mma.sync, sm_80+), "small_m" (M <= 16 and CK_LAYOUT_NK, sm_80+), "wgmma" (CK_LAYOUT_NK on a
 * compute capability 9.0 GPU) or "auto". An unknown name returns CK_STATUS_INVALID_VALUE; a
 * variant that cannot serve the call returns CK_STATUS_UNSUPPORTED and launches nothing.
 * A, B, the scales and the bias must not overlap the output.
 * ------------------------------------------------------------------------------------------- */
typedef enum ck_layout {
    CK_LAYOUT_NK = 0,  /* B is [N, K] row-major: out = A B^T (weights of nn.Linear) */
    CK_LAYOUT_KN = 1   /* B is [K, N] row-major: out = A B */
} ck_layout_t;

/* The activation applied last in an epilogue. */
typedef enum ck_activation {
    CK_ACTIVATION_NONE = 0,
    CK_ACTIVATION_RELU = 1  /* max(v, 0) */
} ck_activation_t;

/* INT8 GEMM with int32 results: c[M, N] = sum_k a[m, k] * b(k, n), exact integer arithmetic.
 * Sums wrap modulo 2^32 like int32 addition; with K <= 131071 no sum of int8 products can
 * overflow, so every result is the exact integer.
 * Requirements: M, N >= 1; K >= 16 and a multiple of 16; for CK_LAYOUT_KN also N a multiple
 * of 16; a and b 16-byte aligned; c 4-byte aligned. */
CK_API ck_status_t ck_gemm_int8(const int8_t* a, const int8_t* b, ck_layout_t b_layout, int64_t m,
                                int64_t n, int64_t k, int32_t* c, ck_stream_t stream);

/* INT8 GEMM with a fused epilogue (W8A8 linear layers):
 *   out[m, n] = act(float(acc[m, n]) * scale_a[m or 0] * scale_b[n or 0] + bias[n])
 * acc is the exact int32 product of ck_gemm_int8; the rest is float32 arithmetic,
 *   v = fmaf(float(acc) * scale_a, scale_b, bias)   (bias 0 when NULL)
 * then the activation and one rounding to out_dtype (round-to-nearest-even). Every kernel
 * variant computes exactly these operations, so results do not depend on the variant.
 *
 * scale_a: float32, 1 value (CK_PER_TENSOR) or M values, one per row of A (CK_PER_ROW: per token).
 * scale_b: float32, 1 value (CK_PER_TENSOR) or N values, one per output column n (CK_PER_ROW: per
 *          output channel, i.e. per row of an [N, K] weight and per column of a [K, N] one).
 * bias:    N values of out_dtype, or NULL for none.
 * out:     [M, N] of out_dtype (CK_DTYPE_FP32, CK_DTYPE_FP16 or CK_DTYPE_BF16).
 * Requirements: as ck_gemm_int8; scales 4-byte aligned, bias and out aligned to out_dtype. */
CK_API ck_status_t ck_gemm_int8_scaled(const int8_t* a, const int8_t* b, ck_layout_t b_layout,
                                       int64_t m, int64_t n, int64_t k, const float* scale_a,
                                       ck_granularity_t a_granularity, const float* scale_b,
                                       ck_granularity_t b_granularity, const void* bias,
                                       ck_activation_t activation, void* out, ck_dtype_t out_dtype,
                                       ck_stream_t stream);

/* FP8 GEMM with the scaled epilogue (W8A8 FP8 linear layers): a [M, K] and b [N, K] hold FP8
 * E4M3 bytes (OCP 'fn': 1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no infinities;
 * 0x7F / 0xFF are NaN; largest finite 448), b the [N, K] weight of nn.Linear (K contiguous in
 * both, the layout FP8 tensor cores read):
 *   acc[m, n] = sum_k e4m3(a[m, k]) * e4m3(b[n, k])        (float32 sums)
 *   out[m, n] = act(fmaf(acc[m, n] * scale_a[m or 0], scale_b[n or 0], bias[n]))
 * then one rounding to out_dtype, as ck_gemm_int8_scaled (the same scales, granularities, bias
 * and activation; out_dtype CK_DTYPE_FP32, FP16 or BF16). Or block scales, DeepSeek-V3's scheme
 * (as ck_quantize_fp8 writes them): a_granularity CK_PER_BLOCK_1X128 with scale_a
 * [M, ceil(K / 128)] and b_granularity CK_PER_BLOCK_128X128 with scale_b [ceil(N / 128),
 * ceil(K / 128)], one pair only (another mix is CK_STATUS_UNSUPPORTED); each 128-wide k-block kb
 * is scaled before it is summed:
 *   acc[m, n] = sum_kb (scale_a[m, kb] * scale_b[n / 128, kb]) * sum_{k in kb} a * b
 *   out[m, n] = act(acc[m, n] + bias[n]) Every product is exact in float32;
 * the sums are float32 in an order that depends on the kernel: each kernel adds the tensor
 * cores' sums of at most 256 products (the tensor cores keep fewer bits than float32 within
 * those) into float32 accumulators, as cuBLASLt's FP8 GEMM does without fast accumulation (the
 * same errors on the data measured on the H100: within 2^-9 of sum_k |a b| of the exact sums).
 * tests/reference.py gemm_fp8 is the definition and tests/test_gemm_fp8_gpu.py tests the
 * bound. A NaN operand makes its row's or column's outputs NaN.
 * Kernels: a weight stream for M <= 16, Hopper's wgmma with TMA for larger M, and a reference
 * kernel (float32 fma in k order; what the tests compare against); CK_GEMM_FP8_KERNEL forces
 * one ("small_m", "wgmma", "reference", "auto").
 * FP8 tensor cores come with compute capability 8.9: earlier GPUs get CK_STATUS_UNSUPPORTED.
 * Requirements: M, N >= 1; K >= 16 and a multiple of 16; a and b 16-byte aligned; scales 4-byte
 * aligned, bias and out aligned to out_dtype; out must not overlap an input. The scales are
 * device data and not checked: a non-finite or zero scale gives non-finite or zero outputs. */
CK_API ck_status_t ck_gemm_fp8_scaled(const uint8_t* a, const uint8_t* b, int64_t m, int64_t n,
                                      int64_t k, const float* scale_a,
                                      ck_granularity_t a_granularity, const float* scale_b,
                                      ck_granularity_t b_granularity, const void* bias,
                                      ck_activation_t activation, void* out, ck_dtype_t out_dtype,
                                      ck_stream_t stream);

/* W4A8 linear layer: symmetric INT4 weights x FP8 E4M3 activations on FP8 tensor cores.
 *   a        [M, K] FP8 E4M3 bytes (the activations, e.g. ck_quantize_fp8 per row), with
 *            scale_a: float32, M values (a_granularity CK_PER_ROW) or one (CK_PER_TENSOR);
 *   w_packed [N, K / 2] packed INT4 codes q in -8 .. 7 (two's complement, element 2i in the low
 *            nibble: what ck_quantize_int4 writes with CK_INT4_SYMMETRIC), with w_scales
 *            [N, groups] of scale_dtype (CK_DTYPE_FP16 or CK_DTYPE_BF16, as ck_quantize_int4
 *            writes them), group_size 128 or CK_GROUP_ROW.
 * Every code is an E4M3 value exactly, so each product e4m3(a) * q is exact in float32; the sums
 * run per 128-wide k-block kb and are scaled by their group's scale as they are added:
 *   acc[m, n] = sum_kb float(w_scales[n, g(kb)]) * sum_{k in kb} e4m3(a[m, k]) * q[n, k]
 *               (g(kb) = kb for group 128, 0 for CK_GROUP_ROW; float32, fma per k-block)
 *   out[m, n] = act(acc[m, n] * scale_a[m or 0] + bias[n])    (float32, one rounding to out_dtype)
 * The k-block sums are float32 in an order that depends on the kernel (the tensor cores sum at
 * most 128 products with fewer bits, as ck_gemm_fp8_scaled): tests/reference.py gemm_w4a8 is the
 * definition and tests/test_gemm_w4a8_gpu.py tests the bound (2^-9 of sum_k |a q s|). A NaN in
 * a makes its row NaN. bias: N values of out_dtype or NULL; out [M, N] of out_dtype
 * (CK_DTYPE_FP32, CK_DTYPE_FP16 or CK_DTYPE_BF16).
 * Kernels: a weight stream for M <= 16, Hopper's wgmma for larger M (the codes converted to E4M3
 * in registers, the weight as wgmma's register operand; also for M <= 16 where ceil(N / 128)
 * reaches 3/4 of the SM count, and with K split over a cluster of 4 or 8 CTAs where the output
 * tiles alone leave 3/4 of the SMs idle), and a reference kernel (float32 fma in k order: what
 * the tests compare against); CK_GEMM_W4A8_KERNEL forces one ("small_m", "wgmma", "reference",
 * "auto"). Compute capability 8.9 or newer (FP8 tensor cores), else
 * CK_STATUS_UNSUPPORTED.
 * Requirements: M, N >= 1; K >= 32 and a multiple of 32; a and w_packed 16-byte aligned; scale_a
 * 4-byte aligned, w_scales aligned to scale_dtype, bias and out to out_dtype; out must not
 * overlap an input. The scales are device data and not checked (a non-finite scale gives
 * non-finite outputs). */
CK_API ck_status_t ck_gemm_w4a8(const uint8_t* a, const float* scale_a,
                                ck_granularity_t a_granularity, const uint8_t* w_packed,
                                const void* w_scales, ck_dtype_t scale_dtype, int64_t group_size,
                                const void* bias, ck_activation_t activation, int64_t m, int64_t n,
                                int64_t k, void* out, ck_dtype_t out_dtype, ck_stream_t stream);

/* A [K, N] INT8 weight (CK_LAYOUT_KN) rewritten once as [N, K] (CK_LAYOUT_NK): b_nk[n, k] =
 * b_kn[k, n], bit for bit. The fast INT8 kernels read [N, K] only (the weight-streaming kernel
 * for M <= 16 and Hopper's wgmma; the mma.sync tiles read both), so a [K, N] weight used more
 * than once is worth converting: afterwards pass b_nk to ck_gemm_int8 / ck_gemm_int8_scaled with
 * CK_LAYOUT_NK (a per-column scale_b of the [K, N] weight is the per-row one of [N, K]).
 * Bandwidth-bound: 2 K N bytes moved. Requirements: K, N >= 1 and multiples of 16 (the [K, N]
 * rules of ck_gemm_int8); b_kn and b_nk 16-byte aligned and not overlapping. */
CK_API ck_status_t ck_int8_prepack(const int8_t* b_kn, int64_t k, int64_t n, int8_t* b_nk,
                                   ck_stream_t stream);

/* Weight-only INT4 linear layer (W4A16): out[M, N] = act(x[M, K] w'[N, K]^T + bias[N]).
 *
 * The weight comes in the plain interchange format that ck_quantize_int4 writes for an [N, K]
 * matrix: w_packed [N, K / 2] bytes (element 2i of a row in the low nibble), scales [N, groups]
 * of `dtype`, and for CK_INT4_ASYMMETRIC zeros [N, groups] uint8 (NULL for CK_INT4_SYMMETRIC),
 * groups = ck_int4_groups_per_row(K, group_size). Each weight is dequantized exactly as
 * ck_dequantize_int4 does, w' = (q - zero) * scale rounded to `dtype`, in registers (it is
 * never written to memory); the products accumulate in float32, then the bias (`dtype`, N
 * values, or NULL) is added and the activation applied before the single rounding to `dtype`.
 * x, bias and out have `dtype`: CK_DTYPE_FP16 or CK_DTYPE_BF16.
 * For M <= 16 a kernel streams the packed weight once; larger M runs a simple tiled kernel on
 * this layout. A weight used more than once should be prepacked (ck_w4a16_prepack): the
 * prepacked entry point was faster at M <= 16 on every benchmarked shape (symmetric g128, H100)
 * and has the tensor-core path for M > 16.
 * CK_GEMM_W4A16_KERNEL forces a variant: "small_m" (M <= 16, sm_80+), "reference" or "auto"
 * ("tc" and "wgmma" need the prepacked layout: CK_STATUS_UNSUPPORTED here).
 * Requirements: M, N >= 1; K >= 32 and a multiple of 32; group_size 32, 64, 128 or
 * CK_GROUP_ROW; x and w_packed 16-byte aligned; scales, bias and out aligned to `dtype`. */
CK_API ck_status_t ck_gemm_w4a16(const void* x, ck_dtype_t dtype, const uint8_t* w_packed,
                                 const void* scales, const uint8_t* zeros, int64_t group_size,
                                 ck_int4_mode_t mode, const void* bias, ck_activation_t activation,
                                 int64_t m, int64_t n, int64_t k, void* out, ck_stream_t stream);

/* ---------------------------------------------------------------------------------------------
 * W4A16 on prepacked weights: the fast path for a weight that is used many times.
 *
 * ck_w4a16_prepack converts the interchange format above into the layout the kernels read
 * fastest; ck_gemm_w4a16_prepacked computes exactly what ck_gemm_w4a16 computes on the original
 * (the same bits for the same inputs and kernel variant). The layout, for the record (callers
 * only need the sizes): with N8 = ceil(N / 8) * 8 and K128 = ceil(K / 128) * 128,
 *   w_prepacked:  N8 * K128 / 2 bytes, in 512-byte tiles, tile (i, c) = rows 8i .. 8i + 7 and
 *                 k 128c .. 128c + 127 at byte (i * K128 / 128 + c) * 512. In a tile, 16 bytes
 *                 per (row r, k slice s) at (4r + s) * 16 hold k 128c + 32s .. + 31 as four
 *                 32-bit words of 8 codes; a word's nibble e (bits 4e .. 4e + 3) holds its k
 *                 2e (e < 4) or 2(e - 4) + 1 (e >= 4). Codes are unsigned: a symmetric code q is
 *                 stored as q + 8 (and its zero point is 8). Padding (rows >= N, k >= K) holds
 *                 code 8; no kernel uses codes at k >= K.
 *   scales/zeros: N8 * groups values (dtype / uint8), value (n, g) at ((n / 8) * groups + g) * 8
 *                 + n % 8; padding rows hold scale 0 and zero 8, so they dequantize to 0.
 *                 zeros_prepacked exists for CK_INT4_ASYMMETRIC only (NULL for
 *                 CK_INT4_SYMMETRIC).
 * ------------------------------------------------------------------------------------------- */
/* Bytes of the prepacked weight of an [N, K] matrix (K a multiple of 32), or 0 when n or k is
 * invalid. The layout holds N and K up to 2^40 (0 beyond; ck_w4a16_prepack and
 * ck_moe_prepack then return CK_STATUS_INVALID_VALUE). */
CK_API int64_t ck_w4a16_prepacked_bytes(int64_t n, int64_t k);

/* Values in the prepacked scales (and zeros) of an [N, K] weight, or 0 when an argument is
 * invalid: ceil(N / 8) * 8 * ck_int4_groups_per_row(K, group_size). */
CK_API int64_t ck_w4a16_prepacked_groups(int64_t n, int64_t k, int64_t group_size);

/* Converts an interchange-format weight (w_packed [N, K / 2], scales [N, groups] of dtype,
 * zeros [N, groups] uint8 or NULL, as ck_gemm_w4a16 takes them) to the prepacked layout:
 * w_prepacked (ck_w4a16_prepacked_bytes), scales_prepacked and, for CK_INT4_ASYMMETRIC,
 * zeros_prepacked (ck_w4a16_prepacked_groups values each; NULL for CK_INT4_SYMMETRIC).
 * Requirements: as ck_gemm_w4a16 for dtype, N, K, group_size and w_packed; the outputs
 * 16-byte aligned, and no output overlapping an input. */
CK_API ck_status_t ck_w4a16_prepack(const uint8_t* w_packed, const void* scales,
                                    const uint8_t* zeros, ck_dtype_t dtype, int64_t n, int64_t k,
                                    int64_t group_size, ck_int4_mode_t mode, uint8_t* w_prepacked,
                                    void* scales_prepacked, uint8_t* zeros_prepacked,
                                    ck_stream_t stream);

/* ck_gemm_w4a16 on a weight prepared by ck_w4a16_prepack (with the same n, k, group_size and
 * mode): out[M, N] = act(x[M, K] w'[N, K]^T + bias[N]). For M <= 16 a weight-streaming kernel
 * keeps a deep pipeline of weight bytes in flight; larger M runs tensor-core tiles (sm_80+:
 * mma.sync; on compute capability 9.0: wgmma fed by TMA, in blocks of 64 rows of x for
 * M <= 64, of 128 or, where that still fills the GPU, 256 rows above). Where the output tiles
 * alone would leave SMs idle, a cluster of 2, 4 or 8 blocks shares each tile's K and sums the
 * partial tiles in distributed shared memory, in a fixed order (no workspace, no atomics: the
 * same inputs give the same bits).
 * CK_GEMM_W4A16_KERNEL forces a variant: "small_m" (M <= 16, sm_80+), "tc" (sm_80+),
 * "wgmma" (a compute capability 9.0 GPU, M and K below 2^31), "reference" or "auto" (a variant
 * that cannot serve the call returns CK_STATUS_UNSUPPORTED); CK_GEMM_W4A16_WGMMA_ROWS (64, 128
 * or 256) and CK_GEMM_W4A16_WGMMA_SPLIT (1, 2, 4 or 8) force the wgmma kernel's block rows and
 * blocks per tile; CK_GEMM_W4A16_STREAM_TILES (2, 4, 6 or 8 tiles of 8 output columns per
 * block) forces the weight-streaming kernel's tile count and CK_GEMM_W4A16_STREAM_WARPS (4, 6
 * or 8) caps its warps per block (fewer where that many do not fit the shared memory; the MoE
 * entry points read neither). For tests and benchmarks.
 * Requirements: as ck_gemm_w4a16; w_prepacked, scales_prepacked and zeros_prepacked 16-byte
 * aligned. out must not overlap x, the weight, its scales and zeros or the bias. */
CK_API ck_status_t ck_gemm_w4a16_prepacked(const void* x, ck_dtype_t dtype,
                                           const uint8_t* w_prepacked,
                                           const void* scales_prepacked,
                                           const uint8_t* zeros_prepacked, int64_t group_size,
                                           ck_int4_mode_t mode, const void* bias,
                                           ck_activation_t activation, int64_t m, int64_t n,
                                           int64_t k, void* out, ck_stream_t stream);

/* ---------------------------------------------------------------------------------------------
 * Weight-only GEMM on block 4-bit weights (NF4, MXFP4, NVFP4): out = act(x w'^T + bias)
 *
 * A weight quantized by ck_quantize_nf4 / ck_quantize_mxfp4 / ck_quantize_nvfp4 as an [N, K]
 * matrix (blocks along K) is converted once by ck_block4_prepack, then multiplied by
 * ck_gemm_block4_prepacked:
 *   w'[n, k]  = the value ck_dequantize_<format> writes for (n, k) with out_dtype = dtype:
 *               round_to_dtype(float32(value(code) * block_scale)), block_scale the format's
 *               float32 (NF4 absmax, MXFP4 2^(s - 127), NVFP4 e4m3(s) / global_scale);
 *   out[m, n] = act(sum_k x[m, k] w'[n, k] + bias[n]), the products and sum in float32, rounded
 *               once to dtype (as ck_gemm_w4a16).
 * w' is computed in registers and never written to memory. It is exactly ck_dequantize's
 * value, for every scale: where it lies beyond dtype's range (|w'| >= 65520 in fp16) it is
 * +-inf, as ck_dequantize writes it. With fp16 that happens for MXFP4 scales from 2^15 (E8M0
 * 142: codes of magnitude 2 and more; above 2^16, E8M0 > 143: every non-zero code) and for
 * NVFP4 blocks whose e4m3(s) / global_scale times the code's value reaches 65520. Nothing is
 * rejected: the scales are device data. The quantizers never write such an MXFP4 scale for
 * fp16 data (max 65504: E8M0 140), and bf16 holds every w' of a finite float32 product.
 * A NaN scale (E8M0 0xFF, E4M3 0x7F / 0xFF) makes its block's w' NaN.
 * The formats share no weight with the INT4 GEMMs in general; where an MXFP4 weight's w'
 * equals a symmetric INT4 weight's (codes of magnitude <= 3, scale 2^e = 2 s_int4), the two
 * entry points run the same kernel plan at M <= 16 and give the same bits.
 *
 * Prepacked layout, with N8 = ceil(N / 8) * 8 and K128 = ceil(K / 128) * 128:
 *   w_prepacked:      the INT4 layout of ck_w4a16_prepack (ck_w4a16_prepacked_bytes(N, K)
 *                     bytes), holding each element's raw 4-bit code (NF4: index 0 .. 15 of
 *                     its table; MXFP4, NVFP4: E2M1 sign-magnitude) instead of an INT4 code.
 *                     Padding (rows >= N, k >= K) holds the code of +0.0 (NF4 7, E2M1 0).
 *   scales_prepacked: one unit per row and scale group of G k (G = blocksize for NF4, 32 for
 *                     MXFP4 and NVFP4), unit (n, j) at ((n / 8) * (K / G) + j) * 8 + n % 8
 *                     (the INT4 scales' order), padding rows 0. NF4: the block's float32
 *                     absmax (4 bytes); MXFP4: the block's E8M0 byte; NVFP4: 2 bytes, the E4M3
 *                     bytes of blocks 2j (first, low byte) and 2j + 1. The scales stay in the
 *                     format's own encoding (1 or 2 bytes per 32 k for the FP4 formats, against
 *                     4 for a float32), and one prepacked weight serves both activation dtypes.
 * NVFP4's global scale is not part of the prepacked weight: the GEMM reads it (one float32 on
 * the device, the one the quantizer used) on every call.
 * ------------------------------------------------------------------------------------------- */
typedef enum ck_block4_format {
    CK_BLOCK4_NF4 = 0,    /* ck_quantize_nf4's codes and float32 absmax */
    CK_BLOCK4_MXFP4 = 1,  /* ck_quantize_mxfp4's codes and E8M0 scales */
    CK_BLOCK4_NVFP4 = 2   /* ck_quantize_nvfp4's codes, E4M3 scales and float32 global scale */
} ck_block4_format_t;

/* Bytes of the prepacked scales of an [N, K] weight: ceil(N / 8) * 8 * (K / G) units of 4
 * (NF4), 1 (MXFP4) or 2 (NVFP4) bytes; 0 when an argument is invalid (a format, blocksize or
 * shape that ck_block4_prepack rejects). The codes take ck_w4a16_prepacked_bytes(N, K). */
CK_API int64_t ck_block4_prepacked_scales_bytes(ck_block4_format_t format, int64_t n, int64_t k,
                                                int64_t blocksize);

/* Converts a weight as ck_quantize_<format> writes it for an [N, K] matrix to the prepacked
 * layout: packed [N, K / 2] bytes (the format's nibble order) and scales [N, K / blocksize]
 * (float32 absmax for NF4, uint8 E8M0 for MXFP4, uint8 E4M3 for NVFP4) -> w_prepacked
 * (ck_w4a16_prepacked_bytes(N, K) bytes) and scales_prepacked
 * (ck_block4_prepacked_scales_bytes bytes). Every byte of both outputs is written.
 * blocksize: NF4 32, 64 or 128 (the blocks the GEMM kernels read; NF4's larger blocks are
 * CK_STATUS_UNSUPPORTED), MXFP4 32, NVFP4 16 (others: CK_STATUS_UNSUPPORTED).
 * Requirements: N >= 1; K >= 32, a multiple of 32 and of blocksize (CK_STATUS_UNSUPPORTED: the
 * last block of a row is whole); N, K <= 2^40 (CK_STATUS_INVALID_VALUE beyond); packed,
 * w_prepacked and scales_prepacked 16-byte aligned, NF4's scales 4-byte aligned. No output may
 * overlap an input or the other output. */
CK_API ck_status_t ck_block4_prepack(ck_block4_format_t format, const uint8_t* packed,
                                     const void* scales, int64_t n, int64_t k, int64_t blocksize,
                                     uint8_t* w_prepacked, void* scales_prepacked,
                                     ck_stream_t stream);

/* out[M, N] = act(x[M, K] w'[N, K]^T + bias[N]) on a weight prepared by ck_block4_prepack (the
 * same format, n, k and blocksize); w' as the section above defines it. x, bias (N values or
 * NULL) and out have `dtype`: CK_DTYPE_FP16 or CK_DTYPE_BF16. global_scale: NVFP4's float32
 * global scale on the device (required for CK_BLOCK4_NVFP4, NULL for the others).
 * For M <= 16 (sm_80+) the weight-streaming kernel of ck_gemm_w4a16_prepacked reads the weight
 * once; larger M runs that function's Hopper kernel (wgmma, compute capability 9.0 with the
 * sm_90a build; CK_GEMM_W4A16_WGMMA_* and CK_GEMM_W4A16_STREAM_* apply to them too), and on
 * other GPUs a simple tiled kernel, correct but far from the tensor cores' speed.
 * CK_GEMM_BLOCK4_KERNEL forces a variant: "small_m" (M <= 16, sm_80+), "wgmma" (any M, as
 * above), "reference" or "auto" (an unknown name: CK_STATUS_INVALID_VALUE; a variant that
 * cannot serve the call: CK_STATUS_UNSUPPORTED).
 * Requirements: a valid format (CK_STATUS_INVALID_VALUE), dtype fp16 or bf16 and blocksize as
 * ck_block4_prepack (CK_STATUS_UNSUPPORTED); M, N >= 1; K >= 32, a multiple of 32 and of
 * blocksize; N, K <= 2^40; x, w_prepacked and scales_prepacked 16-byte aligned; global_scale
 * 4-byte aligned; bias and out aligned to dtype. out must not overlap x, the weight, its
 * scales, global_scale or the bias. */
CK_API ck_status_t ck_gemm_block4_prepacked(const void* x, ck_dtype_t dtype,
                                            ck_block4_format_t format, const uint8_t* w_prepacked,
                                            const void* scales_prepacked, const float* global_scale,
                                            int64_t blocksize, const void* bias,
                                            ck_activation_t activation, int64_t m, int64_t n,
                                            int64_t k, void* out, ck_stream_t stream);

/* ---------------------------------------------------------------------------------------------
 * Fused Q/K/V projection with rotary position embedding (any 4-bit weight format)
 *
 * One GEMM for the three projections of an attention layer, written where the attention entry
 * points read them, with no split, transpose or rotation kernel after it:
 *   y = x[T, H] W[N, H]^T + bias[N],  N = (Hq + 2 Hkv) D
 *   q[t, h, :] = y[t, h D .. h D + D - 1]                    h < Hq     ([T, Hq, D])
 *   k[t, h, :] = y[t, (Hq + h) D ..]                          h < Hkv    ([T, Hkv, D])
 *   v[t, h, :] = y[t, (Hq + Hkv + h) D ..]                    h < Hkv    ([T, Hkv, D])
 * W is the q_proj, k_proj and v_proj weights of a checkpoint stacked in that order (rows 0 ..
 * Hq D - 1 are Wq, head h at rows h D .. h D + D - 1; then Wk, then Wv: vLLM's qkv_proj), in
 * any of the four 4-bit formats, dequantized exactly as ck_gemm_w4a16_prepacked (INT4) or
 * ck_gemm_block4_prepacked (NF4, MXFP4, NVFP4) does; the products and sums in float32.
 * RoPE (optional) rotates q and k, never v, in float32 before the one rounding to dtype. Token
 * t's position is positions[t]; the angles come from the caller's table cos_sin float32
 * [max_position, R]: row p holds cos(p theta_i) for i < R / 2, then sin(p theta_i) (vLLM's
 * cos_sin_cache), R = rotary_dim, so the table carries the frequencies (base 10000 or 500000,
 * Llama-3's scaling, YaRN) and the library computes no trigonometry. With c = cos_sin[p, i],
 * s = cos_sin[p, R / 2 + i], i < R / 2, in each head:
 *   CK_ROPE_NEOX (rotate-half: Llama, GPT-NeoX):  a = y[i], b = y[i + R / 2]
 *   CK_ROPE_INTERLEAVED (GPT-J):                  a = y[2i], b = y[2i + 1]
 *   a' = a c - b s, b' = b c + a s (two float32 products and a difference, each rounded);
 *   components R .. D - 1 pass unchanged.
 * A position outside [0, max_position) reads the nearest row of the table (nothing is read
 * out of bounds; the positions are device data and are not validated).
 * The result is within float32 accumulation and rotation rounding of the exact value
 * (tests/reference.py, qkv_projection), not bitwise equal to any other entry point's.
 *
 * The weight is prepared once by ck_qkv_prepack from the format's native storage (as
 * ck_w4a16_prepack or ck_block4_prepack take it) for one layer description: with CK_ROPE_NEOX
 * it also reorders the q and k rows of each head so that the two outputs of each rotation are
 * computed side by side (the byte layout is otherwise that of the format's prepack, and its
 * sizes are ck_w4a16_prepacked_bytes(N, H) and ck_w4a16_prepacked_groups(N, H, group_size)
 * values of dtype (INT4) or ck_block4_prepacked_scales_bytes(format, N, H, group_size)). A
 * weight prepared for one head geometry, rope_style or rotary_dim gives wrong values with
 * another.
 *
 * Kernels: those of ck_gemm_w4a16_prepacked (INT4; CK_GEMM_W4A16_KERNEL forces one) or of
 * ck_gemm_block4_prepacked (CK_GEMM_BLOCK4_KERNEL), with this epilogue: the weight streams once
 * for T <= 16; larger T runs tensor-core tiles (wgmma on Hopper for every format; before Hopper,
 * mma.sync for INT4 and the simple tiled kernel for the block formats).
 * ------------------------------------------------------------------------------------------- */
typedef enum ck_weight4_format {
    CK_WEIGHT4_INT4 = 0,   /* ck_w4a16_prepack's weight: dtype scales, zeros or none */
    CK_WEIGHT4_NF4 = 1,    /* ck_block4_prepack's CK_BLOCK4_NF4 weight */
    CK_WEIGHT4_MXFP4 = 2,  /* ... CK_BLOCK4_MXFP4 */
    CK_WEIGHT4_NVFP4 = 3   /* ... CK_BLOCK4_NVFP4 (with its float32 global scale) */
} ck_weight4_format_t;

typedef enum ck_rope_style {
    CK_ROPE_NONE = 0,         /* no rotation */
    CK_ROPE_NEOX = 1,         /* rotate-half pairs (i, i + R / 2): Llama, GPT-NeoX, Qwen */
    CK_ROPE_INTERLEAVED = 2   /* adjacent pairs (2i, 2i + 1): GPT-J */
} ck_rope_style_t;

/* One projection layer and one call (see the convention at the top of this header). Fields
 * marked [prepack] describe the weight and are all that ck_qkv_prepack reads. */
typedef struct ck_qkv_params {
    size_t struct_size;            /* sizeof(ck_qkv_params_t) */
    int64_t tokens;                /* T >= 1 */
    int64_t hidden;                /* H [prepack]: >= 32, a multiple of 32 and of the block */
    int64_t num_heads_q;           /* Hq [prepack]: a multiple of num_heads_kv, at most 2^20 */
    int64_t num_heads_kv;          /* Hkv [prepack]: 1 .. 2^20 */
    int64_t head_dim;              /* D [prepack]: a multiple of 8, at most 2^20 */
    ck_dtype_t dtype;              /* x, bias, q, k, v and INT4 scales [prepack]: FP16 or BF16 */
    ck_weight4_format_t format;    /* [prepack] */
    int64_t group_size;            /* [prepack] INT4: 32, 64, 128 or CK_GROUP_ROW; NF4: its
                                    * blocksize 32, 64 or 128; MXFP4 32; NVFP4 16 */
    ck_int4_mode_t mode;           /* [prepack] INT4 only (zeros_prepacked given exactly when
                                    * CK_INT4_ASYMMETRIC); default CK_INT4_SYMMETRIC */
    ck_rope_style_t rope_style;    /* [prepack] default CK_ROPE_NONE */
    int64_t rotary_dim;            /* R [prepack]: even, 2 .. D (ignored without RoPE) */
    const void* x;                 /* [T, H] dtype, 16-byte aligned */
    const uint8_t* w_prepacked;    /* from ck_qkv_prepack, 16-byte aligned */
    const void* scales_prepacked;  /* 16-byte aligned */
    const uint8_t* zeros_prepacked;  /* INT4 asymmetric only, 16-byte aligned */
    const float* global_scale;     /* NVFP4's float32 global scale (device), else NULL */
    const void* bias;              /* [N] dtype in W's row order, or NULL */
    const int32_t* positions;      /* [T] with RoPE (not read without) */
    const float* cos_sin;          /* [max_position, R] float32 with RoPE (not read without) */
    int64_t max_position;          /* >= 1 with RoPE (not read without) */
    void* q;                       /* [T, Hq, D] dtype */
    void* k;                       /* [T, Hkv, D] dtype */
    void* v;                       /* [T, Hkv, D] dtype */
} ck_qkv_params_t;

/* Prepares the stacked weight W [N, H] of the layer `params` describes (its [prepack] fields;
 * the others are ignored) for ck_qkv_projection. Inputs, as the format's own prepack takes them:
 * INT4: packed [N, H / 2] (ck_quantize_int4's codes), scales [N, groups] of dtype, zeros
 * [N, groups] uint8 or NULL (as ck_w4a16_prepack); NF4 / MXFP4 / NVFP4: packed [N, H / 2] in
 * the format's nibble order and scales [N, H / blocksize] (as ck_block4_prepack; zeros NULL).
 * Outputs: w_prepacked (ck_w4a16_prepacked_bytes(N, H) bytes), scales_prepacked and, for INT4
 * asymmetric, zeros_prepacked (sizes above); every byte is written. Requirements: as the
 * format's prepack and ck_qkv_projection's for the [prepack] fields; no output overlapping an
 * input. */
CK_API ck_status_t ck_qkv_prepack(const ck_qkv_params_t* params, const uint8_t* packed,
                                  const void* scales, const uint8_t* zeros, uint8_t* w_prepacked,
                                  void* scales_prepacked, uint8_t* zeros_prepacked,
                                  ck_stream_t stream);

/* The projection: q, k, v from x and the prepared weight, as the section above defines them.
 * Requirements: the [prepack] fields as ck_qkv_prepack was given them; T >= 1; the sizes' byte
 * counts representable in int64_t; x and the weight's pointers 16-byte aligned, global_scale
 * (and, with RoPE, positions and cos_sin) 4-byte aligned, bias, q, k and v aligned to dtype
 * (4-byte aligned q, k and v store pairs at once). q, k and v must not overlap each other or
 * any input.
 * Invalid values return CK_STATUS_INVALID_VALUE; a format, blocksize or dtype the kernels do not
 * serve CK_STATUS_UNSUPPORTED. */
CK_API ck_status_t ck_qkv_projection(const ck_qkv_params_t* params, ck_stream_t stream);

/* ---------------------------------------------------------------------------------------------
 * Importers from checkpoint formats into the interchange format (device to device).
 *
 * GPTQ (AutoGPTQ / GPTQ-for-LLaMa, 4 bits): qweight int32 [K / 8, N], code of (k, n) in bits
 * 4 (k % 8) .. + 3 of qweight[k / 8][n], unsigned [0, 15]; qzeros int32 [groups, N / 8], zero of
 * (g, n) in bits 4 (n % 8) .. + 3 of qzeros[g][n / 8], stored as zero - 1 (the format's
 * convention, so the zero point used is stored + 1, in [1, 16]); scales [groups, N] of dtype
 * (fp16 in checkpoints); g_idx int32 [K], the group of each k, or NULL for groups of
 * consecutive k (g_idx[k] = k / group_size). w = (q - zero) * scale.
 * With g_idx (act-order checkpoints), the groups are not runs of consecutive k: the importer
 * sorts k by group (stable) and writes perm [K] int32, where column j of the imported weight is
 * checkpoint row perm[j]. The layer then computes x[:, perm] times the imported weight
 * (ck_permute_columns). g_idx must put exactly group_size values of k in each group but the
 * last (as act-order checkpoints do); otherwise the result is unspecified (the Python wrapper
 * checks this on the host).
 * AWQ (4 bits, GEMM layout): qweight int32 [K, N / 8], code of (k, n) in nibble p of
 * qweight[k][n / 8] where n % 8 = (0, 2, 4, 6, 1, 3, 5, 7)[p]; qzeros int32 [groups, N / 8]
 * packed the same way (the zero point itself); scales [groups, N] of dtype. w = (q - zero) *
 * scale.
 * Both write w_packed [N, K / 2], scales_out [N, groups] of dtype and zeros_out [N, groups]
 * uint8: a CK_INT4_ASYMMETRIC weight in the interchange format, groups =
 * ck_int4_groups_per_row(K, group_size). GPTQ's zero points lie in [1, 16], one past the range
 * ck_quantize_int4 writes; ck_dequantize_int4 and every W4A16 GEMM accept zero points up to 16.
 * Requirements: N a multiple of 8 (eight codes or zeros per int32 along N), K a multiple of
 * 32 (as ck_gemm_w4a16 needs), group_size 32, 64, 128 or CK_GROUP_ROW; dtype CK_DTYPE_FP16 or
 * CK_DTYPE_BF16; every pointer aligned to its element size; no output overlapping an input.
 * The tensors come straight from a checkpoint's int32 / fp16 arrays, on the device.
 * ------------------------------------------------------------------------------------------- */
CK_API ck_status_t ck_import_gptq(const int32_t* qweight, const int32_t* qzeros,
                                  const void* scales, const int32_t* g_idx, ck_dtype_t dtype,
                                  int64_t n, int64_t k, int64_t group_size, uint8_t* w_packed,
                                  void* scales_out, uint8_t* zeros_out, int32_t* perm,
                                  ck_stream_t stream);

CK_API ck_status_t ck_import_awq(const int32_t* qweight, const int32_t* qzeros,
                                 const void* scales, ck_dtype_t dtype, int64_t n, int64_t k,
                                 int64_t group_size, uint8_t* w_packed, void* scales_out,
                                 uint8_t* zeros_out, ck_stream_t stream);

/* Gathers columns: out[r, j] = x[r, perm[j]] for x, out [rows, cols] of dtype (any of
 * CK_DTYPE_FP32, CK_DTYPE_FP16, CK_DTYPE_BF16) and perm [cols] int32, each in [0, cols) (not
 * checked: device data). x and out must not overlap; pointers aligned to their element size.
 * cols <= 2^31 - 1 (perm's int32 indices address no more; CK_STATUS_UNSUPPORTED beyond). */
CK_API ck_status_t ck_permute_columns(const void* x, ck_dtype_t dtype, int64_t rows, int64_t cols,
                                      const int32_t* perm, void* out, ck_stream_t stream);

/* ---------------------------------------------------------------------------------------------
 * Structured-sparse INT4 weights: 2:4 and 16:32 along K
 *
 * A weight W [N, K] (nn.Linear layout) split along K into aligned blocks keeps at most half of
 * each block: 2:4 (blocks of 4, the pattern of the sparse tensor cores and cuSPARSELt) or 16:32
 * (blocks of 32). Both keep exactly K / 2 values per row. Format (tests/reference.py,
 * sparse24_* and sparse1632_*, is its executable spec):
 *   codes [N, K / 4] uint8: a row's kept values in ascending k, INT4-quantized and packed as
 *         ck_quantize_int4 packs them (value 2i in the low nibble; two's complement for
 *         CK_INT4_SYMMETRIC, unsigned with a zero point for CK_INT4_ASYMMETRIC);
 *   meta  [N, K / 32] uint32, one word per 32 k of a row: 2:4: block b (k 4b .. 4b + 3) is
 *         nibble b % 8 (bits 4(b % 8) .. + 3) of word b / 8, idx0 | idx1 << 2 with
 *         idx0 < idx1 its kept positions; 16:32: bit i set where k = 32c + i is kept (16 bits);
 *   scales [N, K / group_size] (the weight's dtype), zeros [N, K / group_size] uint8 (asymmetric
 *         only): groups of group_size = 64 or 128 DENSE k, each holding group_size / 2 kept
 *         values, quantized exactly as ck_quantize_int4 quantizes those values (the pruned
 *         zeros do not change a group's range, so these are the scales of the dense pruned
 *         weight).
 * Kept positions of a block: its non-zeros (a float32 value != 0; NaN is non-zero, -0.0 is
 * zero), then, while fewer than half the block, its lowest zero positions (a stored zero gets
 * the code of 0).
 * w'[n, k] = round_to_dtype((q - zero) * scale) at kept positions (ck_dequantize_int4's rule),
 * +0 at the others.
 * Requirements of every call below that takes a quantized weight: N >= 1; K a multiple of 32
 * and of group_size; group_size 64 or 128 (CK_STATUS_UNSUPPORTED otherwise); a valid
 * ck_sparsity_t (CK_STATUS_INVALID_VALUE); codes and meta 16-byte aligned; scales, zeros and
 * the dense matrices aligned to their element size; no output overlapping an input.
 * ------------------------------------------------------------------------------------------- */
typedef enum ck_sparsity {
    CK_SPARSITY_2_4 = 0,    /* at most 2 non-zeros in every aligned block of 4 k */
    CK_SPARSITY_16_32 = 1   /* at most 16 non-zeros in every aligned block of 32 k */
} ck_sparsity_t;

/* Prunes w [N, K] (dtype: CK_DTYPE_FP32, FP16 or BF16) to the pattern: in every block the half
 * of largest |w| keeps its bits, the other half becomes +0. Ties in |w| (+0 and -0 tie): the
 * lower k is kept. NaN ranks below every number. out [N, K] of dtype. N >= 1, K >= 32 and a
 * multiple of 32; w and out aligned to dtype and not overlapping. */
CK_API ck_status_t ck_sparse_prune(const void* w, ck_dtype_t dtype, ck_sparsity_t sparsity,
                                   int64_t n, int64_t k, void* out, ck_stream_t stream);

/* Compresses and quantizes a weight w [N, K] of dtype (FP32, FP16 or BF16) that satisfies the
 * pattern into codes, meta, scales (dtype) and zeros (CK_INT4_ASYMMETRIC only, else NULL).
 * violations: NULL, or one int32 on the device that the call sets to the number of blocks with
 * more than half non-zeros (0: the weight satisfies the pattern). The weight is device data,
 * so the call cannot refuse it; a violating block keeps its first non-zeros (lowest k) and the
 * result is a valid weight of the pattern, but not the caller's: read violations back, or prune
 * first (ck_sparse_prune). */
CK_API ck_status_t ck_sparse_quantize_int4(const void* w, ck_dtype_t dtype,
                                           ck_sparsity_t sparsity, int64_t n, int64_t k,
                                           int64_t group_size, ck_int4_mode_t mode,
                                           uint8_t* codes, uint32_t* meta, void* scales,
                                           uint8_t* zeros, int32_t* violations,
                                           ck_stream_t stream);

/* A 16:32 weight as 2:4: masks [N, K / 32] (ck_sparse_quantize_int4's with CK_SPARSITY_16_32)
 * -> meta_24 [N, K / 32], the 2:4 metadata of the same kept positions, for a weight whose every
 * block of 4 k keeps exactly 2 of them (its codes, scales and zeros serve both patterns
 * unchanged: the kept values keep their order). violations: NULL, or one int32 on the device
 * that the call sets to the number of blocks of 4 that keep another count (0: the conversion
 * is exact); such a block's metadata names positions 0 and 1, and the weight is not the
 * caller's. N >= 1; K >= 32 and a multiple of 32; masks and meta_24 16-byte aligned and not
 * overlapping. */
CK_API ck_status_t ck_sparse_1632_to_24(const uint32_t* masks, int64_t n, int64_t k,
                                        uint32_t* meta_24, int32_t* violations,
                                        ck_stream_t stream);

/* The dense weight out [N, K] of out_dtype (the scales' type: FP32, FP16 or BF16): w' above.
 * meta must name valid positions (2:4: idx0 < idx1 in every nibble; 16:32: 16 bits a word), as
 * ck_sparse_quantize_int4 writes them; other values give unspecified (but in-bounds) results. */
CK_API ck_status_t ck_sparse_dequantize_int4(const uint8_t* codes, const uint32_t* meta,
                                             const void* scales, const uint8_t* zeros,
                                             ck_sparsity_t sparsity, int64_t n, int64_t k,
                                             int64_t group_size, ck_int4_mode_t mode, void* out,
                                             ck_dtype_t out_dtype, ck_stream_t stream);

/* out[M, N] = act(x[M, K] w'[N, K]^T + bias[N]) on the format above (either pattern), w' in
 * registers only: products and sum in float32, bias and activation, one rounding to dtype.
 * x, scales, bias (N values or NULL) and out have dtype: CK_DTYPE_FP16 or CK_DTYPE_BF16. This
 * layout runs a simple tiled kernel (any GPU, any M); a weight used more than once should be
 * prepacked: a 2:4 one for the sparse tensor cores (ck_sparse_w4a16_prepack), a 16:32 one for
 * the dense INT4 kernels (ck_sparse_w4a16_prepack_dense).
 * CK_GEMM_SPARSE_KERNEL forces a variant ("reference" or "auto"; "stream" needs a prepacked
 * weight: CK_STATUS_UNSUPPORTED here). M >= 1; x 16-byte aligned; out must not overlap an
 * input. */
CK_API ck_status_t ck_gemm_sparse_w4a16(const void* x, ck_dtype_t dtype, ck_sparsity_t sparsity,
                                        const uint8_t* codes, const uint32_t* meta,
                                        const void* scales, const uint8_t* zeros,
                                        int64_t group_size, ck_int4_mode_t mode, const void* bias,
                                        ck_activation_t activation, int64_t m, int64_t n,
                                        int64_t k, void* out, ck_stream_t stream);

/* The prepacked 2:4 weight for the sparse tensor cores (mma.sp), with N16 = ceil(N / 16) * 16:
 * w_prepacked holds the codes and the metadata in the order the kernel's lanes read them
 * (N16 * K * 3 / 8 bytes: 3 bits per weight), scales_prepacked and zeros_prepacked N16 *
 * (K / group_size) values each (the layout is kernels/sparse/gemm_sparse_w4a16.cu's; callers
 * only need the sizes). 0 for an invalid shape: K must be a multiple of 128. */
CK_API int64_t ck_sparse_w4a16_prepacked_bytes(int64_t n, int64_t k);
CK_API int64_t ck_sparse_w4a16_prepacked_groups(int64_t n, int64_t k, int64_t group_size);

/* Converts a 2:4 weight in the format above (codes, meta, scales of dtype FP16 or BF16, zeros)
 * to the prepacked layout. meta is read as 2:4 metadata: a 16:32 weight must be converted to
 * 2:4 first, which is possible where every block of 4 keeps 2 (tests/reference.py,
 * sparse1632_to_24); its mask given here gives unspecified weights. K a multiple of 128; the
 * outputs 16-byte aligned; every byte of them is written. */
CK_API ck_status_t ck_sparse_w4a16_prepack(const uint8_t* codes, const uint32_t* meta,
                                           const void* scales, const uint8_t* zeros,
                                           ck_dtype_t dtype, int64_t n, int64_t k,
                                           int64_t group_size, ck_int4_mode_t mode,
                                           uint8_t* w_prepacked, void* scales_prepacked,
                                           uint8_t* zeros_prepacked, ck_stream_t stream);

/* Either pattern as a DENSE INT4 weight in ck_w4a16_prepack's layout (ck_w4a16_prepacked_bytes
 * and ck_w4a16_prepacked_groups give the sizes), for ck_gemm_w4a16_prepacked: the kept codes at
 * their positions, every pruned position holding the code of 0 (0 when symmetric, its group's
 * zero point when asymmetric), the scales and zeros as they are. That GEMM then computes w' of
 * the format above: the way to run a 16:32 weight fast (no tensor-core instruction reads that
 * pattern: its blocks of 4 keep 0 to 4 values) and a 2:4 weight at large M, where the dense
 * wgmma kernel outruns the mma.sp tiles. The weight takes 4 bits per value there instead of 3.
 * Requirements: as ck_sparse_dequantize_int4 for the format (dtype FP16 or BF16); N and K up to
 * 2^40; the outputs 16-byte aligned; every byte of them is written. */
CK_API ck_status_t ck_sparse_w4a16_prepack_dense(const uint8_t* codes, const uint32_t* meta,
                                                 const void* scales, const uint8_t* zeros,
                                                 ck_sparsity_t sparsity, ck_dtype_t dtype,
                                                 int64_t n, int64_t k, int64_t group_size,
                                                 ck_int4_mode_t mode, uint8_t* w_prepacked,
                                                 void* scales_prepacked,
                                                 uint8_t* zeros_prepacked, ck_stream_t stream);

/* ck_gemm_sparse_w4a16 on a weight prepared by ck_sparse_w4a16_prepack (same n, k, group_size,
 * mode): the same w', on sparse tensor cores (mma.sp, compute capability 8.0 and newer):
 * for M <= 16 a kernel that streams the compressed weight once (N below 2^35); for larger M,
 * on a compute capability 9.0 GPU (with the sm_90a build) Hopper's sparse wgmma in blocks of
 * 64, 128 or 256 rows of x by 128 weight rows (M and K below 2^31; where those blocks would
 * leave SMs idle, clusters of 2, 4 or 8 blocks share each one's K), elsewhere mma.sp tiles of
 * 128 weight rows by 64 rows of x (fewer than 2^31 of them), or, where those would leave SMs
 * idle, the streaming kernel once per 16 rows of x (N at most 1048560). Elsewhere the tiled
 * reference kernel, which reads this layout too. CK_GEMM_SPARSE_KERNEL: "stream", "tiles",
 * "wgmma", "reference" or "auto"; CK_GEMM_SPARSE_WGMMA_ROWS (64, 128 or 256) and
 * CK_GEMM_SPARSE_WGMMA_SPLIT (1, 2, 4 or 8) force the wgmma kernel's block rows and K split (for
 * tests and benchmarks). Requirements: as ck_gemm_sparse_w4a16, K a multiple of 128,
 * w_prepacked 16-byte aligned, scales_prepacked and zeros_prepacked 4-byte aligned. */
CK_API ck_status_t ck_gemm_sparse_w4a16_prepacked(const void* x, ck_dtype_t dtype,
                                                  const uint8_t* w_prepacked,
                                                  const void* scales_prepacked,
                                                  const uint8_t* zeros_prepacked,
                                                  int64_t group_size, ck_int4_mode_t mode,
                                                  const void* bias, ck_activation_t activation,
                                                  int64_t m, int64_t n, int64_t k, void* out,
                                                  ck_stream_t stream);

/* ---------------------------------------------------------------------------------------------
 * INT4 x INT4 GEMM: both operands packed int4 (two's complement [-8, 7], two per byte along K,
 * element 2i in the low nibble of byte i): a [M, K / 2] bytes, b [N, K / 2] bytes (the
 * nn.Linear layout, out = A B^T). Products accumulate in exact int32.
 * Requirements: M, N >= 1; K >= 32 and a multiple of 32; a and b 16-byte aligned; c 4-byte
 * aligned (out aligned to out_dtype). The variant is chosen from the shape and the GPU: for
 * M <= 16 a kernel streams b once; larger M runs tensor-core tiles (int4 unpacked to int8: wgmma
 * on compute capability 9.0 with the sm_90a build while K <= 131040, mma.sync elsewhere).
 * CK_GEMM_INT4_KERNEL forces one: "reference" (any GPU), "mma" (sm_80+), "small_m" (M <= 16,
 * sm_80+), "wgmma" (as above) or "auto"; one that cannot serve the call returns
 * CK_STATUS_UNSUPPORTED.
 * a, b, the scales and the bias must not overlap the output.
 * ------------------------------------------------------------------------------------------- */
/* c[M, N] = sum_k a[m, k] * b[n, k], exact (no int32 overflow below K = 2^25). */
CK_API ck_status_t ck_gemm_int4(const uint8_t* a, const uint8_t* b, int64_t m, int64_t n,
                                int64_t k, int32_t* c, ck_stream_t stream);

/* The same product with ck_gemm_int8_scaled's fused epilogue (scales, bias, activation, one
 * rounding to out_dtype), bit for bit the same float32 operations. */
CK_API ck_status_t ck_gemm_int4_scaled(const uint8_t* a, const uint8_t* b, int64_t m, int64_t n,
                                       int64_t k, const float* scale_a,
                                       ck_granularity_t a_granularity, const float* scale_b,
                                       ck_granularity_t b_granularity, const void* bias,
                                       ck_activation_t activation, void* out, ck_dtype_t out_dtype,
                                       ck_stream_t stream);

/* Floating-point linear layer: out[M, N] = act(x[M, K] w[N, K]^T + bias[N]).
 * x, w, bias and out all have `dtype` (CK_DTYPE_FP32, CK_DTYPE_FP16 or CK_DTYPE_BF16); the
 * products accumulate in float32 (fp32 inputs are not rounded to TF32), the bias is added and
 * the activation applied before the single rounding to dtype. bias may be NULL.
 * The product runs on cuBLASLt with its bias/ReLU epilogue fused (no workspace, so the call can
 * be captured in a graph); a cuBLASLt failure returns CK_STATUS_CUBLAS_ERROR.
 * Requirements: M, N, K >= 1; every pointer 16-byte aligned; K and N multiples of
 * 16 / sizeof(dtype) (so that every row starts 16-byte aligned). x, w and bias must not
 * overlap out. */
CK_API ck_status_t ck_linear(const void* x, const void* w, const void* bias, ck_dtype_t dtype,
                             int64_t m, int64_t n, int64_t k, ck_activation_t activation, void* out,
                             ck_stream_t stream);

/* ---------------------------------------------------------------------------------------------
 * Mixture of experts (INT4 experts, fp16/bf16 activations)
 *
 * One MoE feed-forward layer (Mixtral / Qwen-MoE / DeepSeek style) over T tokens, E experts, the
 * top k per token, hidden size H and expert intermediate size I:
 *   route:    p[t] = softmax(logits[t, :]) in float32; the k experts of largest p (ties: the
 *             lower expert index first), in descending order, are ids[t, 0 .. k-1]; their
 *             weights are w[t, j] = p[t, ids[t, j]], divided by sum_j w[t, j] when renormalize.
 *   experts:  for each pair (t, j), e = ids[t, j]:
 *               g = x[t] . W1_e^T, u = x[t] . W3_e^T        (float32 sums, [I] each)
 *               h = round_to_dtype(silu(g) * u)            silu(g) = g / (1 + exp(-g))
 *               y = h . W2_e^T                              (float32 sum, [H])
 *   combine:  out[t] = round_to_dtype(sum_{j = 0 .. k-1} w[t, j] * y(t, j)), summed in that order.
 * The weights W1_e, W3_e [I, H] (gate and up) and W2_e [H, I] (down) are INT4 with groups along
 * their input dimension, dequantized as ck_dequantize_int4 does (rounded to dtype), then used as
 * in ck_gemm_w4a16_prepacked. Results do not depend on thread timing: the same call gives the
 * same bits on every run and every graph replay.
 *
 * Expert weights live in one prepacked tensor per projection (ck_moe_prepack): w13 holds the E
 * experts' [2I, H] gate+up weights (rows 0 .. I-1 the gate W1, rows I .. 2I-1 the up W3, as
 * vLLM's w13), w2 the E experts' [H, I] down weights.
 *
 * Device-side ids: an id outside [0, E) (passed by the caller in topk_ids) is the caller's
 * error; the pair it names then contributes nothing to out, and nothing is read or written out
 * of bounds.
 *
 * Sizes: tokens * top_k is at most 2^40 (token, expert) pairs in every entry point
 * (CK_STATUS_INVALID_VALUE beyond); ck_moe_forward has a tighter limit of its own (below).
 * ------------------------------------------------------------------------------------------- */

/* The activation between the gate+up and the down projection. */
typedef enum ck_moe_activation {
    CK_MOE_SWIGLU = 0  /* silu(gate) * up */
} ck_moe_activation_t;

/* Routing alone: logits [tokens, experts] (CK_DTYPE_FP32, FP16 or BF16) -> topk_ids
 * [tokens, top_k] int32 and topk_weights [tokens, top_k] float32, as `route` above.
 * Requirements: tokens >= 1; 1 <= experts <= 1024; 1 <= top_k <= min(experts, 32); logits
 * aligned to its element size, topk_ids and topk_weights 4-byte aligned. topk_ids and
 * topk_weights must not overlap logits or each other. */
CK_API ck_status_t ck_moe_route(const void* logits, ck_dtype_t logits_dtype, int64_t tokens,
                                int64_t experts, int64_t top_k, int renormalize,
                                int32_t* topk_ids, float* topk_weights, ck_stream_t stream);

/* Bytes of the prepacked weight of `experts` experts of [n, k] each (experts times
 * ck_w4a16_prepacked_bytes(n, k); expert e's starts at e times that), and values of its scales
 * (zeros): experts times ck_w4a16_prepacked_groups(n, k, group_size). 0 for invalid sizes. */
CK_API int64_t ck_moe_prepacked_bytes(int64_t experts, int64_t n, int64_t k);
CK_API int64_t ck_moe_prepacked_groups(int64_t experts, int64_t n, int64_t k, int64_t group_size);

/* Prepacks the weights of `experts` experts, each [n, k] in the interchange format of
 * ck_gemm_w4a16 (w_packed [experts, n, k / 2], scales and zeros [experts, n, groups]), into
 * the layout ck_moe_forward reads. gate_up = 1 for w13 (n = 2I: rows 0 .. I-1 gate, I .. 2I-1
 * up; the layout interleaves them in tiles of 8 rows: tile 2b holds gate rows 8b .. 8b+7,
 * tile 2b+1 up rows 8b .. 8b+7, so that one block of the kernel holds both halves of the
 * activation), 0 for w2. experts: 1 .. 1024. Outputs: w_prepacked (ck_moe_prepacked_bytes),
 * scales_prepacked and, for CK_INT4_ASYMMETRIC, zeros_prepacked (ck_moe_prepacked_groups values
 * each; NULL for CK_INT4_SYMMETRIC). Requirements: as ck_w4a16_prepack (no output overlapping
 * an input), and n % 16 == 0 when gate_up. */
CK_API ck_status_t ck_moe_prepack(const uint8_t* w_packed, const void* scales,
                                  const uint8_t* zeros, ck_dtype_t dtype, int64_t experts,
                                  int64_t n, int64_t k, int64_t group_size, ck_int4_mode_t mode,
                                  int gate_up, uint8_t* w_prepacked, void* scales_prepacked,
                                  uint8_t* zeros_prepacked, ck_stream_t stream);

/* The whole layer's arguments (see the convention at the top of this header). */
typedef struct ck_moe_params {
    size_t struct_size;          /* sizeof(ck_moe_params_t) */
    int64_t tokens;              /* T >= 1 */
    int64_t hidden;              /* H: a multiple of 32, at most 2^24 */
    int64_t intermediate;        /* I: a multiple of 32, at most 2^24 */
    int64_t experts;             /* E: 1 .. 1024 */
    int64_t top_k;               /* k: 1 .. min(E, 32) */
    ck_dtype_t dtype;            /* x, out, the scales: CK_DTYPE_FP16 or CK_DTYPE_BF16 */
    int64_t group_size;          /* 32, 64, 128 or CK_GROUP_ROW, both projections */
    ck_int4_mode_t mode;         /* both projections */
    const void* x;               /* [T, H] dtype, 16-byte aligned */
    /* Routing: either router_logits (then topk_ids and topk_weights are NULL and the layer
     * routes, as ck_moe_route) or topk_ids [T, k] int32 and topk_weights [T, k] float32 (then
     * router_logits is NULL). */
    const void* router_logits;   /* [T, E] router_dtype */
    ck_dtype_t router_dtype;     /* CK_DTYPE_FP32 (default), FP16 or BF16 */
    int32_t renormalize;         /* 1: renormalize the k weights (Mixtral); default 0 */
    const int32_t* topk_ids;
    const float* topk_weights;
    /* Weights from ck_moe_prepack; zeros NULL for CK_INT4_SYMMETRIC. 16-byte aligned. */
    const uint8_t* w13;          /* gate_up = 1, n = 2I, k = H */
    const void* w13_scales;
    const uint8_t* w13_zeros;
    const uint8_t* w2;           /* gate_up = 0, n = H, k = I */
    const void* w2_scales;
    const uint8_t* w2_zeros;
    ck_moe_activation_t activation;  /* default CK_MOE_SWIGLU */
    void* out;                   /* [T, H] dtype, 16-byte aligned; must not overlap x */
} ck_moe_params_t;

/* The workspace bytes ck_moe_forward needs for these parameters (it depends on T, H, I, E, k
 * and dtype only). Validates *params as ck_moe_forward does, pointers excepted. */
CK_API ck_status_t ck_moe_workspace_size(const ck_moe_params_t* params, size_t* bytes);

/* The whole layer: route (unless the caller gave ids and weights), group the T * k pairs by
 * expert, the gate+up GEMM with the activation fused (written once, rounded to dtype), the
 * down GEMM with the routing weight applied, and the combine. workspace: at least
 * ck_moe_workspace_size bytes, 256-byte aligned; its contents are scratch. Nothing is
 * allocated, nothing synchronizes and no host logic depends on the data, so the call can be
 * captured in a CUDA graph. Requires compute capability 8.0 or newer. The workspace must not
 * overlap x or out (CK_STATUS_INVALID_VALUE). T * k + min(E, T * k) * 15 must be at most
 * 65535 * 16 = 1048560 row slots (else CK_STATUS_UNSUPPORTED). The expert GEMMs' kernel is
 * chosen from the sizes: "stream" (weight streaming) up to 16 rows per expert on average,
 * ceil(T k / min(E, T k)); "tc" (mma.sync tiles) above; "wgmma" (Hopper, compute capability
 * 9.0) above 64, in blocks of 128 rows up to 128 rows per expert and beyond in blocks of 256
 * with one block of 128 for an expert's last 1 ... 128 rows. The
 * environment variable CK_MOE_KERNEL (auto, wgmma, tc, stream) forces one, as
 * CK_GEMM_W4A16_KERNEL does. */
CK_API ck_status_t ck_moe_forward(const ck_moe_params_t* params, void* workspace,
                                  size_t workspace_bytes, ck_stream_t stream);

/* ---------------------------------------------------------------------------------------------
 * Attention (prefill, fp16/bf16: FlashAttention-3's structure on Hopper, FlashAttention-2's
 * algorithm on mma.sync elsewhere)
 *
 * For each sequence b, query head h and query i of the sequence (Sq queries, Sk keys), over the
 * keys j the query sees:
 *   x_j = scale * q_i . k_j   (kv head h / (Hq / Hkv): grouped-query attention; Hkv = 1 is MQA)
 *   O_i = sum_j exp(x_j - m) v_j / sum_j exp(x_j - m),  lse_i = m + ln(sum_j exp(x_j - m)),
 * m = max_j x_j. Non-causal: query i sees every key of its sequence. Causal: query i sees key j
 * iff j <= i + Sk - Sq (the diagonal ends at the bottom right, as FlashAttention >= 2.1: the
 * queries are the last Sq positions of the sequence). A query that sees no key (Sk = 0, or
 * causal with i < Sq - Sk) gets O = 0 and lse = -inf exactly. tests/reference.py
 * (attention_forward_f64) is the executable spec; the kernels compute x and the softmax in
 * float32 with an online (running max) softmax over blocks of 64 ("mma") or 128 ("wgmma") keys,
 * round the weights p to the dtype before p v (float32 sums), and meet attention_error_bound
 * (block_n = 64, which bounds both).
 *
 * Kernels: "wgmma" (compute capability 9.0 with the library's sm_90a code, and total_k >= 1:
 * TMA, warpgroup MMAs, a producer warpgroup feeding two consumer warpgroups, 128 x 128 tiles)
 * where it serves, "mma" (mma.sync, compute capability 8.0+) for every other call. The
 * environment variable CK_ATTENTION_KERNEL (auto, wgmma, mma) forces one, as
 * CK_GEMM_W4A16_KERNEL does.
 *
 * Layout: q [total_q, Hq, D], k and v [total_k, Hkv, D], out like q, contiguous (element
 * (t, h, d) at (t * H + h) * D + d); lse [total_q, Hq] float32, token-major like out. A batch is
 * packed along the token axis: sequence b holds query tokens cu_seqlens_q[b] ..
 * cu_seqlens_q[b + 1] - 1 and key tokens cu_seqlens_k[b] .. cu_seqlens_k[b + 1] - 1, and may be
 * empty. Without cu_seqlens the call is one sequence of total_q queries and total_k keys.
 *
 * Device-side offsets: cu_seqlens are read by the kernel, not the host. The caller promises
 * 0 = cu[0] <= cu[1] <= ... <= cu[batch] = total and cu_q[b + 1] - cu_q[b] <= max_seqlen_q.
 * Broken promises never cause an access out of bounds: each offset is clamped to [0, total]
 * (and an end to [start, total]), and query rows of a sequence at or past max_seqlen_q are
 * neither computed nor written; the values written for such a sequence are unspecified.
 * ------------------------------------------------------------------------------------------- */

/* The arguments of ck_attention_forward (see the convention at the top of this header). */
typedef struct ck_attention_params {
    size_t struct_size;          /* sizeof(ck_attention_params_t) */
    ck_dtype_t dtype;            /* q, k, v, out: CK_DTYPE_FP16 or CK_DTYPE_BF16 */
    const void* q;               /* [total_q, Hq, D], 16-byte aligned */
    const void* k;               /* [total_k, Hkv, D], 16-byte aligned */
    const void* v;               /* [total_k, Hkv, D], 16-byte aligned */
    void* out;                   /* [total_q, Hq, D], 16-byte aligned; must not overlap q, k, v */
    float* lse;                  /* [total_q, Hq] float32, 4-byte aligned; NULL: not written */
    int64_t total_q;             /* query tokens of the batch: 1 .. 2^31 - 1 */
    int64_t total_k;             /* key tokens of the batch: 0 .. 2^31 - 1 */
    int64_t num_heads_q;         /* Hq: 1 .. 65535, a multiple of num_heads_kv */
    int64_t num_heads_kv;        /* Hkv >= 1 */
    int64_t head_dim;            /* D: 64 or 128 */
    /* Sequences: batch and the int32 offsets cu_seqlens_q, cu_seqlens_k [batch + 1] (device
     * memory, 4-byte aligned), both given or both NULL (one sequence: batch 0 or 1). */
    int64_t batch;               /* 1 .. 65535 with offsets */
    const int32_t* cu_seqlens_q;
    const int32_t* cu_seqlens_k;
    /* The longest sequence's query (key) count: 1 .. total_q (0 .. total_k); 0 means total_q
     * (total_k). The grid covers max_seqlen_q queries per sequence; max_seqlen_k is a declared
     * bound that this kernel does not need (key offsets are clamped to total_k). Without
     * offsets both are checked against the totals and otherwise unused: the one sequence is
     * total_q queries and total_k keys. */
    int64_t max_seqlen_q;
    int64_t max_seqlen_k;
    /* The scale of q.k inside the softmax, a finite float32; 0 (the default) means
     * 1 / sqrt(D) rounded to float32. A scale of exactly zero (uniform weights) is therefore
     * not expressible: pass a tiny one. */
    float softmax_scale;
    int32_t causal;              /* 1: causal, bottom-right aligned; 0 (default): none */
} ck_attention_params_t;

/* Prefill attention (above). Requirements: struct_size known; dtype fp16 or bf16; D = 64 or
 * 128 (CK_STATUS_UNSUPPORTED for the reference's other head dims, 96 and 256); Hq % Hkv == 0;
 * the sizes in the struct's ranges (CK_STATUS_INVALID_VALUE otherwise); q, k, v and out
 * 16-byte aligned, lse and the offsets 4-byte aligned (CK_STATUS_MISALIGNED); out and lse must
 * not overlap q, k, v or each other (overlaps that the host sees: CK_STATUS_INVALID_VALUE).
 * Requires compute capability 8.0 or newer (CK_STATUS_UNSUPPORTED before). Writes out's rows
 * of the queries it computes and, when lse is given, their lse; nothing else. Nothing is
 * allocated or synchronized and the host never reads the offsets, so the call can be captured
 * in a CUDA graph. Results do not depend on thread timing. */
CK_API ck_status_t ck_attention_forward(const ck_attention_params_t* params, ck_stream_t stream);

/* ---------------------------------------------------------------------------------------------
 * Quantized KV cache: 8-bit keys and values with float32 scales, written by ck_kv_cache_append
 * and read by ck_attention_decode
 *
 * A cache row (one key, or one value, of one kv head at one position: D elements) holds D codes
 * and means codes x scale. Formats (ck_kv_format_t): CK_KV_DTYPE, the default, stores the
 * attention's fp16/bf16 values as they are; CK_KV_FP8_E4M3 stores E4M3 bytes, CK_KV_INT8 int8
 * codes: half the bytes of fp16, which halves decode's memory traffic. Scales
 * (ck_kv_scaling_t), float32:
 *   CK_KV_SCALE_PER_HEAD:  k_scale, v_scale [Hkv], the caller's (static: as calibrated, vLLM's
 *                          k_scale / v_scale per head); finite and > 0 (device data, not
 *                          checked).
 *   CK_KV_SCALE_PER_TOKEN: k_scale, v_scale [cache slots, Hkv] beside the cache, one per row,
 *                          written by ck_kv_cache_append from the row's values (dynamic).
 * A cache slot is a position's row of Hkv heads: slot b * max_seqlen_k + pos of a contiguous
 * cache [batch, max_seqlen_k, Hkv, D], slot page * page_size + pos % page_size of a paged one
 * [num_pages, page_size, Hkv, D]; per-token scales are [batch, max_seqlen_k, Hkv] or
 * [num_pages, page_size, Hkv] accordingly.
 * Quantization of a row x (float32 arithmetic, as ck_quantize_fp8 / ck_quantize_int8 with one
 * scale per row; tests/reference.py kv_cache_quantize is the spec):
 *   per token: scale = amax(|x|) / FMAX (FMAX = 448 for E4M3, 127 for int8); a zero scale (an
 *              all-zero row) becomes 1, and for E4M3 so does a subnormal one;
 *   codes:     E4M3 fp8(x * inv), int8 clamp(rint(x * inv), -127, 127), inv = 1 / scale
 *              (float32), fp8() rounding to nearest even and saturating (NaN gives 0x7F;
 *              int8: 0). A row holding +-inf gets an infinite per-token scale (its finite
 *              values then encode as +-0, its infinities as NaN, int8: 0), as the quantizers'
 *              rows do.
 * ck_attention_decode reads a NaN code (E4M3 0x7F / 0xFF, written only for NaN inputs) as NaN
 * with an fp16 dtype and as an unspecified value with bf16.
 * ------------------------------------------------------------------------------------------- */

/* What a KV cache holds. */
typedef enum ck_kv_format {
    CK_KV_DTYPE = 0,     /* the attention's dtype (fp16 or bf16), 2 bytes per element */
    CK_KV_FP8_E4M3 = 1,  /* FP8 E4M3 bytes (CK_FP8_E4M3) times a scale */
    CK_KV_INT8 = 2       /* int8 codes in [-127, 127] times a scale */
} ck_kv_format_t;

/* The scales of a quantized KV cache (above). */
typedef enum ck_kv_scaling {
    CK_KV_SCALE_PER_HEAD = 0,  /* k_scale, v_scale [Hkv], static */
    CK_KV_SCALE_PER_TOKEN = 1  /* k_scale, v_scale [slots, Hkv], one per cache row, dynamic */
} ck_kv_scaling_t;

/* The arguments of ck_kv_cache_append (see the convention at the top of this header). */
typedef struct ck_kv_cache_append_params {
    size_t struct_size;          /* sizeof(ck_kv_cache_append_params_t) */
    ck_dtype_t dtype;            /* k and v: CK_DTYPE_FP16 or CK_DTYPE_BF16 */
    ck_kv_format_t kv_format;    /* the cache's (above); CK_KV_DTYPE copies the values */
    ck_kv_scaling_t kv_scaling;  /* quantized formats: per head or per token (else not read) */
    const void* k;               /* [num_tokens, Hkv, D] of dtype, 16-byte aligned */
    const void* v;               /* [num_tokens, Hkv, D] of dtype, 16-byte aligned */
    const int64_t* slot_mapping; /* [num_tokens] int64 device memory, 8-byte aligned: the cache
                                    slot token i goes to; outside [0, num_slots): skipped (a
                                    padding token), as vLLM's reshape_and_cache does with -1 */
    void* k_cache;               /* [num_slots, Hkv, D] of the format, 16-byte aligned */
    void* v_cache;               /* like k_cache */
    float* k_scale;              /* quantized formats, 4-byte aligned: per head, [Hkv] (read);
                                    per token, [num_slots, Hkv] (the slots' rows written) */
    float* v_scale;              /* like k_scale */
    int64_t num_tokens;          /* 1 .. 2^31 - 1 */
    int64_t num_heads_kv;        /* Hkv: 1 .. 65535 */
    int64_t head_dim;            /* D: 64 or 128 */
    int64_t num_slots;           /* the cache's slots (rows of Hkv heads): >= 1, the cache's
                                    bytes within int64_t */
} ck_kv_cache_append_params_t;

/* Writes the keys and values of num_tokens new positions into a KV cache: for every token i
 * whose slot = slot_mapping[i] lies in [0, num_slots), k_cache[slot] and v_cache[slot] (all Hkv
 * heads) get k[i] and v[i], copied (CK_KV_DTYPE) or quantized row by row as above, and with
 * per-token scales k_scale[slot] and v_scale[slot] get the rows' scales. Nothing else is
 * written; two tokens of one slot leave either's row (unspecified which). Requirements:
 * struct_size known; dtype fp16 or bf16; kv_format and (quantized) kv_scaling values of their
 * enums; pointers non-NULL (the scales only for quantized formats); the sizes in their ranges,
 * head_dim >= 1 (CK_STATUS_INVALID_VALUE for all of these); D = 64 or 128
 * (CK_STATUS_UNSUPPORTED for others); pointers aligned as above (CK_STATUS_MISALIGNED); what is
 * written (k_cache, v_cache and per-token scales) must not overlap any other buffer of the
 * call (overlaps the host sees: CK_STATUS_INVALID_VALUE), slot_mapping included (not
 * checked). Requires compute capability 8.0 or newer (CK_STATUS_UNSUPPORTED before). The host
 * never reads slot_mapping: the call can be captured in a CUDA graph (a decode step's append
 * before its ck_attention_decode, on the same stream). */
CK_API ck_status_t ck_kv_cache_append(const ck_kv_cache_append_params_t* params,
                                      ck_stream_t stream);

/* ---------------------------------------------------------------------------------------------
 * Attention decode over a KV cache (fp16/bf16, split-KV "flash-decoding" on mma.sync)
 *
 * Each sequence b has Sq_new = seqlen_q new tokens (1 .. 16), the LAST Sq_new positions of the
 * sequence, whose keys and values are already in the cache, and L_b = seqlens_k[b] keys. New
 * token t (position L_b - Sq_new + t) and query head h see the keys at positions
 * 0 .. L_b - Sq_new + t (causal within the new tokens), with kv head h / (Hq / Hkv):
 *   O = sum_j exp(x_j - m) v_j / sum_j exp(x_j - m),  lse = m + ln(sum_j exp(x_j - m)),
 * x_j = scale q . k_j, m = max_j x_j, as ck_attention_forward with causal = 1 (the decode is
 * that prefill of the new queries against the sequence's first L_b keys). A token that sees
 * no key (L_b = 0, or t < Sq_new - L_b) gets O = 0 and lse = -inf exactly.
 * tests/reference.py attention_decode_f64 is the executable spec; the kernel meets
 * attention_error_bound (block_n = 16, num_splits as below) on attention_decode_as_prefill's
 * arrays.
 *
 * Quantized cache (kv_format CK_KV_FP8_E4M3 or CK_KV_INT8; see "Quantized KV cache"): k_j and
 * v_j are the rows' codes x their scales, exactly. The kernel converts the codes to the dtype
 * (exact: every E4M3 value and int8 code is an fp16 and a bf16 value), multiplies key j's
 * float32 sums q . codes by its scale, and each softmax weight p_j by value j's scale before p
 * is rounded to the dtype for P V (tests/reference.py attention_error_bound with v_scales).
 * The cache's bytes are half those of fp16, which is what a memory-bound decode saves.
 *
 * Layouts (row-major and densely packed; no other strides are accepted):
 *   q, out    [batch, seqlen_q, Hq, D]; lse [batch, seqlen_q, Hq] float32.
 *   contiguous cache (block_table NULL): k_cache, v_cache [batch, max_seqlen_k, Hkv, D];
 *             sequence b's key j is k_cache[b, j].
 *   paged cache: k_cache, v_cache [num_pages, page_size, Hkv, D] and block_table int32
 *             [batch, max_blocks_per_seq]: key j of sequence b is
 *             k_cache[block_table[b, j / page_size], j % page_size].
 *   Elements of the cache: 2 bytes (CK_KV_DTYPE) or 1 (quantized); per-token scales follow
 *             the cache's first three dimensions.
 *
 * Device-side lengths: seqlens_k int32 [batch] is read by the kernel, never by the host. The
 * caller promises 0 <= seqlens_k[b] <= max_seqlen_k and, when paged, that the entries of the
 * ceil(seqlens_k[b] / page_size) pages a sequence uses lie in [0, num_pages). Broken promises
 * never cause an access out of bounds: a length is clamped to [0, max_seqlen_k] (the call then
 * computes the clamped sequence), and a page id is clamped to [0, num_pages - 1] (the values
 * written are then unspecified). Nothing at or past a sequence's (clamped) length is read,
 * neither the cache nor the block table entries past its pages.
 *
 * Split-KV: each sequence's keys are dealt to num_splits splits in whole blocks of 64 keys
 * (tests/reference.py attention_split_bounds(L_b, num_splits, 64)); each split writes its
 * normalized float32 O_s and lse_s into the workspace, and a combine kernel merges them
 * (attention_combine) into O and lse. With one split O and lse are written directly and no
 * workspace is needed. num_splits is chosen on the host from the declared sizes alone (not the
 * device's lengths, nor the GPU, so the workspace size is known without a device and results do
 * not depend on the GPU): with R = (Hq / Hkv) * seqlen_q rows per kv head,
 *   row_groups = ceil(R / w), w = 16 (R <= 16), 32 (R <= 32) or 64,
 *   ctas       = batch * Hkv * row_groups,
 *   n          = ceil(max_seqlen_k / 64)        (key blocks of the longest sequence),
 *   per(s)     = ceil(n / s)                    (blocks of a split of s),
 *   cost(s)    = ceil(ctas * ceil(n / per(s)) / 264) * per(s),
 *   most       = 64 for a quantized cache, else 16,
 *   min_keys   = 256 for a quantized cache, else 128,
 *   num_splits = the s in 1 .. min(most, ceil(max_seqlen_k / min_keys)) of the least cost,
 *                the smallest among equals
 * (waves of 264 CTAs, two per SM of the 132-SM H100 the library is tuned on, times the blocks
 * each CTA streams; each split at least min_keys keys; at most 16 since a grid of one CTA per SM
 * runs a deeper pipeline, but for a quantized cache, whose conversion two CTAs per SM hide),
 * unless params->num_splits forces a count (1 .. 64). Workspace
 * (num_splits > 1), with rows = num_splits * batch * seqlen_q * Hq:
 *   float32 O_s [num_splits, batch, seqlen_q, Hq, D] at byte 0 (rows * D * 4 bytes, rounded up
 *   to a multiple of 256), then float32 lse_s [num_splits, batch, seqlen_q, Hq] (rows * 4
 *   bytes, rounded up to 256); an empty split (or one wholly after a token) has lse_s = -inf and
 *   O_s = 0. Bytes = 0 for one split.
 * ------------------------------------------------------------------------------------------- */

/* The arguments of ck_attention_decode (see the convention at the top of this header). */
typedef struct ck_attention_decode_params {
    size_t struct_size;          /* sizeof(ck_attention_decode_params_t) */
    ck_dtype_t dtype;            /* q, the cache, out: CK_DTYPE_FP16 or CK_DTYPE_BF16 */
    const void* q;               /* [batch, seqlen_q, Hq, D], 16-byte aligned */
    const void* k_cache;         /* contiguous or paged (above), 16-byte aligned */
    const void* v_cache;         /* like k_cache, 16-byte aligned */
    const int32_t* seqlens_k;    /* [batch] int32 device memory, 4-byte aligned */
    const int32_t* block_table;  /* [batch, max_blocks_per_seq] int32, 4-byte aligned; NULL:
                                    the cache is contiguous */
    void* out;                   /* [batch, seqlen_q, Hq, D], 16-byte aligned; must not overlap
                                    q, k_cache, v_cache */
    float* lse;                  /* [batch, seqlen_q, Hq] float32, 4-byte aligned; NULL: not
                                    written; must not overlap q, k_cache, v_cache or out */
    int64_t batch;               /* 1 .. 65535 */
    int64_t seqlen_q;            /* Sq_new, new tokens per sequence: 1 .. 16 */
    int64_t num_heads_q;         /* Hq: 1 .. 65535, a multiple of num_heads_kv */
    int64_t num_heads_kv;        /* Hkv >= 1 */
    int64_t head_dim;            /* D: 64 or 128 */
    /* The declared longest sequence, 1 .. 2^30: contiguous, also the cache's second dimension;
     * paged, at most max_blocks_per_seq * page_size. Lengths are clamped to it. */
    int64_t max_seqlen_k;
    /* Paged cache only (read only when block_table is given): */
    int64_t num_pages;           /* pages in k_cache and v_cache: 1 .. 2^31 - 1 */
    int64_t page_size;           /* keys per page: a power of two, 1 .. 65536 */
    int64_t max_blocks_per_seq;  /* block_table's second dimension: 1 .. 2^31 - 1 */
    /* The scale of q.k inside the softmax, a finite float32; 0 (the default) means 1 / sqrt(D)
     * rounded to float32, as ck_attention_forward. */
    float softmax_scale;
    /* 0 (default): the rule above; 1 .. 64: exactly that many splits (some may be empty). */
    int32_t num_splits;
    /* Appended in version 2 (a struct_size of the first version, which ends at num_splits, gives
     * these their defaults): a quantized cache (see "Quantized KV cache" above). */
    ck_kv_format_t kv_format;    /* 0 (default): k_cache and v_cache hold `dtype` values */
    ck_kv_scaling_t kv_scaling;  /* quantized formats: per head or per token */
    const float* k_scale;        /* quantized formats, 4-byte aligned: [Hkv] per head; per
                                    token [batch, max_seqlen_k, Hkv] or [num_pages, page_size,
                                    Hkv], like the cache's rows */
    const float* v_scale;        /* like k_scale */
} ck_attention_decode_params_t;

/* The workspace bytes ck_attention_decode needs for these parameters (the formula above; 0 for
 * one split). Validates *params as ck_attention_decode does, pointers excepted. Needs no GPU. */
CK_API ck_status_t ck_attention_decode_workspace_size(const ck_attention_decode_params_t* params,
                                                      size_t* bytes);

/* Decode attention (above). Requirements: struct_size known; dtype fp16 or bf16; D = 64 or 128
 * (CK_STATUS_UNSUPPORTED for other head dims); Hq % Hkv == 0; seqlen_q 1 .. 16; the sizes in
 * the struct's ranges, page_size a power of two, max_seqlen_k <= max_blocks_per_seq * page_size
 * when paged, and the byte count of every operand (cache, pages, block table) representable in
 * int64_t (CK_STATUS_INVALID_VALUE otherwise); kv_format and (quantized) kv_scaling values of
 * their enums, and with a quantized cache k_scale and v_scale non-NULL
 * (CK_STATUS_INVALID_VALUE); q, k_cache, v_cache and out 16-byte aligned; lse, seqlens_k,
 * block_table and the scales 4-byte aligned (CK_STATUS_MISALIGNED); out and lse must not
 * overlap q, the cache, the scales or each other (CK_STATUS_INVALID_VALUE for the overlaps the
 * host sees; seqlens_k and block_table are not checked but must not overlap an output either).
 * workspace: with num_splits > 1, at least ck_attention_decode_workspace_size bytes (else
 * CK_STATUS_INVALID_VALUE), 256-byte aligned (CK_STATUS_MISALIGNED), not overlapping q, the
 * cache, out, lse or the scales (CK_STATUS_INVALID_VALUE); with one split it is not used and
 * may be NULL.
 * Requires compute capability 8.0 or newer (CK_STATUS_UNSUPPORTED before). Writes out and,
 * when given, lse, and the workspace's partials; nothing else. Nothing is allocated or
 * synchronized and the host never reads seqlens_k or block_table, so the call can be captured
 * in a CUDA graph. Results do not depend on thread timing; a paged and a contiguous cache that
 * hold the same keys give the same bits for the same num_splits. */
CK_API ck_status_t ck_attention_decode(const ck_attention_decode_params_t* params,
                                       void* workspace, size_t workspace_bytes,
                                       ck_stream_t stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CUDA_KERNELS_H */
