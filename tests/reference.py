"""NumPy references of the quantization formats and matrix products of libcuda_kernels.so: the
executable spec.

Quantization: each function implements the words of the top comment of cuda_kernels.h
literally: float32 arithmetic, round-half-to-even (np.rint), saturation at the type's range, NaN
encoded as 0 and ignored by absmax/min/max. The GPU kernels must match these references bit for
bit, so every intermediate here is a float32 operation that a CUDA kernel performs the same way
(no float64, no fused multiply-add, no reciprocal approximations).

Matrix products (gemm_int8, gemm_int8_scaled, linear; the GEMM section of cuda_kernels.h): the
int32 product is exact and bitwise. The float results are computed exactly (float64) and rounded
once: the ideal that the library's float32 arithmetic approaches within the tolerances the tests
derive (the *_f64 functions give the values before that rounding).

Attention (prefill, split-KV decode over a contiguous or paged KV cache; the last section): the
float64 values, rounded once, and attention_error_bound, the bound a float32 kernel with its
probabilities rounded to the input dtype must stay within.

Dtypes are named 'fp32', 'fp16' and 'bf16'. NumPy holds them as float32, float16 and uint16 (the
bfloat16 bit pattern; NumPy has no bfloat16): that is their "representation" below.
Matrices are 2-D [rows, cols], row-major.

Everything is vectorized (no Python loop over elements), fast enough for 4096 x 4096 inputs.
"""

import numpy as np

DTYPES = ("fp32", "fp16", "bf16")
NUMPY_DTYPE = {"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16}
F32_ROUNDOFF = 2.0**-24   # the unit roundoff of float32 (the error bounds below)

GRANULARITIES = ("tensor", "row")
INT8_QMAX = 127

INT4_MODES = ("sym", "asym")
GROUP_ROW = -1
INT4_GROUP_SIZES = (32, 64, 128, GROUP_ROW)
INT4_SYM_RANGE = (-8, 7)
INT4_ASYM_RANGE = (0, 15)
INT4_SYM_DIVISOR = 7  # scale = absmax / 7
INT4_ASYM_DIVISOR = 15  # scale = (hi - lo) / 15

_F32_ONE = np.float32(1)


# ---------------------------------------------------------------------------------------------
# Floating-point representations
# ---------------------------------------------------------------------------------------------
def f32_to_bf16_bits(x):
    """Rounds float32 values to bfloat16, round-to-nearest-even; returns the uint16 bit patterns.

    Infinities stay infinite, finite values past the bfloat16 range round to infinity, and NaN
    stays NaN (sign and top payload bits kept, quiet bit set).
    """
    x = np.asarray(x, dtype=np.float32)
    # Work on a 1-D view: uint32 arithmetic that wraps (only NaN patterns do) is silent on arrays.
    bits = x.reshape(-1).view(np.uint32)
    # Adding 0x7FFF plus the lowest kept bit, then truncating, rounds half to even.
    rounding_bias = np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))
    rounded = ((bits + rounding_bias) >> 16).astype(np.uint16)
    quiet_nan = ((bits >> 16) | np.uint32(0x0040)).astype(np.uint16)
    return np.where(np.isnan(x.reshape(-1)), quiet_nan, rounded).reshape(x.shape)


def bf16_bits_to_f32(u16):
    """bfloat16 bit patterns (uint16) -> float32 values (exact)."""
    u16 = _require_dtype(np.asarray(u16), np.uint16, "bf16 bits")
    return (u16.astype(np.uint32) << 16).view(np.float32)


def to_dtype(x_f32, dtype):
    """float32 values -> the NumPy representation of `dtype`, rounding to nearest even."""
    x_f32 = np.asarray(x_f32, dtype=np.float32)
    if dtype == "fp32":
        return x_f32.copy()
    if dtype == "fp16":
        with np.errstate(over="ignore"):  # past 65504 rounds to inf, as the GPU conversion does
            return x_f32.astype(np.float16)
    if dtype == "bf16":
        return f32_to_bf16_bits(x_f32)
    raise ValueError(f"unknown dtype {dtype!r} (use one of {DTYPES})")


def to_f32(arr, dtype):
    """An array in the NumPy representation of `dtype` -> its float32 values (exact)."""
    arr = _require_dtype(np.asarray(arr), _numpy_dtype(dtype), f"{dtype} array")
    if dtype == "bf16":
        return bf16_bits_to_f32(arr)
    return arr.astype(np.float32)


def random_input(rng, shape, dtype, scale=1.0, zero_rows=()):
    """Random [rows, cols] values representable in `dtype` (float32 rounded by to_dtype).

    Standard normal values times `scale`, shaped like LLM activations and weights:
      - about one row in four is scaled by 10**U(-3, 2), so row magnitudes differ widely and
        per-tensor and per-row scales disagree;
      - about one column in 500 is a 20x outlier channel;
      - about one row in eight is all >= 0 and one in eight all <= 0 (the asymmetric INT4
        range then starts or ends at 0).
    Rows listed in `zero_rows` are exactly zero (not the default).
    """
    rows, cols = shape
    x = rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(scale)
    x *= np.where(rng.random(cols) < 0.002, np.float32(20), _F32_ONE)
    row_scale = np.where(rng.random(rows) < 0.25, 10.0 ** rng.uniform(-3, 2, rows), 1.0)
    x *= row_scale.astype(np.float32)[:, None]
    sign_choice = rng.random(rows)
    x[sign_choice < 0.125] = np.abs(x[sign_choice < 0.125])
    x[sign_choice > 0.875] = -np.abs(x[sign_choice > 0.875])
    x[list(zero_rows)] = 0
    return to_dtype(x, dtype)


# ---------------------------------------------------------------------------------------------
# Packed INT4
# ---------------------------------------------------------------------------------------------
def pack_int4(q, signed):
    """int codes [rows, cols] -> packed uint8 [rows, (cols + 1) // 2].

    Element 2i goes in the low nibble of byte i, element 2i+1 in the high nibble; signed codes
    ([-8, 7]) as 4-bit two's complement, unsigned codes in [0, 15]. When cols is odd the last
    high nibble is 0.
    """
    q = np.asarray(q)
    rows, cols = q.shape
    lo, hi = INT4_SYM_RANGE if signed else INT4_ASYM_RANGE
    if q.size and (q.min() < lo or q.max() > hi):
        raise ValueError(f"int4 codes must lie in [{lo}, {hi}] (signed={signed})")
    nibbles = np.zeros((rows, cols + cols % 2), dtype=np.uint8)
    nibbles[:, :cols] = q.astype(np.int16) & 0xF
    return nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)


def unpack_int4(packed, cols, signed):
    """packed uint8 [rows, (cols + 1) // 2] -> int8 codes [rows, cols] (inverse of pack_int4)."""
    packed = _require_dtype(np.asarray(packed), np.uint8, "packed int4")
    rows, nbytes = packed.shape
    if nbytes != (cols + 1) // 2:
        raise ValueError(f"{cols} columns pack into {(cols + 1) // 2} bytes per row, not {nbytes}")
    nibbles = np.empty((rows, 2 * nbytes), dtype=np.int8)
    nibbles[:, 0::2] = packed & 0xF
    nibbles[:, 1::2] = packed >> 4
    q = nibbles[:, :cols]
    if signed:
        q = np.where(q >= 8, q - 16, q)
    return np.ascontiguousarray(q, dtype=np.int8)


def int4_groups_per_row(cols, group_size):
    """Groups in one row: ceil(cols / group_size), or 1 for group_size == -1 (the whole row)."""
    if group_size == GROUP_ROW:
        return 1
    if group_size <= 0:
        raise ValueError(f"group_size={group_size} must be positive or {GROUP_ROW}")
    return -(-cols // group_size)


# ---------------------------------------------------------------------------------------------
# INT8 symmetric, [-127, 127]
# ---------------------------------------------------------------------------------------------
def quantize_int8(x, dtype, granularity, scales=None):
    """x [rows, cols] in `dtype`'s representation -> (q int8 [rows, cols], scales float32).

    granularity 'tensor' (scales shape (1,)) or 'row' (scales shape (rows,)).
    Dynamic (scales None): scale = absmax / 127 in float32, absmax ignoring NaN; a zero scale
    becomes 1. Static: `scales` (float32, finite, > 0) are used as given and returned.
    Encoding: inv = 1 / scale (float32), q = clamp(rint(x * inv), -127, 127), NaN -> 0.
    """
    xf = _matrix(to_f32(x, dtype))
    rows = xf.shape[0]
    n_scales = _int8_scale_count(granularity, rows)
    if scales is None:
        axis = None if granularity == "tensor" else 1
        absmax = np.max(np.abs(_nan_to_zero(xf)), axis=axis).reshape(n_scales)
        scales = absmax / np.float32(INT8_QMAX)
        scales[scales == 0] = _F32_ONE
    else:
        scales = _require_dtype(np.asarray(scales), np.float32, "int8 scales").reshape(-1).copy()
        _check_scale_count(scales, granularity, n_scales)
    inv = _F32_ONE / scales
    q = _encode(xf * inv[:, None], -INT8_QMAX, INT8_QMAX).astype(np.int8)
    return q, scales


def dequantize_int8(q, scales, granularity, out_dtype):
    """q int8 [rows, cols], float32 scales -> (float)q * scale in float32, rounded to out_dtype."""
    q = _matrix(_require_dtype(np.asarray(q), np.int8, "int8 codes"))
    scales = _require_dtype(np.asarray(scales), np.float32, "int8 scales").reshape(-1)
    _check_scale_count(scales, granularity, _int8_scale_count(granularity, q.shape[0]))
    return to_dtype(q.astype(np.float32) * scales[:, None], out_dtype)


# ---------------------------------------------------------------------------------------------
# FP8 (E4M3, E5M2), one float32 scale per tensor, row, 1 x 128 block or 128 x 128 tile
# ---------------------------------------------------------------------------------------------
FP8_GRANULARITIES = ("tensor", "row", "block1x128", "block128x128")
FP8_BLOCK = 128
FP8_MIN_SCALE = np.float32(2.0**-126)  # computed scales below it (0 included) become 1


def fp8_scale_shape(rows, cols, granularity):
    """The shape of the scales of a [rows, cols] FP8 tensor: (1,) per tensor, (rows,) per row,
    (rows, ceil(cols / 128)) per 1 x 128 block, (ceil(rows / 128), ceil(cols / 128)) per
    128 x 128 tile (partial blocks at the ends)."""
    blocks_r, blocks_c = -(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK)
    shapes = {"tensor": (1,), "row": (rows,), "block1x128": (rows, blocks_c),
              "block128x128": (blocks_r, blocks_c)}
    try:
        return shapes[granularity]
    except KeyError:
        raise ValueError(f"unknown FP8 granularity {granularity!r} (use one of "
                         f"{FP8_GRANULARITIES})") from None


def _fp8_scale_index(rows, cols, granularity):
    """(row index, column index) into the scales, as 2-D, of every element: scales2d[ri, ci]."""
    r, c = np.arange(rows)[:, None], np.arange(cols)[None, :]
    zero_r, zero_c = np.zeros_like(r), np.zeros_like(c)
    return {"tensor": (zero_r, zero_c), "row": (r, zero_c), "block1x128": (r, c // FP8_BLOCK),
            "block128x128": (r // FP8_BLOCK, c // FP8_BLOCK)}[granularity]


def _fp8_scope_amax(absx, granularity):
    """max over each scale's scope of absx [rows, cols] (no NaN), in the scales' shape."""
    rows, cols = absx.shape
    shape = fp8_scale_shape(rows, cols, granularity)
    if granularity == "tensor":
        return absx.max().reshape(shape)
    if granularity == "row":
        return absx.max(axis=1)
    # Zero padding to whole blocks changes no max of absolute values.
    pad_r = -rows % FP8_BLOCK if granularity == "block128x128" else 0
    padded = np.pad(absx, ((0, pad_r), (0, -cols % FP8_BLOCK)))
    block_r = FP8_BLOCK if granularity == "block128x128" else 1
    return padded.reshape(shape[0], block_r, shape[1], FP8_BLOCK).max(axis=(1, 3))


def quantize_fp8(x, dtype, fmt, granularity, scales=None):
    """x [rows, cols] in `dtype`'s representation -> (q uint8 [rows, cols] FP8 bytes of `fmt`,
    scales float32 of fp8_scale_shape).

    Dynamic (scales None): amax = max |x| over each scope (NaN ignored), scale = amax / FMAX in
    float32 (FMAX 448 for 'e4m3', 57344 for 'e5m2'); a zero scale (an all-zero or all-NaN
    scope) becomes 1, as INT8's does, and so does a subnormal one (< 2**-126), so that 1 / scale
    is finite. Static: `scales` (float32, finite, > 0, any shape of the right size) are used as
    given and returned in fp8_scale_shape.
    Encoding: inv = 1 / scale (float32), q = fp8_encode(x * inv) (float32 product; ties to even,
    saturating at +-FMAX, +-inf -> +-FMAX, NaN -> 0x7F). An infinite element makes its dynamic
    scale inf and inv 0: its scope's finite elements encode as +-0, its infinities as NaN.
    """
    xf = _matrix(to_f32(x, dtype))
    rows, cols = xf.shape
    shape = fp8_scale_shape(rows, cols, granularity)
    if scales is None:
        amax = _fp8_scope_amax(np.abs(_nan_to_zero(xf)), granularity)
        scales = (amax / np.float32(FP8_MAX[fmt])).astype(np.float32)
        scales[~(scales >= FP8_MIN_SCALE)] = _F32_ONE
    else:
        scales = _require_dtype(np.asarray(scales), np.float32, "fp8 scales")
        if scales.size != int(np.prod(shape)):
            raise ValueError(f"{granularity} granularity needs {int(np.prod(shape))} scales, "
                             f"got {scales.size}")
        scales = scales.reshape(shape).copy()
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv = _F32_ONE / scales
        ri, ci = _fp8_scale_index(rows, cols, granularity)
        y = xf * inv.reshape(len(inv), -1)[ri, ci]
    return fp8_encode(y, fmt), scales


def dequantize_fp8(q, scales, fmt, granularity, out_dtype):
    """q uint8 [rows, cols] FP8 bytes of `fmt`, float32 scales (fp8_scale_shape's count) ->
    fp8_decode(q) * scale in float32 (NaN codes give NaN, E5M2's infinities +-inf), rounded to
    out_dtype."""
    q = _matrix(_require_dtype(np.asarray(q), np.uint8, "fp8 codes"))
    rows, cols = q.shape
    shape = fp8_scale_shape(rows, cols, granularity)
    scales = _require_dtype(np.asarray(scales), np.float32, "fp8 scales")
    if scales.size != int(np.prod(shape)):
        raise ValueError(f"{granularity} granularity needs {int(np.prod(shape))} scales, got "
                         f"{scales.size}")
    scales2d = scales.reshape(shape[0], -1)
    ri, ci = _fp8_scale_index(rows, cols, granularity)
    with np.errstate(over="ignore", invalid="ignore"):
        return to_dtype(fp8_decode(q, fmt) * scales2d[ri, ci], out_dtype)


# ---------------------------------------------------------------------------------------------
# Packed INT4, group-wise along the row
# ---------------------------------------------------------------------------------------------
def quantize_int4(x, dtype, group_size, mode):
    """x [rows, cols] in `dtype`'s representation -> (packed, scales, zeros).

    group_size 32, 64, 128 or -1 (whole row); the last group of a row may be partial.
    Returns packed uint8 [rows, (cols + 1) // 2], scales [rows, groups] in `dtype`'s
    representation, and zeros uint8 [rows, groups] for mode 'asym' (None for 'sym').

    sym:  scale = absmax / 7 (float32, NaN ignored), stored in `dtype` (rounded to nearest even;
          a stored 0 becomes 1); inv = 1 / (float)stored; q = clamp(rint(x * inv), -8, 7).
    asym: lo = min(min(x), 0), hi = max(max(x), 0) (NaN ignored); scale = (hi - lo) / 15 in
          float32, stored as above; zero = clamp(rint(-lo * inv), 0, 15);
          q = clamp(rint(x * inv) + zero, 0, 15).
    NaN x: rint(x * inv) counts as 0, so the code is 0 (sym) or the zero point (asym).
    """
    if group_size not in INT4_GROUP_SIZES:
        raise ValueError(f"group_size={group_size} is not one of {INT4_GROUP_SIZES}")
    _check_mode(mode)
    xf = _matrix(to_f32(x, dtype))
    rows, cols = xf.shape
    width = cols if group_size == GROUP_ROW else group_size
    groups = int4_groups_per_row(cols, group_size)
    # Zero padding completes the last group without changing its absmax, min(., 0) or max(., 0).
    grouped = np.zeros((rows, groups * width), dtype=np.float32)
    grouped[:, :cols] = xf
    grouped = grouped.reshape(rows, groups, width)
    finite = _nan_to_zero(grouped)

    if mode == "sym":
        lo = hi = None
        scale_f32 = np.max(np.abs(finite), axis=2) / np.float32(INT4_SYM_DIVISOR)
    else:
        lo = np.minimum(np.min(finite, axis=2), np.float32(0))
        hi = np.maximum(np.max(finite, axis=2), np.float32(0))
        scale_f32 = (hi - lo) / np.float32(INT4_ASYM_DIVISOR)
    scales = to_dtype(scale_f32, dtype)
    scales[to_f32(scales, dtype) == 0] = to_dtype(_F32_ONE, dtype)
    inv = _F32_ONE / to_f32(scales, dtype)

    step = np.rint(grouped * inv[:, :, None])
    step[np.isnan(step)] = 0
    if mode == "sym":
        zeros = None
        q = np.clip(step, *INT4_SYM_RANGE)
    else:
        zero_f32 = np.clip(np.rint(-lo * inv), *INT4_ASYM_RANGE)
        zeros = zero_f32.astype(np.uint8)
        q = np.clip(step + zero_f32[:, :, None], *INT4_ASYM_RANGE)
    q = q.reshape(rows, groups * width)[:, :cols].astype(np.int8)
    return pack_int4(q, signed=(mode == "sym")), scales, zeros


def dequantize_int4(packed, scales, zeros, cols, group_size, mode, out_dtype):
    """packed int4 [rows, (cols + 1) // 2] -> values [rows, cols] in out_dtype's representation.

    scales [rows, groups] are in out_dtype's representation; zeros uint8 [rows, groups] for
    'asym', None for 'sym'. sym: (float)q * (float)scale; asym: (float)(q - zero) * (float)scale;
    the float32 product is rounded to out_dtype.
    """
    if group_size not in INT4_GROUP_SIZES:
        raise ValueError(f"group_size={group_size} is not one of {INT4_GROUP_SIZES}")
    _check_mode(mode)
    q = unpack_int4(packed, cols, signed=(mode == "sym")).astype(np.int16)
    rows = q.shape[0]
    groups = int4_groups_per_row(cols, group_size)
    scales_f32 = _matrix(to_f32(scales, out_dtype))
    if scales_f32.shape != (rows, groups):
        raise ValueError(f"scales must be [{rows}, {groups}], got {list(scales_f32.shape)}")
    group_of_col = np.arange(cols) // (cols if group_size == GROUP_ROW else group_size)
    if mode == "asym":
        zeros = _require_dtype(np.asarray(zeros), np.uint8, "int4 zeros")
        if zeros.shape != (rows, groups):
            raise ValueError(f"zeros must be [{rows}, {groups}], got {list(zeros.shape)}")
        q -= zeros[:, group_of_col]
    elif zeros is not None:
        raise ValueError("symmetric int4 has no zero points: pass zeros=None")
    return to_dtype(q.astype(np.float32) * scales_f32[:, group_of_col], out_dtype)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
def _numpy_dtype(dtype):
    try:
        return NUMPY_DTYPE[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r} (use one of {DTYPES})") from None


def _require_dtype(arr, np_dtype, what):
    if arr.dtype != np_dtype:
        raise TypeError(f"{what} must be {np.dtype(np_dtype).name}, got {arr.dtype.name}")
    return arr


def _matrix(arr):
    if arr.ndim != 2:
        raise ValueError(f"expected a 2-D [rows, cols] array, got shape {arr.shape}")
    return arr


def _check_mode(mode):
    if mode not in INT4_MODES:
        raise ValueError(f"unknown int4 mode {mode!r} (use one of {INT4_MODES})")


def _int8_scale_count(granularity, rows):
    if granularity not in GRANULARITIES:
        raise ValueError(f"unknown granularity {granularity!r} (use one of {GRANULARITIES})")
    return 1 if granularity == "tensor" else rows


def _check_scale_count(scales, granularity, n_scales):
    if scales.shape != (n_scales,):
        raise ValueError(f"{granularity} granularity needs {n_scales} scales, got {scales.size}")


def _nan_to_zero(a):
    """NaN -> 0: a neutral value for absmax, min(., 0) and max(., 0), which thus ignore NaN."""
    return np.where(np.isnan(a), np.float32(0), a)


def _encode(y, lo, hi):
    """clamp(rint(y), lo, hi) with NaN -> 0, in float32."""
    q = np.rint(y)
    q[np.isnan(q)] = 0
    return np.clip(q, lo, hi, out=q)


# ---------------------------------------------------------------------------------------------
# Matrix products (GEMM): out[M, N] = A[M, K] x B
# ---------------------------------------------------------------------------------------------
# B is [N, K] row-major ('nk', the nn.Linear weight: out = A B^T) or [K, N] row-major ('kn':
# out = A B). The references compute the exact mathematical result in float64 (or exactly in
# integers) and round once at the end: they are the ideal the kernels are measured against.
# Only the int32 product is bitwise; the float epilogues are compared with the tolerances that
# the float32 arithmetic the header describes can produce (see tests/test_gemm_gpu.py).
LAYOUTS = ("nk", "kn")
ACTIVATIONS = ("none", "relu")
GEMM_K_MULTIPLE = 16  # ck_gemm_int8*: K a multiple of 16 (and N too for 'kn')
INT8_PRODUCT_MAX = 128 * 128  # the largest |a * b| of two int8 values: (-128) * (-128)
# Below this K no int32 sum of int8 products can overflow: 131071 * 16384 < 2**31 - 1.
INT32_EXACT_K_MAX = (2**31 - 1) // INT8_PRODUCT_MAX


def weight_as_nk(b, layout):
    """b in `layout` ('nk': [N, K], 'kn': [K, N]) -> the [N, K] view of it."""
    b = _matrix(np.asarray(b))
    if layout == "nk":
        return b
    if layout == "kn":
        return b.T
    raise ValueError(f"unknown layout {layout!r} (use one of {LAYOUTS})")


def wrap_int32(x):
    """Integers (any int dtype) -> int32 modulo 2**32, two's complement, as int32 sums wrap."""
    x = np.asarray(x).astype(np.int64)
    return ((x + 2**31) % 2**32 - 2**31).astype(np.int32)


def int_matmul_exact(a, b_nk):
    """sum_k a[m, k] * b_nk[n, k] exactly, as int64, for small-integer matrices (int8 here).

    float64 BLAS is exact here and much faster than NumPy's integer matmul: every product and
    every partial sum is an integer of magnitude <= K * 16384, exactly representable as long as
    that stays below 2**53 (K < 2**39), whatever order or fused multiply-adds the BLAS uses.
    """
    a, b_nk = _matrix(np.asarray(a)), _matrix(np.asarray(b_nk))
    if a.shape[1] != b_nk.shape[1]:
        raise ValueError(f"K differs: a is {list(a.shape)}, b (as [N, K]) is {list(b_nk.shape)}")
    bound = _abs_max(a) * _abs_max(b_nk)  # of one product
    if a.shape[1] * bound < 2**53:
        return (a.astype(np.float64) @ b_nk.T.astype(np.float64)).astype(np.int64)
    return a.astype(np.int64) @ b_nk.T.astype(np.int64)


def _abs_max(x):
    """max |x| as a Python int (np.abs would wrap at the most negative value of the type)."""
    return max(-int(x.min()), int(x.max()), 0) if x.size else 0


def gemm_int8(a, b, layout="nk"):
    """ck_gemm_int8: int8 a [M, K], int8 b ([N, K] for 'nk', [K, N] for 'kn') -> int32 [M, N].

    c[m, n] = sum_k a[m, k] * b(k, n), computed exactly and wrapped modulo 2**32 like int32
    addition (only K > INT32_EXACT_K_MAX can wrap). Shape rules of the library (K a multiple of
    16, ...) are not checked here: the reference works for any K.
    """
    a = _matrix(_require_dtype(np.asarray(a), np.int8, "a"))
    b_nk = weight_as_nk(_require_dtype(np.asarray(b), np.int8, "b"), layout)
    return wrap_int32(int_matmul_exact(a, b_nk))


def activate(v, activation):
    """The epilogue's activation on float64 values: 'none' (or None) or 'relu' (max(v, 0))."""
    if activation in (None, "none"):
        return v
    if activation == "relu":
        return np.maximum(v, 0.0)
    raise ValueError(f"unknown activation {activation!r} (use one of {ACTIVATIONS})")


def scale_vector(scales, count, what):
    """float32 scales, 1 value (per tensor) or `count` values (one per row or column) ->
    float64 [count]."""
    scales = _require_dtype(np.asarray(scales), np.float32, what).reshape(-1)
    if scales.size not in (1, count):
        raise ValueError(f"{what} needs 1 or {count} values, got {scales.size}")
    return np.broadcast_to(scales.astype(np.float64), (count,))


def int8_epilogue_f64(acc, scale_a, scale_b, bias=None, activation="none", out_dtype="fp32"):
    """The fused epilogue of ck_gemm_int8_scaled in exact (float64) arithmetic, before rounding:

        act(acc[m, n] * scale_a[m or 0] * scale_b[n or 0] + bias[n])

    acc: int32 [M, N] (the product of gemm_int8); scale_a: float32, 1 or M values; scale_b:
    float32, 1 or N values (a single value is per tensor: with M == 1 or N == 1 both readings
    are the same numbers); bias: N values in out_dtype's representation, or None.
    float64 keeps acc * scale_a * scale_b within a relative 2**-52 of the exact value (and
    the sum with the bias within 2**-53), far below the float32 roundings the GPU makes.
    """
    acc = _matrix(_require_dtype(np.asarray(acc), np.int32, "acc"))
    return scaled_epilogue_f64(acc.astype(np.float64), scale_a, scale_b, bias, activation,
                               out_dtype)


def scaled_epilogue_f64(acc, scale_a, scale_b, bias=None, activation="none", out_dtype="fp32"):
    """The scaled epilogue of the INT8 and FP8 GEMMs on exact float64 sums acc [M, N] (see
    int8_epilogue_f64)."""
    rows, cols = acc.shape
    sa = scale_vector(scale_a, rows, "scale_a")
    sb = scale_vector(scale_b, cols, "scale_b")
    v = acc * sa[:, None] * sb[None, :]
    if bias is not None:
        bias = np.asarray(bias).reshape(-1)
        if bias.size != cols:
            raise ValueError(f"bias needs N={cols} values, got {bias.size}")
        v = v + to_f32(bias, out_dtype).astype(np.float64)[None, :]
    return activate(v, activation)


def gemm_int8_scaled_f64(a, b, layout, scale_a, scale_b, bias=None, activation="none",
                         out_dtype="fp32"):
    """The float64 values of ck_gemm_int8_scaled before the rounding to out_dtype."""
    return int8_epilogue_f64(gemm_int8(a, b, layout), scale_a, scale_b, bias, activation,
                             out_dtype)


def gemm_int8_scaled(a, b, layout, scale_a, scale_b, bias=None, activation="none",
                     out_dtype="fp32"):
    """ck_gemm_int8_scaled, ideally: the exact epilogue value rounded once to out_dtype.

    The library computes the epilogue in float32 (a few roundings: see int8_epilogue_f64 and
    the header), so its output is within a few float32 ulps of this, plus half an ulp of
    out_dtype; it is not bitwise equal.
    """
    return round_f64_to_dtype(
        gemm_int8_scaled_f64(a, b, layout, scale_a, scale_b, bias, activation, out_dtype),
        out_dtype)


def gemm_fp8(a, b):
    """ck_gemm_fp8_scaled's sums, exactly: acc[m, n] = sum_k e4m3(a[m, k]) e4m3(b[n, k]) as
    float64 [M, N], from FP8 E4M3 bit patterns a [M, K] and b [N, K] (uint8; NaN codes give NaN).

    Exact: a product of two E4M3 values has at most 8 significant bits and lies in [2^-18,
    448^2]; float64 holds every sum of up to 2^16 of them without rounding.
    """
    a = _matrix(_require_dtype(np.asarray(a), np.uint8, "a"))
    b = _matrix(_require_dtype(np.asarray(b), np.uint8, "b"))
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"K differs: a is {list(a.shape)}, b is {list(b.shape)} ([N, K])")
    if a.shape[1] > 2**16:
        raise ValueError("K > 2^16: float64 sums would no longer be exact")
    return e4m3_decode(a).astype(np.float64) @ e4m3_decode(b).astype(np.float64).T


def gemm_fp8_abs_sums(a, b):
    """sum_k |e4m3(a[m, k]) e4m3(b[n, k])| as float64 [M, N]: the scale of the accumulation
    error bound of ck_gemm_fp8_scaled."""
    return (np.abs(e4m3_decode(a).astype(np.float64))
            @ np.abs(e4m3_decode(b).astype(np.float64)).T)


def gemm_fp8_scaled_f64(a, b, scale_a, scale_b, bias=None, activation="none", out_dtype="fp32"):
    """The float64 values of ck_gemm_fp8_scaled before the rounding to out_dtype: the exact sums
    (gemm_fp8) through the scaled epilogue (scaled_epilogue_f64)."""
    return scaled_epilogue_f64(gemm_fp8(a, b), scale_a, scale_b, bias, activation, out_dtype)


def _fp8_block_terms(a, b, scale_a, scale_b):
    """(k-block products [kb, M, N] exact, their scales [kb, M, N]) of ck_gemm_fp8_scaled with
    block scales: scale_a [M, ceil(K / 128)], scale_b [ceil(N / 128), ceil(K / 128)]."""
    av = e4m3_decode(_matrix(a)).astype(np.float64)
    bv = e4m3_decode(_matrix(b)).astype(np.float64)
    (m, k), n = av.shape, bv.shape[0]
    blocks = -(-k // FP8_BLOCK)
    sa = np.asarray(scale_a, np.float32).reshape(m, blocks).astype(np.float64)
    sb = np.asarray(scale_b, np.float32).reshape(-(-n // FP8_BLOCK), blocks).astype(np.float64)
    col_block = np.arange(n) // FP8_BLOCK
    parts = np.stack([av[:, j * FP8_BLOCK:(j + 1) * FP8_BLOCK]
                      @ bv[:, j * FP8_BLOCK:(j + 1) * FP8_BLOCK].T for j in range(blocks)])
    abs_parts = np.stack([np.abs(av[:, j * FP8_BLOCK:(j + 1) * FP8_BLOCK])
                          @ np.abs(bv[:, j * FP8_BLOCK:(j + 1) * FP8_BLOCK]).T
                          for j in range(blocks)])
    scales = np.stack([sa[:, j][:, None] * sb[col_block, j][None, :] for j in range(blocks)])
    return parts, abs_parts, scales


def gemm_fp8_block_scaled_f64(a, b, scale_a, scale_b, bias=None, activation="none",
                              out_dtype="fp32"):
    """ck_gemm_fp8_scaled with block scales (DeepSeek-V3's 1 x 128 activation and 128 x 128
    weight scales) before the rounding to out_dtype, in float64:

        acc[m, n] = sum_kb (scale_a[m, kb] * scale_b[n // 128, kb]) * sum_{k in kb} a * b
        act(acc + bias)

    The k-block sums are exact (gemm_fp8); their scaled sum is within a relative 2^-50 or so.
    """
    parts, _, scales = _fp8_block_terms(a, b, scale_a, scale_b)
    return scaled_epilogue_f64((parts * scales).sum(axis=0), np.float32(1), np.float32(1), bias,
                               activation, out_dtype)


def gemm_fp8_block_abs_sums(a, b, scale_a, scale_b):
    """sum_kb |scale| sum_{k in kb} |a b|: the scale of the accumulation error bound of the
    block-scaled ck_gemm_fp8_scaled."""
    _, abs_parts, scales = _fp8_block_terms(a, b, scale_a, scale_b)
    return (abs_parts * np.abs(scales)).sum(axis=0)


# ---- W4A8: symmetric INT4 weights x FP8 E4M3 activations (ck_gemm_w4a8) ----------------------
W4A8_GROUP_SIZES = (128, GROUP_ROW)   # a group is one 128-wide k-block, or the whole row
W4A8_SCALE_DTYPES = ("fp16", "bf16")  # w_scales, as ck_quantize_int4 writes them
W4A8_K_MULTIPLE = 32                  # K >= 32 and a multiple of 32 (the library's rule)
W4A8_K_BLOCK = 128                    # the k-blocks whose sums are scaled


def _w4a8_blocks(a, w_packed, w_scales, group_size, scale_dtype):
    """Yields (exact sum_{k in kb} e4m3(a) q [M, N], sum_{k in kb} |e4m3(a) q| [M, N], the
    block's weight scales [N] as float64) for each 128-wide k-block kb of ck_gemm_w4a8.

    a: E4M3 bit patterns uint8 [M, K]; w_packed: uint8 [N, (K + 1) // 2], signed codes as
    pack_int4(q, signed=True) writes them; w_scales [N, groups] in scale_dtype's representation
    (None: inferred, float16 or uint16 bf16 bits), groups = 1 for GROUP_ROW, else
    ceil(K / 128) (the last block may be partial)."""
    if group_size not in W4A8_GROUP_SIZES:
        raise ValueError(f"group_size={group_size} is not one of {W4A8_GROUP_SIZES}")
    scale_dtype = scale_dtype or dtype_of(w_scales)
    if scale_dtype not in W4A8_SCALE_DTYPES:
        raise ValueError(f"ck_gemm_w4a8's scales are {W4A8_SCALE_DTYPES}, not {scale_dtype!r}")
    a = _matrix(_require_dtype(np.asarray(a), np.uint8, "a"))
    m, k = a.shape
    if k > 2**16:
        raise ValueError("K > 2^16: float64 block sums would no longer be exact")
    q = unpack_int4(_matrix(np.asarray(w_packed)), k, signed=True).astype(np.float64)
    n = q.shape[0]
    scales = _matrix(to_f32(np.asarray(w_scales), scale_dtype)).astype(np.float64)
    groups = int4_groups_per_row(k, group_size)
    if scales.shape != (n, groups):
        raise ValueError(f"w_scales must be [{n}, {groups}], got {list(scales.shape)}")
    av = e4m3_decode(a).astype(np.float64)
    for kb in range(-(-k // W4A8_K_BLOCK)):
        cols = slice(kb * W4A8_K_BLOCK, (kb + 1) * W4A8_K_BLOCK)
        group = 0 if group_size == GROUP_ROW else kb
        yield (av[:, cols] @ q[:, cols].T, np.abs(av[:, cols]) @ np.abs(q[:, cols]).T,
               scales[:, group])


def gemm_w4a8(a, w_packed, w_scales, group_size, scale_dtype=None):
    """ck_gemm_w4a8's sums as float64 [M, N]:

        acc[m, n] = sum_kb float(w_scales[n, g(kb)]) * sum_{k in kb} e4m3(a[m, k]) * q[n, k]

    over the 128-wide k-blocks kb (the last one partial when K is not a multiple of 128);
    g(kb) = kb for group_size 128, 0 for GROUP_ROW (-1). a: FP8 E4M3 bit patterns uint8 [M, K]
    (NaN codes give NaN rows); w_packed: uint8 [N, K / 2], the signed INT4 codes q in -8 .. 7
    (two's complement, element 2i in the low nibble: pack_int4(q, signed=True), what
    quantize_int4 writes in mode 'sym'); w_scales [N, groups] in scale_dtype's representation
    ('fp16' or 'bf16'; None infers it: float16, or uint16 bf16 bits).

    Each block sum is exact: a product e4m3 * q has at most 7 significant bits in
    [2^-9, 448 * 8], so 128 of them sum without rounding in float64; the product with the scale
    (at most 11 significant bits) is exact too. Only their sum over the blocks rounds: within
    (blocks - 1) 2^-53 of sum_kb |scale| |block sum| (2^-46 of it at K = 2^16).
    """
    acc = None
    for part, _, scale in _w4a8_blocks(a, w_packed, w_scales, group_size, scale_dtype):
        term = part * scale[None, :]
        acc = term if acc is None else acc + term
    return acc


def gemm_w4a8_abs_sums(a, w_packed, w_scales, group_size, scale_dtype=None):
    """sum_kb |w_scales[n, g(kb)]| sum_{k in kb} |e4m3(a[m, k]) q[n, k]| as float64 [M, N]: the
    scale of the accumulation error bound of ck_gemm_w4a8 (arguments as gemm_w4a8)."""
    sums = None
    for _, abs_part, scale in _w4a8_blocks(a, w_packed, w_scales, group_size, scale_dtype):
        term = abs_part * np.abs(scale)[None, :]
        sums = term if sums is None else sums + term
    return sums


def gemm_w4a8_f64(a, scale_a, w_packed, w_scales, group_size, scale_dtype=None, bias=None,
                  activation="none", out_dtype="fp32"):
    """The float64 values of ck_gemm_w4a8 before the rounding to out_dtype:

        act(acc[m, n] * scale_a[m or 0] + bias[n])

    acc = gemm_w4a8(a, w_packed, w_scales, group_size, scale_dtype); scale_a: float32, 1 value
    (CK_PER_TENSOR) or M values (CK_PER_ROW); bias: N values in out_dtype's representation, or
    None; activation 'none' or 'relu' (the epilogue of scaled_epilogue_f64, with no weight
    scale of its own: the weight's scales are in acc)."""
    acc = gemm_w4a8(a, w_packed, w_scales, group_size, scale_dtype)
    return scaled_epilogue_f64(acc, scale_a, np.float32(1), bias, activation, out_dtype)


def linear_f64(x, w, bias=None, activation="none", dtype=None):
    """ck_linear in exact arithmetic: act(x[M, K] w[N, K]^T + bias[N]) as float64 [M, N].

    x, w and bias are in the representation of `dtype` ('fp32', 'fp16', 'bf16'; None infers it
    from x: float32, float16, or uint16 bit patterns for bf16).
    """
    dtype = dtype or dtype_of(x)
    xf = _matrix(to_f32(x, dtype)).astype(np.float64)
    wf = _matrix(to_f32(w, dtype)).astype(np.float64)
    if xf.shape[1] != wf.shape[1]:
        raise ValueError(f"K differs: x is {list(xf.shape)}, w is {list(wf.shape)} ([N, K])")
    v = xf @ wf.T
    if bias is not None:
        bias = to_f32(np.asarray(bias), dtype).astype(np.float64).reshape(-1)
        if bias.size != wf.shape[0]:
            raise ValueError(f"bias needs N={wf.shape[0]} values, got {bias.size}")
        v = v + bias[None, :]
    return activate(v, activation)


def linear(x, w, bias=None, activation="none", dtype=None):
    """ck_linear, ideally: linear_f64 rounded once to the dtype (its representation)."""
    dtype = dtype or dtype_of(x)
    return round_f64_to_dtype(linear_f64(x, w, bias, activation, dtype), dtype)


W4A16_DTYPES = ("fp16", "bf16")
W4A16_K_MULTIPLE = 32  # ck_gemm_w4a16: K a multiple of 32


def dequantized_int4_weight(w_packed, scales, zeros, group_size, k, dtype):
    """The weight w' [N, K] that ck_gemm_w4a16 multiplies by, in `dtype`'s representation: the
    packed INT4 weight dequantized exactly as ck_dequantize_int4 does (the mode follows from
    zeros: None is symmetric). Bitwise what the library's ck_dequantize_int4 writes."""
    mode = "sym" if zeros is None else "asym"
    return dequantize_int4(np.asarray(w_packed), np.asarray(scales), zeros, k, group_size, mode,
                           dtype)


def _weight_only_x(x, k, dtype, dtypes, export):
    """(dtype, x [M, K]) of a weight-only GEMM: dtype (None: inferred from x) one of `dtypes`,
    the ones `export` runs on."""
    dtype = dtype or dtype_of(x)
    if dtype not in dtypes:
        raise ValueError(f"{export} runs on {dtypes}, not {dtype!r}")
    x = _matrix(np.asarray(x))
    if x.shape[1] != k:
        raise ValueError(f"x is {list(x.shape)}: K={k} expected")
    return dtype, x


def gemm_w4a16_f64(x, w_packed, scales, zeros, group_size, k, dtype=None, bias=None,
                   activation="none"):
    """ck_gemm_w4a16 in exact arithmetic: act(x[M, K] w'[N, K]^T + bias[N]) as float64 [M, N].

    x [M, K], scales [N, groups] and bias [N] are in `dtype`'s representation ('fp16' or
    'bf16'; None infers it from x: float16, or uint16 bit patterns for bf16); w_packed uint8
    [N, K / 2] and zeros uint8 [N, groups] (None for a symmetric weight) are the interchange
    format of ck_quantize_int4. w' is dequantized_int4_weight (rounded to dtype, as the kernel
    rounds it in registers); the product, the bias and the activation are then exact.
    """
    dtype, x = _weight_only_x(x, k, dtype, W4A16_DTYPES, "ck_gemm_w4a16")
    w = dequantized_int4_weight(w_packed, scales, zeros, group_size, k, dtype)
    return linear_f64(x, w, bias, activation, dtype)


def gemm_w4a16(x, w_packed, scales, zeros, group_size, k, dtype=None, bias=None,
               activation="none"):
    """ck_gemm_w4a16, ideally: gemm_w4a16_f64 rounded once to the dtype (its representation).
    The library accumulates in float32, so it is within a float32 error bound of the float64
    value plus half an ulp of dtype, not bitwise equal."""
    dtype = dtype or dtype_of(x)
    return round_f64_to_dtype(
        gemm_w4a16_f64(x, w_packed, scales, zeros, group_size, k, dtype, bias, activation), dtype)


def dtype_of(arr):
    """'fp32', 'fp16' or 'bf16' from the NumPy representation (uint16 means bf16 here)."""
    for name, np_dtype in NUMPY_DTYPE.items():
        if np.asarray(arr).dtype == np_dtype:
            return name
    raise TypeError(f"no dtype is represented as {np.asarray(arr).dtype.name}")


# Significand bits (with the implicit one) and the smallest exponent of a subnormal ulp.
_PRECISION = {"fp32": (24, -149), "fp16": (11, -24), "bf16": (8, -133)}


def ulp(x, dtype):
    """The spacing of `dtype` values at magnitude |x| (float64): 2**(floor(log2|x|) - p + 1),
    at least the smallest subnormal. ulp(0) is that smallest subnormal."""
    bits, min_exp = _PRECISION[dtype]
    x = np.abs(np.asarray(x, dtype=np.float64))
    _, e = np.frexp(x)  # x = m * 2**e with m in [0.5, 1): floor(log2 x) = e - 1
    e = np.where(x == 0, min_exp + bits, e)  # frexp(0) says e = 0
    return np.ldexp(1.0, np.maximum(e - bits, min_exp))


def round_f64_to_dtype(v, dtype):
    """float64 values -> `dtype`'s representation, rounded once, to nearest even (overflow to
    inf, as the GPU conversions of float32 do)."""
    v = np.asarray(v, dtype=np.float64)
    if dtype == "fp32":
        with np.errstate(over="ignore"):
            return v.astype(np.float32)
    if dtype == "fp16":
        with np.errstate(over="ignore"):
            return v.astype(np.float16)  # NumPy converts double -> half directly (one rounding)
    if dtype == "bf16":
        # Round to a multiple of the bf16 ulp in float64 (exact: the quotient has < 53 bits),
        # np.rint ties to even; then the float32 of that is exact and its top half is the bf16.
        step = ulp(v, "bf16")
        rounded = np.rint(v / step) * step
        with np.errstate(over="ignore"):
            return f32_to_bf16_bits(rounded.astype(np.float32))
    raise ValueError(f"unknown dtype {dtype!r} (use one of {DTYPES})")


# ---------------------------------------------------------------------------------------------
# INT4 x INT4 GEMM (ck_gemm_int4, ck_gemm_int4_scaled)
# ---------------------------------------------------------------------------------------------
# Both operands are signed packed INT4 (pack_int4(q, signed=True): two's complement codes in
# [-8, 7], element 2i in the low nibble of byte i): a [M, K / 2], b [N, K / 2] (the nn.Linear
# layout). The product is the int8 product of the unpacked codes, so ck_gemm_int4_scaled is
# ck_gemm_int8_scaled of unpack_int4(a), unpack_int4(b) (the same float32 epilogue on the same
# int32 sums): its references are gemm_int8_scaled(_f64) of the unpacked operands.
GEMM_INT4_K_MULTIPLE = 32  # ck_gemm_int4*: K a multiple of 32 (whole 16-byte vectors per row)
INT4_PRODUCT_MAX = 8 * 8  # the largest |a * b| of two int4 codes: (-8) * (-8)


def gemm_int4_i32(a_packed, b_packed, k):
    """ck_gemm_int4: packed signed int4 a [M, K / 2] and b [N, K / 2] (uint8) -> int32 [M, N].

    c[m, n] = sum_k a[m, k] * b[n, k] over the K = k codes of each row, computed exactly (int64)
    and wrapped modulo 2**32 like int32 addition (no sum can wrap below K = 2**25).
    """
    a = unpack_int4(_matrix(np.asarray(a_packed)), k, signed=True)
    b = unpack_int4(_matrix(np.asarray(b_packed)), k, signed=True)
    return wrap_int32(int_matmul_exact(a, b))


# ---------------------------------------------------------------------------------------------
# W4A16 prepacked layout (ck_w4a16_prepack; cuda_kernels.h describes it)
# ---------------------------------------------------------------------------------------------
PACK_ROWS, PACK_K, PACK_SLICE_K = 8, 128, 32
# Nibble e of a prepacked 32-bit word holds the word's k = PREPACKED_NIBBLE_K[e].
PREPACKED_NIBBLE_K = (0, 2, 4, 6, 1, 3, 5, 7)


def w4a16_prepacked_sizes(n, k, group_size):
    """(bytes of the prepacked weight, values of its prepacked scales) of an [N, K] weight."""
    rows = -(-n // PACK_ROWS) * PACK_ROWS
    chunks = -(-k // PACK_K)
    return rows * chunks * PACK_K // 2, rows * int4_groups_per_row(k, group_size)


def _prepack_codes(codes, n, k, pad_code):
    """The prepacked INT4 tiles (uint8 [bytes]) of 4-bit codes [n, k] (int64, 0 .. 15), padded
    with pad_code to whole tiles of PACK_ROWS rows and PACK_K k."""
    rows = -(-n // PACK_ROWS) * PACK_ROWS
    chunks = -(-k // PACK_K)
    padded = np.full((rows, chunks * PACK_K), pad_code, np.int64)
    padded[:n, :k] = codes
    # [tile i, chunk c, row r, slice s, word w, k-in-word e'] -> nibble e with k = NIBBLE_K[e]
    t = padded.reshape(rows // PACK_ROWS, PACK_ROWS, chunks, PACK_K // PACK_SLICE_K,
                       PACK_SLICE_K // 8, 8)
    t = t.transpose(0, 2, 1, 3, 4, 5)               # tile, chunk, row, slice, word, k
    nibbles = t[..., list(PREPACKED_NIBBLE_K)]      # nibble e holds k NIBBLE_K[e]
    words = np.zeros(nibbles.shape[:-1], np.uint64)
    for e in range(8):
        words |= nibbles[..., e].astype(np.uint64) << np.uint64(4 * e)
    return words.astype("<u4").reshape(-1).view(np.uint8).copy()


def w4a16_prepack(w_packed, scales, zeros, n, k, group_size):
    """ck_w4a16_prepack in NumPy: (w_prepacked uint8 [bytes], scales_prepacked [values] in the
    dtype of scales, zeros_prepacked uint8 or None), exactly as the header lays them out."""
    _require_dtype(w_packed, np.uint8, "w_packed")
    symmetric = zeros is None
    codes = unpack_int4(w_packed, k, signed=symmetric).astype(np.int64)
    if symmetric:
        codes = codes + 8                          # two's complement q -> q + 8 (zero point 8)
    rows = -(-n // PACK_ROWS) * PACK_ROWS
    w_out = _prepack_codes(codes, n, k, 8)
    groups = int4_groups_per_row(k, group_size)
    s = np.zeros((rows, groups), scales.dtype)
    s[:n] = scales.reshape(n, groups)
    s_out = s.reshape(rows // PACK_ROWS, PACK_ROWS, groups).transpose(0, 2, 1).reshape(-1).copy()
    z_out = None
    if not symmetric:
        z = np.full((rows, groups), 8, np.uint8)
        z[:n] = zeros.reshape(n, groups)
        z_out = z.reshape(rows // PACK_ROWS, PACK_ROWS, groups).transpose(0, 2, 1).reshape(-1).copy()
    return w_out, s_out, z_out


# ---------------------------------------------------------------------------------------------
# Mixture of experts (ck_moe_route, ck_moe_forward; the MoE section of cuda_kernels.h)
# ---------------------------------------------------------------------------------------------
# Routing is float32 arithmetic by the header's definition. moe_route performs the float32
# operations a kernel performs (max, subtract, exp, sum, divide), with exp correctly rounded:
# a kernel's expf (within 2 ulp) and its summation order differ, so its weights agree with these
# within a few float32 ulps plus the float32 summation error over the E experts (the GPU tests
# derive the bound). exp, the subtraction of the maximum and the division by one sum per token
# are monotonic, so equal logits give equal probabilities in any implementation: ties are
# exact, and ids agree exactly wherever no two distinct probabilities are within that bound of
# each other (the tests draw logits that keep distinct values far apart).
# The layer is the float64 ideal of the header's formula, with its two roundings to dtype: h (the
# activation, written once by the kernel) and the output. The kernel's float32 sums stay within
# a worst-case bound of it that the GPU tests derive (tests/test_moe_gpu.py).
MOE_DTYPES = ("fp16", "bf16")         # x, out, the weights' scales
MOE_ROUTER_DTYPES = DTYPES            # router logits: fp32 (the default), fp16 or bf16
MOE_MAX_EXPERTS = 1024
MOE_MAX_TOP_K = 32
MOE_SIZE_MULTIPLE = 32                # hidden and intermediate


def moe_softmax(logits, dtype=None):
    """p = softmax of each row of logits [T, E] in float32, as the header's route defines it:
    m = max(l), e = exp(l - m) (the subtraction in float32, exp correctly rounded to float32),
    s = sum(e) in float32 (NumPy's pairwise order), p = e / s (float32). logits are in dtype's
    representation ('fp32', 'fp16', 'bf16'; None infers it). Returns float32 [T, E]."""
    dtype = dtype or dtype_of(logits)
    lf = _matrix(to_f32(logits, dtype))
    d = lf - lf.max(axis=1, keepdims=True)               # float32, exact where |d| is small
    e = np.exp(d.astype(np.float64)).astype(np.float32)  # exp correctly rounded to float32
    s = e.sum(axis=1, dtype=np.float32, keepdims=True)
    return e / s


def moe_route(logits, top_k, renormalize, dtype=None):
    """ck_moe_route: logits [T, E] in dtype's representation -> (ids int32 [T, top_k], weights
    float32 [T, top_k]).

    ids[t] are the top_k experts of largest p[t] = moe_softmax(logits)[t], in descending order
    of p, equal probabilities by ascending expert index; weights[t, j] = p[t, ids[t, j]],
    divided (float32) by their float32 sum taken in the order j = 0 .. top_k - 1 when
    renormalize. 1 <= top_k <= E (the library also needs E <= 1024 and top_k <= 32; this
    reference works for any sizes).
    """
    p = moe_softmax(logits, dtype)
    experts = p.shape[1]
    if not 1 <= top_k <= experts:
        raise ValueError(f"top_k={top_k} must lie in [1, E={experts}]")
    # A stable sort of -p: descending p, equal p in ascending index order.
    ids = np.argsort(-p, axis=1, kind="stable")[:, :top_k].astype(np.int32)
    weights = np.take_along_axis(p, ids, axis=1)
    if renormalize:
        total = np.zeros(p.shape[0], np.float32)
        for j in range(top_k):
            total = total + weights[:, j]
        weights = weights / total[:, None]
    return ids, np.ascontiguousarray(weights, dtype=np.float32)


def moe_quantize(w, dtype, group_size, mode):
    """The E experts' [n, k] weights w [E, n, k] (dtype's representation) quantized as
    ck_quantize_int4 does, each row on its own (stacking the experts' rows changes nothing):
    (w_packed uint8 [E, n, (k + 1) // 2], scales [E, n, groups] in dtype, zeros uint8
    [E, n, groups] or None for 'sym'), the interchange format ck_moe_prepack takes."""
    w = np.asarray(w)
    if w.ndim != 3:
        raise ValueError(f"expected [E, n, k] expert weights, got shape {w.shape}")
    experts, n, k = w.shape
    packed, scales, zeros = quantize_int4(w.reshape(experts * n, k), dtype, group_size, mode)
    groups = scales.shape[1]
    return (packed.reshape(experts, n, -1), scales.reshape(experts, n, groups),
            None if zeros is None else zeros.reshape(experts, n, groups))


def moe_dequantize(w_packed, scales, zeros, k, group_size, dtype):
    """The experts' weights [E, n, k] the layer multiplies by: moe_quantize's output dequantized
    exactly as ck_dequantize_int4 does (rounded to dtype; mode 'asym' when zeros is given)."""
    w_packed, scales = np.asarray(w_packed), np.asarray(scales)
    experts, n = w_packed.shape[:2]
    groups = scales.shape[-1]
    flat_zeros = None if zeros is None else np.asarray(zeros).reshape(experts * n, groups)
    w = dequantized_int4_weight(w_packed.reshape(experts * n, -1),
                                scales.reshape(experts * n, groups), flat_zeros, group_size, k,
                                dtype)
    return w.reshape(experts, n, k)


def moe_pairs_by_expert(ids, experts):
    """[(e, t, j)]: for each expert e that some pair names, the tokens t and slots j of the pairs
    (t, j) with ids[t, j] == e (row-major order). Ids outside [0, experts) name no expert."""
    ids = _matrix(np.asarray(ids))
    groups = []
    for e in np.unique(ids):
        if 0 <= e < experts:
            t, j = np.nonzero(ids == e)
            groups.append((int(e), t, j))
    return groups


def moe_pairs_f64(x, ids, w13, w2, dtype):
    """The header's expert computation for every pair (t, j), in exact arithmetic except for the
    rounding of h:
        g = x[t] . W1_e^T, u = x[t] . W3_e^T        (exact, [I] each; W1_e = w13[e, :I], W3_e =
                                                     w13[e, I:])
        h = round_to_dtype(silu(g) * u)             silu(g) = g / (1 + exp(-g)), float64
        y = h . W2_e^T                               (exact, [H])
    x [T, H], w13 [E, 2I, H] and w2 [E, H, I] are in dtype's representation ('fp16', 'bf16':
    the dequantized weights, moe_dequantize); ids int32 [T, k]. Returns a dict of float64
    arrays g, u, h_exact (silu(g) * u before rounding), h (its dtype value) [T, k, I] and
    y [T, k, H], zero where ids[t, j] is outside [0, E), and valid bool [T, k].
    """
    if dtype not in MOE_DTYPES:
        raise ValueError(f"ck_moe_forward runs on {MOE_DTYPES}, not {dtype!r}")
    xf = _matrix(to_f32(x, dtype)).astype(np.float64)
    w13f = to_f32(w13, dtype).astype(np.float64)
    w2f = to_f32(w2, dtype).astype(np.float64)
    ids = _matrix(np.asarray(ids))
    tokens, hidden = xf.shape
    experts, two_i, _ = w13f.shape
    inter = two_i // 2
    if w13f.shape != (experts, 2 * inter, hidden) or w2f.shape != (experts, hidden, inter):
        raise ValueError(f"w13 {w13f.shape} and w2 {w2f.shape} must be [E, 2I, H] and "
                         f"[E, H, I] for x [T, H={hidden}]")
    if ids.shape[0] != tokens:
        raise ValueError(f"ids {ids.shape} must have T={tokens} rows")
    k = ids.shape[1]
    out = {name: np.zeros((tokens, k, inter)) for name in ("g", "u", "h_exact", "h")}
    out["y"] = np.zeros((tokens, k, hidden))
    out["valid"] = (ids >= 0) & (ids < experts)
    for e, t, j in moe_pairs_by_expert(ids, experts):
        rows = xf[t]
        g = rows @ w13f[e, :inter].T
        u = rows @ w13f[e, inter:].T
        with np.errstate(over="ignore"):   # exp(-g) overflows to inf for g < -709: silu -> -0
            h_exact = g / (1.0 + np.exp(-g)) * u
        h = to_f32(round_f64_to_dtype(h_exact, dtype), dtype).astype(np.float64)
        out["g"][t, j], out["u"][t, j], out["h_exact"][t, j], out["h"][t, j] = g, u, h_exact, h
        with np.errstate(invalid="ignore"):   # an h that rounded to inf times 0 is NaN, as on the GPU
            out["y"][t, j] = h @ w2f[e].T
    return out


def moe_combine_f64(y, weights):
    """out[t] = sum_{j = 0 .. k-1} weights[t, j] * y[t, j] in float64 (in that order), for y
    [T, k, H] and float32 weights [T, k]: the combine before its rounding to dtype."""
    weights = np.asarray(weights, dtype=np.float32).astype(np.float64)
    out = np.zeros((y.shape[0], y.shape[2]))
    for j in range(y.shape[1]):
        out = out + weights[:, j, None] * y[:, j]
    return out


def moe_layer_f64(x, ids, weights, w13, w2, dtype):
    """ck_moe_forward's output before its final rounding: moe_combine_f64 of moe_pairs_f64
    (pairs whose id is outside [0, E) contribute nothing). float64 [T, H]."""
    return moe_combine_f64(moe_pairs_f64(x, ids, w13, w2, dtype)["y"], weights)


def moe_layer_reference(x, ids, weights, w13, w2, dtype):
    """ck_moe_forward, ideally: the float64 layer (moe_layer_f64) rounded once to dtype.

    x [T, H] in dtype's representation ('fp16' or 'bf16'); ids int32 [T, k] and weights float32
    [T, k] (moe_route's, or the caller's: an id outside [0, E) contributes nothing); w13
    [E, 2I, H] (rows 0 .. I-1 the gate W1, I .. 2I-1 the up W3) and w2 [E, H, I], the
    dequantized weights (moe_dequantize) in dtype's representation. Returns [T, H] in dtype's
    representation. The library's float32 sums are within a worst-case bound of it, not
    bitwise equal (see moe_pairs_f64 for the intermediate rounding it shares).
    """
    return round_f64_to_dtype(moe_layer_f64(x, ids, weights, w13, w2, dtype), dtype)


def moe_gate_up_rows(n):
    """The interchange rows of a gate+up weight [n = 2I, k] in the order ck_moe_prepack lays them
    out ("interleaved in blocks of 8 rows"): 8-row tiles alternate between the gate (rows
    0 .. I-1) and the up projection (rows I .. 2I-1), gate rows 0-7, up rows 0-7, gate rows
    8-15, up rows 8-15, ..., so that a tile pair holds both halves of the same 8 outputs."""
    if n % (2 * PACK_ROWS):
        raise ValueError(f"a gate+up weight has n={n} rows: a multiple of {2 * PACK_ROWS} needed")
    row = np.arange(n)
    tile = row // PACK_ROWS
    return (tile % 2) * (n // 2) + (tile // 2) * PACK_ROWS + row % PACK_ROWS


def moe_prepacked_sizes(experts, n, k, group_size):
    """(bytes, values) of ck_moe_prepacked_bytes / _groups: experts times one [n, k] weight's."""
    nbytes, values = w4a16_prepacked_sizes(n, k, group_size)
    return experts * nbytes, experts * values


def moe_prepack(w_packed, scales, zeros, k, group_size, gate_up):
    """ck_moe_prepack in NumPy: each expert's [n, k] weight (w_packed [E, n, k / 2], scales and
    zeros [E, n, groups]) prepacked as w4a16_prepack does, the experts one after the other;
    a gate+up weight's rows first taken in moe_gate_up_rows order. Returns flat (w_prepacked,
    scales_prepacked, zeros_prepacked or None)."""
    experts, n = np.asarray(w_packed).shape[:2]
    rows = moe_gate_up_rows(n) if gate_up else np.arange(n)
    parts = [w4a16_prepack(np.ascontiguousarray(w_packed[e][rows]),
                           np.ascontiguousarray(scales[e][rows]),
                           None if zeros is None else np.ascontiguousarray(zeros[e][rows]),
                           n, k, group_size) for e in range(experts)]
    w, s, z = zip(*parts)
    return (np.concatenate(w), np.concatenate(s),
            None if zeros is None else np.concatenate(z))


# ---------------------------------------------------------------------------------------------
# Block-quantized 4-bit formats: NF4, MXFP4, NVFP4
# ---------------------------------------------------------------------------------------------
# Three published formats in which a block of consecutive elements of a row shares one scale and
# every element is a 4-bit code. Each follows its publisher's definition; where the sources are
# silent or disagree, the choice made is stated where it is made.
#
#   NF4    bitsandbytes' normal-float table (QLoRA): one float32 absmax per `blocksize` elements
#          (64 by default); element 2i in the HIGH nibble of byte i, as bitsandbytes packs it.
#   MXFP4  OCP Microscaling Formats (MX) v1.0: E2M1 elements, one E8M0 power-of-two scale per 32
#          elements; element 2i in the LOW nibble (gpt-oss checkpoints, torch ao's pack_uint4).
#   NVFP4  NVIDIA's two-level FP4: E2M1 elements, one FP8 E4M3 scale per 16 elements and one
#          float32 scale per tensor; element 2i in the LOW nibble (TensorRT-LLM, ModelOpt,
#          compressed-tensors and vLLM all pack it so).
#
# Interchange layout of all three (what the quantizers return and the dequantizers take): packed
# uint8 [rows, (cols + 1) // 2] and scales [rows, ceil(cols / block)]. Blocks run along a row;
# the last block of a row may be partial, its scale taken from the elements it has (the zero
# padding changes no absmax). When cols is odd, the unused nibble of each row's last byte holds
# the code of 0.0 (NF4: what its zero padding quantizes to, as in bitsandbytes). A 1-D tensor is
# one row [1, n]: bitsandbytes blocks its flattened tensor so.
#
# NumPy has no 4- or 8-bit floats, so E2M1 (FP4), E4M3 (the 'fn' variant: no infinities, NaN =
# S.1111.111, max 448) and E8M0 (an unsigned power-of-two exponent) are implemented bit by bit.
# The dequantized values are float32 products, then rounded to the output dtype (to_dtype).

# ---- E2M1 (FP4) -------------------------------------------------------------------------------
E2M1_MAX = 6.0
# The value of each code S.EE.M: bit 3 the sign, a 2-bit exponent (bias 1) and 1 mantissa bit;
# exponent 0 is subnormal (0 and 0.5). No infinity, no NaN.
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6,
                        -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)
# The midpoints between consecutive magnitudes. Magnitude code c (0..7) of |x| is the number of
# midpoints it passes; a tie goes to the even code, so the k-th midpoint is passed at |x| > m_k
# when k is even (its lower neighbour has the even code) and at |x| >= m_k when k is odd.
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def e2m1_encode(x):
    """float32 values -> E2M1 codes (uint8, 0..15): round to nearest, ties to even, saturating.

    The sign bit is x's sign bit (-0.0, and a negative value that rounds to zero, give 8: -0);
    |x| rounds to the nearest of 0, 0.5, 1, 1.5, 2, 3, 4, 6, a tie to the even code, which is the
    even mantissa (values 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4,
    5 -> 4); |x| > 5 and +-inf saturate to 6 (PTX cvt.rn.satfinite.e2m1x2.f32 rounds and
    saturates the same way).
    NaN encodes as 0 (+0.0): E2M1 has no NaN.
    """
    x = np.asarray(x, dtype=np.float32)
    mag = np.abs(x)
    codes = np.zeros(x.shape, dtype=np.uint8)
    for k, midpoint in enumerate(_E2M1_MIDPOINTS):
        codes += (mag >= midpoint) if k % 2 else (mag > midpoint)
    codes |= np.signbit(x).astype(np.uint8) << 3
    return np.where(np.isnan(x), np.uint8(0), codes).astype(np.uint8)


def e2m1_decode(codes):
    """E2M1 codes (uint8, 0..15) -> their float32 values (exact)."""
    codes = _require_dtype(np.asarray(codes), np.uint8, "e2m1 codes")
    if codes.size and codes.max() > 15:
        raise ValueError("e2m1 codes must lie in [0, 15]")
    return E2M1_VALUES[codes]


# ---- FP8: E4M3 ('fn') and E5M2 (OCP 8-bit Floating Point Specification, OFP8) ------------------
# One encoder and one decoder serve both formats, from their bit fields: a sign bit, an exponent
# field with its bias, a mantissa field; exponent field 0 holds the subnormals (0 included).
# E4M3 ('fn'): 4 exponent bits (bias 7), 3 mantissa bits, no infinities; S.1111.111 is NaN, so
#   the largest value is S.1111.110 = 448 and S.1111.000 .. S.1111.110 are ordinary numbers.
# E5M2: 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like: S.11111.00 is +-inf,
#   S.11111.{01,10,11} NaN, the largest finite value 57344 (S.11110.11).
FP8_FORMATS = ("e4m3", "e5m2")
E4M3_MAX = 448.0
E5M2_MAX = 57344.0
FP8_MAX = {"e4m3": E4M3_MAX, "e5m2": E5M2_MAX}
FP8_NAN = 0x7F             # the NaN the encoders write, for a NaN of either sign (as PTX cvt)
E4M3_NAN = FP8_NAN          # (0xFF is NaN too)
E5M2_INF = 0x7C             # +inf; 0xFC is -inf (decoded, never written: encoding saturates)
_FP8_FIELDS = {             # format -> (mantissa bits, exponent bias)
    "e4m3": (3, 7),
    "e5m2": (2, 15),
}


def _fp8_fields(fmt):
    try:
        return _FP8_FIELDS[fmt]
    except KeyError:
        raise ValueError(f"unknown FP8 format {fmt!r} (use one of {FP8_FORMATS})") from None


def fp8_encode(x, fmt):
    """float32 values -> FP8 bit patterns (uint8) of `fmt` ('e4m3' or 'e5m2'): round to nearest,
    ties to even, saturating.

    |x| is rounded to a multiple of its quantum, 2**(floor(log2|x|) - M) for |x| >= 2**(1 - bias)
    (the smallest normal) and 2**(1 - bias - M) below (the subnormals), M the mantissa bits, ties
    to even; a magnitude that rounds above the format's largest value, and +-inf, saturate to it
    (E4M3 448 = 0x7E, past 464; E5M2 57344 = 0x7B, from 61440), as PTX cvt.rn.satfinite does
    (OCP's saturating conversion): E5M2's infinities are never written. The sign bit is x's (a
    negative value that rounds to zero gives 0x80, -0). NaN, of either sign and any payload,
    encodes as 0x7F, the byte the GPU conversion writes for both formats.
    """
    mantissa_bits, bias = _fp8_fields(fmt)
    x = np.asarray(x, dtype=np.float32)
    finite = np.isfinite(x)
    mag = np.abs(np.where(finite, x, 0)).astype(np.float64)  # exact, as is everything below
    _, e = np.frexp(mag)                       # mag = f * 2**e, f in [0.5, 1): floor(log2) = e - 1
    quantum = np.ldexp(1.0, np.maximum(e - 1, 1 - bias) - mantissa_bits)
    rounded = np.rint(mag / quantum) * quantum  # np.rint: half to even
    rounded = np.where(finite, np.minimum(rounded, FP8_MAX[fmt]), FP8_MAX[fmt])
    bits = _fp8_magnitude_bits(rounded, mantissa_bits, bias)
    bits |= np.signbit(x).astype(np.uint8) << 7
    return np.where(np.isnan(x), np.uint8(FP8_NAN), bits).astype(np.uint8)


def _fp8_magnitude_bits(mag, mantissa_bits, bias):
    """Representable FP8 magnitudes (float64, finite) -> their 7-bit patterns (uint8)."""
    _, e = np.frexp(mag)
    normal = mag >= 2.0 ** (1 - bias)
    exponent = np.where(normal, e - 1, 1 - bias)
    significand = (mag / np.ldexp(1.0, exponent - mantissa_bits)).astype(np.int64)
    # A normal significand is 2**M + mantissa (the implicit one), a subnormal one the mantissa.
    biased = np.where(normal, exponent + bias, 0)
    mantissa = np.where(normal, significand - (1 << mantissa_bits), significand)
    return ((biased << mantissa_bits) | mantissa).astype(np.uint8)


def fp8_decode(bits, fmt):
    """FP8 bit patterns (uint8) of `fmt` -> float32 values (exact): E4M3 0x7F / 0xFF are NaN;
    E5M2 0x7C / 0xFC are +-inf and 0x7D-0x7F / 0xFD-0xFF NaN."""
    mantissa_bits, bias = _fp8_fields(fmt)
    bits = _require_dtype(np.asarray(bits), np.uint8, f"{fmt} bits")
    exponent_max = (1 << (7 - mantissa_bits)) - 1
    biased = ((bits & 0x7F) >> mantissa_bits).astype(np.int64)
    mantissa = (bits & ((1 << mantissa_bits) - 1)).astype(np.int64)
    mag = np.where(biased == 0, np.ldexp(mantissa.astype(np.float64), 1 - bias - mantissa_bits),
                   np.ldexp(((1 << mantissa_bits) + mantissa).astype(np.float64),
                            biased - bias - mantissa_bits))
    if fmt == "e4m3":
        nan = (bits & 0x7F) == 0x7F
    else:
        nan = (biased == exponent_max) & (mantissa != 0)
        mag = np.where((biased == exponent_max) & (mantissa == 0), np.inf, mag)
    value = np.where(bits & 0x80, -mag, mag)
    return np.where(nan, np.nan, value).astype(np.float32)


def e4m3_encode(x):
    """float32 values -> FP8 E4M3 bit patterns (uint8): fp8_encode(x, 'e4m3') (ties to even,
    saturating at 448, NaN -> 0x7F)."""
    return fp8_encode(x, "e4m3")


def e4m3_decode(bits):
    """FP8 E4M3 bit patterns (uint8) -> float32 values (exact; 0x7F and 0xFF are NaN)."""
    return fp8_decode(bits, "e4m3")


# ---- E8M0 (power-of-two scale) ----------------------------------------------------------------
E8M0_BIAS = 127
E8M0_NAN = 0xFF
E8M0_EXP_RANGE = (-127, 127)


def e8m0_encode(x):
    """float32 values -> E8M0 scales (uint8): the largest power of two 2**k <= x, stored as
    k + 127, with k clamped to [-127, 127].

    E8M0 has no sign, no zero and no infinity: +-0 and 0 < x < 2**-127 give 0x00 (2**-127), and
    NaN, +-inf and negative values give 0xFF (NaN). Every value 2**-127 .. 2**127 round trips.
    """
    x = np.asarray(x, dtype=np.float32)
    positive = np.isfinite(x) & (x > 0)
    _, e = np.frexp(np.where(positive, x, 1).astype(np.float64))  # floor(log2 x) = e - 1
    k = np.where(positive, np.clip(e - 1, *E8M0_EXP_RANGE), E8M0_EXP_RANGE[0])
    bits = (k + E8M0_BIAS).astype(np.uint8)
    invalid = np.isnan(x) | np.isinf(x) | (x < 0)
    return np.where(invalid, np.uint8(E8M0_NAN), bits).astype(np.uint8)


def e8m0_decode(bits):
    """E8M0 scales (uint8) -> float32 2**(bits - 127) (exact: 0x00 is the float32 subnormal
    2**-127), NaN for 0xFF."""
    bits = _require_dtype(np.asarray(bits), np.uint8, "e8m0 scales")
    value = np.ldexp(1.0, bits.astype(np.int64) - E8M0_BIAS)
    return np.where(bits == E8M0_NAN, np.nan, value).astype(np.float32)


# ---- Nibble packing and blocks ----------------------------------------------------------------
def _pack_nibbles(codes, first_high, pad):
    """4-bit codes [rows, cols] -> uint8 [rows, (cols + 1) // 2], element 2i in the high
    (first_high) or the low nibble of byte i; an odd row is completed with the code `pad`."""
    codes = _matrix(np.asarray(codes))
    rows, cols = codes.shape
    if codes.size and (codes.min() < 0 or codes.max() > 15):
        raise ValueError("4-bit codes must lie in [0, 15]")
    nibbles = np.full((rows, cols + cols % 2), pad, dtype=np.uint8)
    nibbles[:, :cols] = codes
    first, second = nibbles[:, 0::2], nibbles[:, 1::2]
    return (first << 4) | second if first_high else first | (second << 4)


def _unpack_nibbles(packed, cols, first_high):
    """Inverse of _pack_nibbles: packed uint8 [rows, (cols + 1) // 2] -> codes [rows, cols]."""
    packed = _matrix(_require_dtype(np.asarray(packed), np.uint8, "packed 4-bit codes"))
    rows, nbytes = packed.shape
    if nbytes != (cols + 1) // 2:
        raise ValueError(f"{cols} columns pack into {(cols + 1) // 2} bytes per row, not {nbytes}")
    high, low = packed >> 4, packed & 0xF
    codes = np.empty((rows, 2 * nbytes), dtype=np.uint8)
    codes[:, 0::2], codes[:, 1::2] = (high, low) if first_high else (low, high)
    return np.ascontiguousarray(codes[:, :cols])


def block_count(cols, block):
    """Blocks in a row of `cols` elements: ceil(cols / block) (the last one may be partial)."""
    return -(-cols // block)


def _blocked(xf, block):
    """float32 [rows, cols] -> [rows, blocks, block], the last block completed with zeros."""
    rows, cols = xf.shape
    padded = np.zeros((rows, block_count(cols, block) * block), dtype=np.float32)
    padded[:, :cols] = xf
    return padded.reshape(rows, -1, block)


def _block_of_col(cols, block):
    return np.arange(cols) // block


def _check_block_scales(scales, rows, cols, block, what):
    want = (rows, block_count(cols, block))
    if scales.shape != want:
        raise ValueError(f"{what} must be {list(want)}, got {list(scales.shape)}")


# ---- NF4 (bitsandbytes) -----------------------------------------------------------------------
# bitsandbytes' NF4 table (functional.get_4bit_type('nf4'); the same floats as the kernels'
# nf4_dequantization_lut): quantiles of N(0, 1) scaled to [-1, 1], 0 exact, 8 positive levels.
# Each literal is a float32 value printed in full, so np.float32 reads it exactly.
NF4_TABLE = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=np.float32)
NF4_ZERO_CODE = 7
# The float32 thresholds of dQuantizeNF4, bitsandbytes' CUDA decision tree (csrc/kernels.cu):
# float literals (on the right, as written there), each the float64 midpoint of two neighbouring
# table values; the compiler reads each as the float32 nearest to the decimal, here in hex. For
# i = 0, 1, 3, 4, 5, 8, 10, 12 and 14 that differs from the exact midpoint (which needs one more
# bit than float32 has), below it or above it; the quantizer's ties follow from that (nf4_encode).
NF4_THRESHOLDS = np.array([float.fromhex(h) for h in (
    "-0x1.b239b2p-1",   # -0.8480964004993439
    "-0x1.38a4e0p-1",   # -0.6106329262256622
    "-0x1.d70900p-2",   # -0.4599952697753906
    "-0x1.5bd4ecp-2",   # -0.33967943489551544
    "-0x1.e079d8p-3",   # -0.23460740596055984
    "-0x1.1a7178p-3",   # -0.13791173323988914
    "-0x1.74f0e2p-5",   # -0.045525018125772476
    "0x1.45f5fep-5",    # 0.03979014977812767
    "0x1.ec90c6p-4",    # 0.1202552504837513
    "0x1.a0cfc0p-3",    # 0.2035212516784668
    "0x1.2b05a8p-2",    # 0.2920137718319893
    "0x1.8ea7f2p-2",    # 0.3893125355243683
    "0x1.00da06p-1",    # 0.5016634166240692
    "0x1.491b5ep-1",    # 0.6427869200706482
    "0x1.b913b2p-1",    # 0.8614784181118011
)], dtype=np.float32)
NF4_BLOCK_SIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)  # bitsandbytes' (32: not on ROCm)
NF4_DEFAULT_BLOCK_SIZE = 64


def nf4_encode(y):
    """float32 quotients y = x * (1 / absmax) -> NF4 codes (uint8, 0..15), exactly as
    bitsandbytes' dQuantizeNF4 decides: the code is the number of NF4_THRESHOLDS t with y > t
    (its decision tree is a binary search on them, one `y > t` per level).

    That is the nearest table value for every float32 y except y == t exactly, which takes the
    lower code: a true tie where t is the exact midpoint (thresholds 2, 6, 7, 9, 11, 13), and for
    thresholds 1, 3, 4 and 8, which lie above the exact midpoint (by 2**-25, 2**-26, 2**-27 and
    2**-28), the farther code; thresholds 0, 5, 10, 12, 14 lie just below theirs, which no float32
    separates from them, so there the nearest code is always taken. NaN passes no threshold:
    code 0 (-1.0), as in the CUDA tree, where every comparison with NaN is false.
    """
    y = np.asarray(y, dtype=np.float32)
    codes = np.zeros(y.shape, dtype=np.uint8)
    for threshold in NF4_THRESHOLDS:
        codes += y > threshold
    return codes


def pack_nf4(codes):
    """NF4 codes [rows, cols] -> packed uint8 [rows, (cols + 1) // 2]: element 2i in the HIGH
    nibble of byte i, 2i+1 in the low one (bitsandbytes' order). An odd row's last low nibble is
    NF4_ZERO_CODE (quantize_nf4 writes there the code of its zero padding, as bitsandbytes does).
    """
    return _pack_nibbles(codes, first_high=True, pad=NF4_ZERO_CODE)


def unpack_nf4(packed, cols):
    """packed uint8 [rows, (cols + 1) // 2] -> NF4 codes uint8 [rows, cols] (pack_nf4 undone)."""
    return _unpack_nibbles(packed, cols, first_high=True)


def _check_nf4_blocksize(blocksize):
    if blocksize not in NF4_BLOCK_SIZES:
        raise ValueError(f"NF4 blocksize={blocksize} is not one of {NF4_BLOCK_SIZES}")


def quantize_nf4(x, dtype, blocksize=NF4_DEFAULT_BLOCK_SIZE):
    """x [rows, cols] in `dtype`'s representation -> (packed uint8 [rows, (cols + 1) // 2],
    absmax float32 [rows, ceil(cols / blocksize)]): bitsandbytes' quantize_4bit, quant_type 'nf4'.

    Per block of `blocksize` consecutive elements of a row (the last one may be partial):
    absmax = max |x| in float32, NaN ignored; inv = 1 / absmax (float32, inf for absmax 0);
    y = (float)x * inv (float32); code = nf4_encode(y). This is bitsandbytes' CUDA kernel
    (kQuantizeBlockwise, NF4) operation for operation, so a row [1, n] gives its bytes and absmax
    for the flattened tensor, the last low nibble of an odd n included: the code of its zero
    padding, 0 * inv (7, or 0 in a block of zeros).
    The edges are bitsandbytes' own: an all-zero block stores absmax 0 and code 0 everywhere
    (0 * inf is NaN), which dequantizes to -0.0; a NaN element gets code 0 (-absmax); an infinite
    element makes absmax inf, and its block dequantizes to NaN (0 * inf) and -inf. One difference:
    bitsandbytes' max starts at -FLT_MAX, so it would store -FLT_MAX for a block of NaN only;
    here NaN counts as 0 and that absmax is 0.
    """
    _check_nf4_blocksize(blocksize)
    xf = _matrix(to_f32(x, dtype))
    absmax = np.max(np.abs(_blocked(_nan_to_zero(xf), blocksize)), axis=2)
    cols = xf.shape[1]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # 1 / subnormal: inf
        inv = _F32_ONE / absmax
        y = xf * inv[:, _block_of_col(cols, blocksize)]
        if cols % 2:  # the padding element, quantized as bitsandbytes' kernel quantizes it
            y = np.concatenate([y, np.float32(0) * inv[:, -1:]], axis=1)
    return pack_nf4(nf4_encode(y)), absmax


def dequantize_nf4(packed, absmax, cols, blocksize, out_dtype):
    """packed NF4 [rows, (cols + 1) // 2] and float32 absmax [rows, ceil(cols / blocksize)] ->
    values [rows, cols] in out_dtype's representation: NF4_TABLE[code] * absmax in float32 (one
    rounding), then rounded to out_dtype (bitsandbytes' kDequantizeBlockwise, NF4)."""
    _check_nf4_blocksize(blocksize)
    codes = unpack_nf4(packed, cols)
    absmax = _matrix(_require_dtype(np.asarray(absmax), np.float32, "nf4 absmax"))
    _check_block_scales(absmax, codes.shape[0], cols, blocksize, "nf4 absmax")
    with np.errstate(invalid="ignore"):  # 0 * inf where absmax is inf
        return to_dtype(NF4_TABLE[codes] * absmax[:, _block_of_col(cols, blocksize)], out_dtype)


# ---- NF4 double quantization (bitsandbytes compress_statistics) -------------------------------
# bitsandbytes quantizes the float32 absmax values themselves: offset = mean(absmax), and
# absmax - offset goes through its 8-bit blockwise quantizer (blocks of 256, the "dynamic" map).
# A checkpoint stores the 8-bit codes (`absmax`), the second-level float32 absmax
# (`nested_absmax`), the 256-value map (`nested_quant_map`) and the offset (`nested_offset`).
NF4_NESTED_BLOCK_SIZE = 256


def _torch_linspace_f32(start, end, steps):
    """torch.linspace(start, end, steps) in float32, by the formula of its CPU kernel:
    step = (end - start) / (steps - 1); element i = start + step * i for i < steps // 2 and
    end - step * (steps - 1 - i) above, every operation in float32."""
    start, end = np.float32(start), np.float32(end)
    step = (end - start) / np.float32(steps - 1)
    i = np.arange(steps)
    low = start + step * i.astype(np.float32)
    high = end - step * (steps - 1 - i).astype(np.float32)
    return np.where(i < steps // 2, low, high).astype(np.float32)


def bnb_dynamic_map():
    """bitsandbytes' signed 8-bit dynamic map (functional.create_dynamic_map(signed=True)):
    float32 [256], sorted, code[127] = 0 and code[255] = 1.

    For i = 0 .. 6: b = linspace(0.1, 1, 2**i + 1) (float32), the 2**i means (b[j] + b[j+1]) / 2
    (float32), times 10**(i - 6) (the Python float rounded to float32, then a float32 product),
    and their negatives; then 0 and 1. torch vectorizes linspace on longer vectors, which can move
    a few of its values by an ulp from the formula used here (_torch_linspace_f32), differently
    on different CPUs: a checkpoint's stored map (`nested_quant_map`) is therefore the one its
    absmax codes are decoded with (import_bnb_nf4); this one serves the quantizer.
    """
    data = [np.float32(0), np.float32(1)]
    for i in range(7):
        b = _torch_linspace_f32(0.1, 1.0, 2 ** i + 1)
        means = (b[:-1] + b[1:]) / np.float32(2)
        scaled = np.float32(10.0 ** (i - 6)) * means
        data += list(scaled) + list(-scaled)
    return np.sort(np.array(data, dtype=np.float32))


def _dynamic_code_search(code, y):
    """bitsandbytes' dQuantize<0> (csrc/kernels.cu) on float32 y: a 7-step binary search of the
    sorted 256-value `code` from index 127 that keeps the last indices and values below and above,
    then the nearer of the final pivot and that neighbour, judged against the float32 midpoint
    (a + b) * 0.5 (a tie keeps the pivot). NaN ends at index 0."""
    y = np.asarray(y, dtype=np.float32)
    pivot = np.full(y.shape, 127, dtype=np.int64)
    lower_pivot = np.zeros(y.shape, dtype=np.int64)
    upper_pivot = np.full(y.shape, 255, dtype=np.int64)
    lower = np.full(y.shape, -1.0, dtype=np.float32)
    upper = np.full(y.shape, 1.0, dtype=np.float32)
    val = code[pivot]
    for step in (64, 32, 16, 8, 4, 2, 1):
        above = y > val
        lower_pivot = np.where(above, pivot, lower_pivot)
        lower = np.where(above, val, lower)
        upper_pivot = np.where(above, upper_pivot, pivot)
        upper = np.where(above, upper, val)
        pivot = np.where(above, pivot + step, pivot - step)
        val = code[pivot]
    upper = np.where(upper_pivot == 255, code[255], upper)
    lower = np.where(lower_pivot == 0, code[0], lower)
    above = y > val
    up = (upper + val) * np.float32(0.5)
    down = (lower + val) * np.float32(0.5)
    q = np.where(above, np.where(y > up, upper_pivot, pivot),
                 np.where(y < down, lower_pivot, pivot))
    return q.astype(np.uint8)


def quantize_blockwise_8bit(a, code, blocksize=NF4_NESTED_BLOCK_SIZE):
    """float32 a [n] -> (q uint8 [n], absmax float32 [ceil(n / blocksize)]): bitsandbytes'
    quantize_blockwise with an 8-bit map (kQuantizeBlockwise, General8bit): per block absmax =
    max |a| (float32), inv = 1 / absmax, q = _dynamic_code_search(code, a * inv). A block of
    zeros gives absmax 0, a * inv = NaN and q = 0 (bitsandbytes' own result)."""
    a = _require_dtype(np.asarray(a), np.float32, "blockwise input").reshape(1, -1)
    code = _require_dtype(np.asarray(code), np.float32, "8-bit map").reshape(-1)
    if code.size != 256:
        raise ValueError(f"an 8-bit map has 256 values, got {code.size}")
    absmax = np.max(np.abs(_blocked(a, blocksize)), axis=2)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = a * (_F32_ONE / absmax)[:, _block_of_col(a.shape[1], blocksize)]
    return _dynamic_code_search(code, y).reshape(-1), absmax.reshape(-1)


def dequantize_blockwise_8bit(q, absmax, code, blocksize=NF4_NESTED_BLOCK_SIZE):
    """q uint8 [n], absmax float32 [ceil(n / blocksize)] -> float32 [n]: code[q] * absmax in
    float32 (bitsandbytes' kDequantizeBlockwise, General8bit)."""
    q = _require_dtype(np.asarray(q), np.uint8, "8-bit codes").reshape(-1)
    absmax = _require_dtype(np.asarray(absmax), np.float32, "8-bit absmax").reshape(-1)
    code = _require_dtype(np.asarray(code), np.float32, "8-bit map").reshape(-1)
    if absmax.size != block_count(q.size, blocksize) or code.size != 256:
        raise ValueError(f"{q.size} codes need {block_count(q.size, blocksize)} absmax values and "
                         f"a 256-value map, got {absmax.size} and {code.size}")
    return code[q] * absmax[np.arange(q.size) // blocksize]


def nf4_double_quantize(absmax, code=None, offset=None):
    """NF4 absmax (float32, any shape, taken row-major) -> (q uint8 [n], absmax2 float32
    [ceil(n / 256)], offset float32): bitsandbytes' compress_statistics.

    offset = the mean of absmax; bitsandbytes takes torch's float32 mean, whose summation order is
    torch's own, so here it is the float64 mean rounded to float32 unless `offset` is given (pass
    a checkpoint's to reproduce it). Then c = absmax - offset (float32) and
    (q, absmax2) = quantize_blockwise_8bit(c, code, 256), code = bnb_dynamic_map() by default.
    """
    absmax = _require_dtype(np.asarray(absmax), np.float32, "nf4 absmax").reshape(-1)
    code = bnb_dynamic_map() if code is None else code
    offset = np.float32(np.mean(absmax, dtype=np.float64) if offset is None else offset)
    q, absmax2 = quantize_blockwise_8bit(absmax - offset, code, NF4_NESTED_BLOCK_SIZE)
    return q, absmax2, offset


def nf4_double_dequantize(q, absmax2, code, offset, blocksize=NF4_NESTED_BLOCK_SIZE):
    """The NF4 absmax of a double-quantized state: float32 [n] =
    (code[q] * absmax2[i // blocksize]) + offset, each operation in float32, in bitsandbytes'
    order (dequantize_4bit: dequantize_blockwise, then += offset)."""
    return dequantize_blockwise_8bit(q, absmax2, code, blocksize) + np.float32(offset)


def import_bnb_nf4(weight, absmax, shape, blocksize, quant_map=None, nested_absmax=None,
                   nested_quant_map=None, nested_offset=None,
                   nested_blocksize=NF4_NESTED_BLOCK_SIZE):
    """A bitsandbytes Params4bit NF4 weight -> (packed uint8 [N, (K + 1) // 2], absmax float32
    [N, ceil(K / blocksize)]) in the layout of quantize_nf4.

    The checkpoint, as QuantState.as_dict(packed=True) saves it next to `weight`: `weight` uint8
    [(n + 1) // 2, 1], the codes of the flattened tensor of `shape` ([N, K], n = N K; [n] is one
    row), two per byte, element 2i in the high nibble; `absmax` float32 [ceil(n / blocksize)], or
    with double quantization the uint8 codes of it, with `nested_absmax` float32, the 256-value
    `nested_quant_map`, `nested_offset` (a float in the quant_state JSON, the exact float32 mean)
    and `nested_blocksize` (256); blocksize and shape come from that JSON. `quant_map` (`weight
    .quant_map`, 16 values), when given, must be NF4_TABLE: bitsandbytes' 'fp4' type is another
    format. bitsandbytes' blocks run over the flattened tensor, so a block must not cross rows:
    K % blocksize == 0 unless N == 1. A weight saved with another quant_storage holds the same
    bytes: pass them viewed as uint8.
    """
    _check_nf4_blocksize(blocksize)
    rows, cols = (1, shape[0]) if len(shape) == 1 else tuple(shape)
    if len(shape) > 2 or (rows > 1 and cols % blocksize):
        raise ValueError(f"shape {tuple(shape)}: bitsandbytes' blocks of {blocksize} cross rows "
                         "(the library's NF4 blocks run along a row)")
    if quant_map is not None and not np.array_equal(
            np.asarray(quant_map, dtype=np.float32).view(np.uint32), NF4_TABLE.view(np.uint32)):
        raise ValueError("quant_map is not bitsandbytes' NF4 table")
    n = rows * cols
    weight = _require_dtype(np.asarray(weight), np.uint8, "bitsandbytes weight").reshape(-1)
    if weight.size != (n + 1) // 2:
        raise ValueError(f"{n} codes pack into {(n + 1) // 2} bytes, got {weight.size}")
    blocks = block_count(n, blocksize)
    if nested_absmax is None:
        absmax = _require_dtype(np.asarray(absmax), np.float32, "bitsandbytes absmax").reshape(-1)
    else:
        absmax = nf4_double_dequantize(
            _require_dtype(np.asarray(absmax), np.uint8, "nested absmax codes").reshape(-1),
            nested_absmax, nested_quant_map, nested_offset, nested_blocksize)
    if absmax.size != blocks:
        raise ValueError(f"{n} elements in blocks of {blocksize} need {blocks} absmax values, "
                         f"got {absmax.size}")
    return weight.reshape(rows, (cols + 1) // 2).copy(), absmax.reshape(rows, -1).copy()


# ---- MXFP4 (OCP Microscaling Formats v1.0) ----------------------------------------------------
MXFP4_BLOCK = 32
MXFP4_ELEM_EMAX = 2  # the exponent of E2M1's largest normal value, 6 = 1.5 * 2**2


def pack_fp4(codes):
    """E2M1 codes [rows, cols] -> packed uint8 [rows, (cols + 1) // 2]: element 2i in the LOW
    nibble of byte i, 2i+1 in the high one (MXFP4 and NVFP4 checkpoints); an odd row's last high
    nibble is 0 (+0.0)."""
    return _pack_nibbles(codes, first_high=False, pad=0)


def unpack_fp4(packed, cols):
    """packed uint8 [rows, (cols + 1) // 2] -> E2M1 codes uint8 [rows, cols] (pack_fp4 undone)."""
    return _unpack_nibbles(packed, cols, first_high=False)


def quantize_mxfp4(x, dtype):
    """x [rows, cols] in `dtype`'s representation -> (packed uint8 [rows, (cols + 1) // 2],
    scales uint8 E8M0 [rows, ceil(cols / 32)]).

    The spec's conversion (section 6.3) per block of 32 elements of a row (the last block may be
    partial: the spec's blocks are whole, and the missing elements count as zeros, which change
    no maximum): shared_exp = floor(log2(max |x|)) - 2 (2 = E2M1's emax), clamped to E8M0's
    [-127, 127] (only the lower bound can bind for 16- and 32-bit inputs: a block of zeros and a
    max below 2**-125 get -127, as in torch ao and Microsoft's microxcaling); X = 2**shared_exp;
    each element is (float)x * 2**-shared_exp in float32 (exact but for float32 underflow, far
    below E2M1's resolution), rounded to E2M1 by e2m1_encode (ties to even, saturating at +-6:
    the spec clamps normal values). The scale byte is shared_exp + 127.
    NaN and infinity: E8M0 and E2M1 have no infinity, and the spec decodes a block whose scale is
    NaN as all NaN; a block holding a NaN or +-inf gets scale 0xFF (NaN), as torch ao's to_mx and
    microxcaling give it (max |x| is NaN, or its exponent overflows E8M0), and element codes 0.
    """
    xf = _matrix(to_f32(x, dtype))
    amax = np.max(np.abs(_blocked(xf, MXFP4_BLOCK)), axis=2)
    special = ~np.isfinite(amax)
    _, e = np.frexp(np.where(special, 0, amax).astype(np.float64))  # floor(log2 amax) = e - 1
    shared = np.where(amax > 0, e - 1 - MXFP4_ELEM_EMAX, E8M0_EXP_RANGE[0])
    shared = np.clip(np.where(special, 0, shared), *E8M0_EXP_RANGE)
    scales = np.where(special, np.uint8(E8M0_NAN), (shared + E8M0_BIAS).astype(np.uint8))
    inv = np.ldexp(np.float32(1), -shared).astype(np.float32)   # 2**-shared: exact in float32
    cols_block = _block_of_col(xf.shape[1], MXFP4_BLOCK)
    codes = e2m1_encode(xf * inv[:, cols_block])
    codes[special[:, cols_block]] = 0
    return pack_fp4(codes), scales.astype(np.uint8)


def dequantize_mxfp4(packed, scales, cols, out_dtype):
    """packed MXFP4 [rows, (cols + 1) // 2] and E8M0 scales [rows, ceil(cols / 32)] -> values
    [rows, cols] in out_dtype's representation: e2m1_value * 2**(scale - 127) in float32 (exact,
    NaN for scale 0xFF; a product above the float32 range, only possible for scales a quantizer
    of 16- or 32-bit data never writes, is inf), then rounded to out_dtype."""
    codes = unpack_fp4(packed, cols)
    scales = _matrix(_require_dtype(np.asarray(scales), np.uint8, "mxfp4 scales"))
    _check_block_scales(scales, codes.shape[0], cols, MXFP4_BLOCK, "mxfp4 scales")
    with np.errstate(over="ignore"):
        values = E2M1_VALUES[codes] * e8m0_decode(scales)[:, _block_of_col(cols, MXFP4_BLOCK)]
    return to_dtype(values, out_dtype)


def import_gpt_oss_mxfp4(blocks, scales):
    """gpt-oss MXFP4 tensors -> (packed uint8 [R, 16 G], scales uint8 E8M0 [R, G]) in the layout
    of quantize_mxfp4.

    `<name>_blocks` uint8 [..., G, 16] and `<name>_scales` uint8 [..., G] (e.g. an expert's
    gate_up_proj: [E, 2I, H / 32, 16] and [E, 2I, H / 32]): the weight is [..., N, K] with the
    K = 32 G input features along the last two axes, block g holding k = 32 g .. 32 g + 31,
    element 2j of a block in the low nibble of byte j (transformers' convert_moe_packed_tensors:
    lut[blk & 0x0F] goes to the even positions) and scales[..., g] the biased exponent; the R rows
    are the leading axes flattened (E N for experts). That is the library's [N, K] layout byte
    for byte. (transformers dequantizes with ldexp(value, scale - 127), so it reads 0xFF as 2**128
    where the spec and this library read NaN.)
    """
    blocks = _require_dtype(np.asarray(blocks), np.uint8, "mxfp4 blocks")
    scales = _require_dtype(np.asarray(scales), np.uint8, "mxfp4 scales")
    if blocks.ndim < 2 or blocks.shape[-1] != MXFP4_BLOCK // 2 or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"blocks {blocks.shape} and scales {scales.shape} must be [..., G, 16] "
                         "and [..., G]")
    groups = scales.shape[-1]
    return (blocks.reshape(-1, groups * MXFP4_BLOCK // 2).copy(),
            scales.reshape(-1, groups).copy())


# ---- NVFP4 (two-level: E4M3 per 16 elements, float32 per tensor) ------------------------------
NVFP4_BLOCK = 16
NVFP4_SCALE_RANGE = np.float32(E4M3_MAX * E2M1_MAX)   # 2688: global_scale = 2688 / amax
_F32_SIXTH = _F32_ONE / np.float32(E2M1_MAX)           # float32(1/6), as the kernels multiply


def nvfp4_global_scale(x, dtype):
    """The per-tensor scale of x in `dtype`'s representation: float32 [1] =
    2688 / amax(|x|) (448 * 6: E4M3's max times E2M1's max, in float32; NaN ignored), the
    quantization-direction scale that TensorRT-LLM's kernels take (SFScaleVal) and that
    compressed-tensors stores as weight_global_scale; the block with the tensor's amax then gets
    the E4M3 scale 448. Where that is not a positive finite number (amax 0, amax so small that the
    quotient overflows, amax inf), 1, as compressed-tensors' generate_gparam falls back."""
    amax = np.max(np.abs(_nan_to_zero(_matrix(to_f32(x, dtype)))), initial=np.float32(0))
    with np.errstate(divide="ignore", over="ignore"):
        scale = NVFP4_SCALE_RANGE / amax
    return np.array([scale if np.isfinite(scale) and scale > 0 else _F32_ONE], dtype=np.float32)


def quantize_nvfp4(x, dtype, global_scale=None):
    """x [rows, cols] in `dtype`'s representation -> (packed uint8 [rows, (cols + 1) // 2],
    scales uint8 E4M3 [rows, ceil(cols / 16)], global_scale float32 [1]).

    g = global_scale (float32, positive and finite: a calibrated activation scale) or
    nvfp4_global_scale(x). Per block of 16 elements of a row (the last may be partial), every
    operation in float32, in the order of TensorRT-LLM's cvt_warp_fp16_to_fp4 and vLLM's
    ref_nvfp4_quant (with IEEE divisions where the kernels use approximate reciprocals):
        amax_b = max |x| over the block (NaN ignored)
        s      = g * (amax_b * float32(1/6))
        s8     = e4m3_encode(s)             (ties to even, saturating at 448)
        out    = 1 / (e4m3(s8) * (1 / g)),  or 0 where e4m3(s8) == 0
        code   = e2m1_encode((float)x * out) (ties to even, saturating at +-6)
    A block whose s rounds to 0 (s <= 2**-10, amax_b up to about 2**-10 * 6 / g) is all zeros, as
    in the kernels. NaN elements encode as 0; +-inf makes its block's scale 448 and saturates to +-6.
    ModelOpt's own quantizer orders the operations otherwise (s = amax_b / (6 * amax / 2688),
    x / (s8 * amax / 2688)), which can move a rounding: its checkpoints are imported as stored.
    """
    xf = _matrix(to_f32(x, dtype))
    if global_scale is None:
        g = nvfp4_global_scale(xf, "fp32")[0]
    else:
        g = _require_dtype(np.asarray(global_scale), np.float32, "global_scale").reshape(-1)
        if g.size != 1 or not (np.isfinite(g[0]) and g[0] > 0):
            raise ValueError(f"global_scale must be one positive finite float32, got {g}")
        g = g[0]
    amax = np.max(np.abs(_blocked(_nan_to_zero(xf), NVFP4_BLOCK)), axis=2)
    # A huge given scale overflows these float32 products to inf, as on the device: E4M3 and
    # E2M1 saturate.
    with np.errstate(over="ignore"):
        scales = e4m3_encode(g * (amax * _F32_SIXTH))
    scale_f32 = e4m3_decode(scales)
    with np.errstate(divide="ignore"):
        out = np.where(scale_f32 == 0, np.float32(0), _F32_ONE / (scale_f32 * (_F32_ONE / g)))
    with np.errstate(over="ignore"):
        codes = e2m1_encode(xf * out.astype(np.float32)[:, _block_of_col(xf.shape[1], NVFP4_BLOCK)])
    return pack_fp4(codes), scales, np.array([g], dtype=np.float32)


def dequantize_nvfp4(packed, scales, global_scale, cols, out_dtype):
    """packed NVFP4 [rows, (cols + 1) // 2], E4M3 scales [rows, ceil(cols / 16)] and the float32
    global_scale [1] -> values [rows, cols] in out_dtype's representation:
        block_scale = e4m3(scale) / global_scale   (float32)
        value       = e2m1_value * block_scale     (float32), then rounded to out_dtype
    the order of compressed-tensors' dequantization (scale / global_scale, then times the value)
    and of vLLM's reference, and the one a kernel uses: one division per block. (It is within
    1.5 float32 ulps of the exact e2m1 * e4m3 / g.)"""
    codes = unpack_fp4(packed, cols)
    scales = _matrix(_require_dtype(np.asarray(scales), np.uint8, "nvfp4 scales"))
    _check_block_scales(scales, codes.shape[0], cols, NVFP4_BLOCK, "nvfp4 scales")
    g = _require_dtype(np.asarray(global_scale), np.float32, "global_scale").reshape(-1)
    if g.size != 1:
        raise ValueError(f"global_scale is one float32, got {g.size} values")
    block_scale = e4m3_decode(scales) / g[0]
    return to_dtype(E2M1_VALUES[codes] * block_scale[:, _block_of_col(cols, NVFP4_BLOCK)],
                    out_dtype)


def _nvfp4_checkpoint(weight, weight_scale, what):
    weight = _matrix(_require_dtype(np.asarray(weight), np.uint8, what))
    weight_scale = _matrix(_require_dtype(np.asarray(weight_scale), np.uint8,
                                          "weight_scale (float8_e4m3fn viewed as uint8)"))
    cols = 2 * weight.shape[1]
    _check_block_scales(weight_scale, weight.shape[0], cols, NVFP4_BLOCK, "weight_scale")
    return weight.copy(), weight_scale.copy()


def import_nvfp4_compressed_tensors(weight_packed, weight_scale, weight_global_scale):
    """A compressed-tensors 'nvfp4-pack-quantized' weight -> (packed, scales, global_scale) in
    the layout of quantize_nvfp4, unchanged: `weight_packed` uint8 [N, K / 2] (element 2i in the
    low nibble, E2M1 codes), `weight_scale` float8_e4m3fn [N, K / 16] (pass its bytes as uint8)
    and `weight_global_scale` float32 [1], 2688 / amax, the quantization-direction scale that
    dequantize_nvfp4 divides by."""
    packed, scales = _nvfp4_checkpoint(weight_packed, weight_scale, "weight_packed")
    g = _require_dtype(np.asarray(weight_global_scale), np.float32, "weight_global_scale")
    if g.size != 1:
        raise ValueError(f"weight_global_scale is one float32, got {g.size} values")
    return packed, scales, g.reshape(1).copy()


def import_nvfp4_modelopt(weight, weight_scale, weight_scale_2):
    """A ModelOpt (TensorRT Model Optimizer) NVFP4 weight -> (packed, scales, global_scale):
    `weight` uint8 [N, K / 2] and `weight_scale` float8_e4m3fn [N, K / 16] as compressed-tensors
    lays them out, but `weight_scale_2` float32 = amax / 2688, the dequantization-direction scale
    (ModelOpt multiplies by it). global_scale = 1 / weight_scale_2 in float32: that reciprocal is
    rounded, so dequantize_nvfp4 of the import is within 3 float32 roundings (a relative 2**-22)
    of ModelOpt's value * e4m3 * weight_scale_2, not bitwise equal to it."""
    packed, scales = _nvfp4_checkpoint(weight, weight_scale, "weight")
    s2 = _require_dtype(np.asarray(weight_scale_2), np.float32, "weight_scale_2").reshape(-1)
    if s2.size != 1 or not (np.isfinite(s2[0]) and s2[0] > 0):
        raise ValueError(f"weight_scale_2 must be one positive finite float32, got {s2}")
    return packed, scales, (_F32_ONE / s2).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Weight-only GEMM on block 4-bit weights (ck_block4_prepack, ck_gemm_block4_prepacked)
# ---------------------------------------------------------------------------------------------
# The weight is an [N, K] matrix as quantize_nf4 / quantize_mxfp4 / quantize_nvfp4 write it
# (blocks along K). The GEMM multiplies by w' = dequantize_<format>(..., out_dtype=dtype): the
# format's float32 value * block scale, rounded to the activation dtype, the bits
# ck_dequantize_<format> writes (any scale: beyond the dtype's range it is +-inf there too).
# Then out = act(x w'^T + bias), exact here (float64) and rounded once; the library sums in
# float32.
BLOCK4_FORMATS = ("nf4", "mxfp4", "nvfp4")
BLOCK4_GEMM_DTYPES = ("fp16", "bf16")
BLOCK4_GEMM_BLOCK_SIZES = {"nf4": (32, 64, 128), "mxfp4": (MXFP4_BLOCK,), "nvfp4": (NVFP4_BLOCK,)}
BLOCK4_GEMM_K_MULTIPLE = 32
# Bytes of one prepacked scale unit: NF4 a float32 absmax, MXFP4 an E8M0 byte, NVFP4 the two
# E4M3 bytes of a 32-k slice.
BLOCK4_UNIT_BYTES = {"nf4": 4, "mxfp4": 1, "nvfp4": 2}
# The code of +0.0 that pads the prepacked codes.
BLOCK4_ZERO_CODE = {"nf4": NF4_ZERO_CODE, "mxfp4": 0, "nvfp4": 0}


def _check_block4(fmt, blocksize, k):
    if fmt not in BLOCK4_FORMATS:
        raise ValueError(f"format {fmt!r} is not one of {BLOCK4_FORMATS}")
    if blocksize not in BLOCK4_GEMM_BLOCK_SIZES[fmt]:
        raise ValueError(f"{fmt} blocksize={blocksize}: the GEMM reads "
                         f"{BLOCK4_GEMM_BLOCK_SIZES[fmt]}")
    if k < BLOCK4_GEMM_K_MULTIPLE or k % BLOCK4_GEMM_K_MULTIPLE or k % blocksize:
        raise ValueError(f"K={k} must be a positive multiple of 32 and of blocksize={blocksize}")


def block4_unit_group(fmt, blocksize):
    """k per prepacked scale unit: NF4's blocksize, 32 for MXFP4 and NVFP4."""
    return blocksize if fmt == "nf4" else PACK_SLICE_K


def block4_prepacked_sizes(fmt, n, k, blocksize):
    """(bytes of the prepacked codes, bytes of the prepacked scales) of an [N, K] weight."""
    _check_block4(fmt, blocksize, k)
    rows = -(-n // PACK_ROWS) * PACK_ROWS
    w_bytes = rows * (-(-k // PACK_K)) * PACK_K // 2
    return w_bytes, rows * (k // block4_unit_group(fmt, blocksize)) * BLOCK4_UNIT_BYTES[fmt]


def quantize_block4(fmt, x, dtype, blocksize):
    """(packed, scales, global_scale or None) of x [N, K] in `fmt`'s native storage:
    quantize_nf4 (blocksize), quantize_mxfp4 or quantize_nvfp4 (its own global scale)."""
    if fmt == "nf4":
        packed, absmax = quantize_nf4(x, dtype, blocksize)
        return packed, absmax, None
    if fmt == "mxfp4":
        packed, scales = quantize_mxfp4(x, dtype)
        return packed, scales, None
    return quantize_nvfp4(x, dtype)


def _block4_codes(fmt, packed, k):
    return unpack_nf4(packed, k) if fmt == "nf4" else unpack_fp4(packed, k)


def block4_prepack(fmt, packed, scales, n, k, blocksize):
    """ck_block4_prepack in NumPy: (w_prepacked uint8 [bytes], scales_prepacked uint8 [bytes])
    as cuda_kernels.h lays them out: the raw codes in the prepacked INT4 tiles (padding: the zero
    code), and one unit per (row, G k) in the INT4 scales' order [N8 / 8][K / G][8] (padding
    rows: zero bytes), little-endian."""
    _check_block4(fmt, blocksize, k)
    packed = _matrix(_require_dtype(np.asarray(packed), np.uint8, "packed"))
    codes = _block4_codes(fmt, packed, k).astype(np.int64)
    if codes.shape[0] != n:
        raise ValueError(f"packed has {codes.shape[0]} rows, n={n}")
    rows = -(-n // PACK_ROWS) * PACK_ROWS
    w_out = _prepack_codes(codes, n, k, BLOCK4_ZERO_CODE[fmt])

    units = k // block4_unit_group(fmt, blocksize)
    ub = BLOCK4_UNIT_BYTES[fmt]
    if fmt == "nf4":
        sv = _matrix(_require_dtype(np.asarray(scales), np.float32, "nf4 absmax"))
        _check_block_scales(sv, n, k, blocksize, "nf4 absmax")
        unit_bytes = sv.astype("<f4").view(np.uint8).reshape(n, units, ub)
    else:
        sv = _matrix(_require_dtype(np.asarray(scales), np.uint8, f"{fmt} scales"))
        _check_block_scales(sv, n, k, blocksize, f"{fmt} scales")
        unit_bytes = sv.reshape(n, units, ub)       # NVFP4: blocks 2j, 2j + 1 in that order
    s = np.zeros((rows, units, ub), np.uint8)
    s[:n] = unit_bytes
    s_out = s.reshape(rows // PACK_ROWS, PACK_ROWS, units, ub).transpose(0, 2, 1, 3)
    return w_out, s_out.reshape(-1).copy()


def dequantized_block4_weight(fmt, packed, scales, global_scale, k, blocksize, dtype):
    """The weight w' [N, K] that ck_gemm_block4_prepacked multiplies by, in `dtype`'s
    representation: dequantize_<fmt> with out_dtype = dtype (global_scale: NVFP4's, else None)."""
    _check_block4(fmt, blocksize, k)
    if fmt == "nf4":
        return dequantize_nf4(packed, scales, k, blocksize, dtype)
    if fmt == "mxfp4":
        return dequantize_mxfp4(packed, scales, k, dtype)
    return dequantize_nvfp4(packed, scales, global_scale, k, dtype)


def gemm_block4_f64(x, fmt, packed, scales, global_scale, blocksize, k, dtype=None, bias=None,
                    activation="none"):
    """ck_gemm_block4_prepacked in exact arithmetic: act(x[M, K] w'[N, K]^T + bias[N]) as
    float64 [M, N], w' = dequantized_block4_weight (rounded to dtype, as the kernels round it in
    registers). x and bias in `dtype`'s representation ('fp16' or 'bf16'; None infers it)."""
    dtype, x = _weight_only_x(x, k, dtype, BLOCK4_GEMM_DTYPES, "ck_gemm_block4_prepacked")
    w = dequantized_block4_weight(fmt, packed, scales, global_scale, k, blocksize, dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        return linear_f64(x, w, bias, activation, dtype)


def gemm_block4(x, fmt, packed, scales, global_scale, blocksize, k, dtype=None, bias=None,
                activation="none"):
    """ck_gemm_block4_prepacked, ideally: gemm_block4_f64 rounded once to the dtype."""
    dtype = dtype or dtype_of(x)
    return round_f64_to_dtype(gemm_block4_f64(x, fmt, packed, scales, global_scale, blocksize,
                                              k, dtype, bias, activation), dtype)


# ---------------------------------------------------------------------------------------------
# Attention (prefill, and split-KV decode over a contiguous or paged KV cache)
# ---------------------------------------------------------------------------------------------
# O = softmax(scale * q k^T, over the keys each query sees) v, per query head, in FlashAttention's
# conventions:
#   - q [total_q, Hq, D], k and v [total_k, Hkv, D] in the representation of 'fp16' or 'bf16',
#     D in ATTENTION_HEAD_DIMS; Hq a multiple of Hkv (GQA; MQA is Hkv = 1): query head h reads
#     kv head h // (Hq / Hkv).
#   - A batch is packed along the token axis with cumulative offsets cu_seqlens_q and
#     cu_seqlens_k (int32 [B + 1]: 0 first, non-decreasing, the token count last; sequence b
#     holds tokens cu[b] .. cu[b + 1] - 1 and may be empty), or has equal lengths, given as 4-D
#     q [B, Sq, Hq, D], k and v [B, Sk, Hkv, D]. No offsets and 3-D arrays: one sequence.
#   - The scale multiplies q.k inside the softmax. The kernels receive it as a float32, so the
#     references round it to float32 first; the default is 1 / sqrt(D), rounded so.
#   - Causal: query i of a sequence of Sq queries and Sk keys sees key j iff j <= i + Sk - Sq.
#     The mask's diagonal ends at the bottom right (FlashAttention >= 2.1): the queries are the
#     last Sq positions of the sequence. Non-causal: every query sees every key of its sequence.
#   - A query that sees no key (causal with i < Sq - Sk, or Sk = 0) has O = 0 and lse = -inf,
#     exactly: the kernels write those values.
#   - Outputs: O like q, the exact value (float64) rounded once to the dtype; lse [total_q, Hq]
#     (token-major, like O; [B, Sq, Hq] for 4-D q) float32 = ln(sum_j exp(scale * q.k_j)) over
#     the keys the query sees, the natural logarithm, computed as m + ln(sum_j exp(x_j - m)) with
#     m the row's largest x_j = scale * q.k_j, so that logits of any magnitude stay finite.
#
# Decode: q [B, Sq_new, Hq, D], 1 <= Sq_new <= 16, the LAST Sq_new positions of each sequence
# (their keys and values already in the cache), against
#   - a contiguous cache k_cache, v_cache [B, max_len, Hkv, D] with seqlens_k int32 [B],
#     0 <= seqlens_k[b] <= max_len: sequence b's keys are k_cache[b, :seqlens_k[b]]; or
#   - a paged cache k_pages, v_pages [num_pages, page_size, Hkv, D] with block_table int32
#     [B, max_pages_per_seq]: position t of sequence b lies at
#     k_pages[block_table[b, t // page_size], t % page_size], seqlens_k[b] <= max_pages_per_seq
#     * page_size. Only the entries of the ceil(seqlens_k[b] / page_size) pages a sequence uses
#     are read, and must lie in [0, num_pages).
# Nothing at or past position seqlens_k[b] is read (a cache may hold anything there, NaN too),
# nor the block_table entries past a sequence's pages. Decode is prefill of the new queries
# against the sequence's first seqlens_k[b] keys, causal (attention_decode_as_prefill); a
# sequence shorter than Sq_new leaves its first Sq_new - seqlens_k[b] queries without keys.
#
# Split-KV decode (flash-decoding): each sequence's keys are cut into num_splits ranges
# (attention_split_bounds); split s yields its normalized O_s and lse_s (lse_s = -inf for a
# query that sees no key of the split, whose O_s the combine does not read; the reference writes
# 0 there), and attention_combine merges them:
#     M = max_s lse_s,  w_s = exp(lse_s - M),  O = sum_s w_s O_s / sum_s w_s,
#     lse = M + ln(sum_s w_s),
# which is the unsplit O and lse in exact arithmetic. That is the contract of the kernel's
# workspace: float32 O_s [num_splits, B, Sq_new, Hq, D] and lse_s [num_splits, B, Sq_new, Hq].
ATTENTION_DTYPES = ("fp16", "bf16")
ATTENTION_HEAD_DIMS = (64, 96, 128, 256)
ATTENTION_DECODE_MAX_QUERIES = 16   # Sq_new of a decode call: 1 .. 16


def attention_cu_seqlens(lengths):
    """Sequence lengths [B] -> their int32 cumulative offsets [B + 1] (0 first), the packed
    layout's cu_seqlens."""
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if (lengths < 0).any():
        raise ValueError(f"sequence lengths must be >= 0, got {lengths.tolist()}")
    cu = np.concatenate([[0], np.cumsum(lengths)])
    if cu[-1] > np.iinfo(np.int32).max:
        raise ValueError(f"{cu[-1]} tokens do not fit int32 offsets")
    return cu.astype(np.int32)


def attention_mask(seqlen_q, seqlen_k, causal):
    """bool [Sq, Sk]: True where query i may attend to key j: everywhere, or (causal)
    j <= i + Sk - Sq, the diagonal aligned to the bottom right."""
    return _attention_allowed(seqlen_q, seqlen_k, seqlen_k - seqlen_q if causal else None)


def attention_forward_f64(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, softmax_scale=None,
                          causal=False, dtype=None):
    """The prefill attention in exact arithmetic (float64): (O float64 shaped like q, lse
    float64 [total_q, Hq], or [B, Sq, Hq] for 4-D q).

    q [total_q, Hq, D] and k, v [total_k, Hkv, D] with cu_seqlens_q, cu_seqlens_k (int32
    [B + 1]; both None: one sequence), or q [B, Sq, Hq, D] and k, v [B, Sk, Hkv, D] (equal
    lengths, no offsets), in dtype's representation ('fp16' or 'bf16'; None infers it from q).
    softmax_scale: a float, rounded to float32 (None: 1 / sqrt(D), rounded so). For query i and
    head h of a sequence, over the keys j it sees (attention_mask):
        x_j = scale * q_i.k_j (kv head h // (Hq / Hkv)),  m = max_j x_j,
        O = sum_j exp(x_j - m) v_j / sum_j exp(x_j - m),  lse = m + ln(sum_j exp(x_j - m));
    O = 0 and lse = -inf for a query that sees no key.
    """
    dtype, qf, kf, vf, cu_q, cu_k, scale = _attention_prepare(
        q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, dtype)
    o, lse = np.zeros(qf.shape), np.full(qf.shape[:2], -np.inf)
    for rows, keys, diagonal in _attention_sequences(cu_q, cu_k, causal):
        o[rows], lse[rows] = _attention_sequence_f64(qf[rows], kf[keys], vf[keys], scale, diagonal)
    shape = np.shape(q)
    return o.reshape(shape), lse.reshape(shape[:-1])


def attention_forward(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, softmax_scale=None,
                      causal=False, dtype=None):
    """The prefill attention the kernels compute, ideally: (O in dtype's representation, shaped
    like q; lse float32 [total_q, Hq], or [B, Sq, Hq] for 4-D q): attention_forward_f64's values
    rounded once (O to the dtype, lse to float32). The kernels' float32 arithmetic is within
    attention_error_bound of the float64 values, not bitwise equal to these."""
    dtype = dtype or dtype_of(q)
    o, lse = attention_forward_f64(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal,
                                   dtype)
    return round_f64_to_dtype(o, dtype), lse.astype(np.float32)


def attention_gather_paged_kv(pages, block_table, seqlens_k):
    """A paged cache k_pages or v_pages [num_pages, page_size, Hkv, D] -> the contiguous cache
    [B, max_pages_per_seq * page_size, Hkv, D] in the same representation.

    Position t < seqlens_k[b] of sequence b is pages[block_table[b, t // page_size],
    t % page_size]; positions at or past seqlens_k[b] are 0. Only the block_table entries of the
    ceil(seqlens_k[b] / page_size) pages a sequence uses are read (they must lie in
    [0, num_pages)), and of those pages only the positions below seqlens_k[b].
    """
    pages = np.asarray(pages)
    if pages.ndim != 4:
        raise ValueError(f"pages must be [num_pages, page_size, Hkv, D], got shape {pages.shape}")
    num_pages, page_size = pages.shape[:2]
    table = _require_dtype(np.asarray(block_table), np.int32, "block_table")
    if table.ndim != 2:
        raise ValueError(f"block_table must be [B, max_pages_per_seq], got shape {table.shape}")
    batch, max_pages = table.shape
    seqlens = _attention_seqlens(seqlens_k, batch, max_pages * page_size,
                                 f"max_pages_per_seq * page_size = {max_pages} * {page_size}")
    out = np.zeros((batch, max_pages * page_size) + pages.shape[2:], pages.dtype)
    for b, n in enumerate(seqlens):
        used = table[b, :block_count(n, page_size)]
        bad = np.flatnonzero((used < 0) | (used >= num_pages))
        if bad.size:
            p = bad[0]
            raise ValueError(f"block_table[{b}, {p}] = {used[p]} (a page of sequence {b}'s {n} "
                             f"tokens) is outside [0, num_pages={num_pages})")
        out[b, :n] = pages[used].reshape((-1,) + pages.shape[2:])[:n]
    return out


def attention_decode_as_prefill(q, k_cache, v_cache, seqlens_k, block_table=None):
    """A decode call in the packed prefill layout: (q [B * Sq_new, Hq, D], k and v
    [sum(seqlens_k), Hkv, D], cu_seqlens_q, cu_seqlens_k), in the inputs' representation.

    q [B, Sq_new, Hq, D] (1 <= Sq_new <= 16); k_cache, v_cache [B, max_len, Hkv, D] with
    seqlens_k int32 [B], or the pages [num_pages, page_size, Hkv, D] of a paged cache with
    block_table int32 [B, max_pages_per_seq] (gathered by attention_gather_paged_kv). Sequence b
    keeps its first seqlens_k[b] keys and values. The decode's O and lse are
    attention_forward(_f64) of these with causal=True, reshaped to [B, Sq_new, ...].
    """
    q, k_cache, v_cache = np.asarray(q), np.asarray(k_cache), np.asarray(v_cache)
    if q.ndim != 4 or k_cache.ndim != 4:
        raise ValueError(f"decode takes q [B, Sq_new, Hq, D] and a cache [B, max_len, Hkv, D] "
                         f"or pages [num_pages, page_size, Hkv, D]; got q {q.shape}, "
                         f"k {k_cache.shape}")
    _attention_dims(q.shape, k_cache.shape, v_cache.shape)
    batch, sq_new = q.shape[:2]
    if not 1 <= sq_new <= ATTENTION_DECODE_MAX_QUERIES:
        raise ValueError(f"decode takes Sq_new = 1 .. {ATTENTION_DECODE_MAX_QUERIES} new queries "
                         f"per sequence, got {sq_new}")
    what = "the cache"
    if block_table is not None:
        k_cache = attention_gather_paged_kv(k_cache, block_table, seqlens_k)
        v_cache = attention_gather_paged_kv(v_cache, block_table, seqlens_k)
        what = "block_table"
    if k_cache.shape[0] != batch:
        raise ValueError(f"q has B = {batch} sequences, {what} {k_cache.shape[0]}")
    seqlens = _attention_seqlens(seqlens_k, batch, k_cache.shape[1], "max_len")
    kept = np.arange(k_cache.shape[1])[None, :] < seqlens[:, None]
    return (q.reshape((batch * sq_new,) + q.shape[2:]), k_cache[kept], v_cache[kept],
            attention_cu_seqlens(np.full(batch, sq_new)), attention_cu_seqlens(seqlens))


def attention_decode_f64(q, k_cache, v_cache, seqlens_k, block_table=None, softmax_scale=None,
                         dtype=None):
    """The decode attention in exact arithmetic: (O float64 [B, Sq_new, Hq, D], lse float64
    [B, Sq_new, Hq]): attention_forward_f64 of attention_decode_as_prefill's arrays, causal
    (query t of sequence b sits at position seqlens_k[b] - Sq_new + t and sees the keys at
    positions up to it). The cache is contiguous, or paged when block_table is given."""
    q = np.asarray(q)
    qp, kp, vp, cu_q, cu_k = attention_decode_as_prefill(q, k_cache, v_cache, seqlens_k,
                                                         block_table)
    o, lse = attention_forward_f64(qp, kp, vp, cu_q, cu_k, softmax_scale, True, dtype)
    return o.reshape(q.shape), lse.reshape(q.shape[:3])


def attention_decode(q, k_cache, v_cache, seqlens_k, block_table=None, softmax_scale=None,
                     dtype=None):
    """The decode attention the kernels compute, ideally: attention_decode_f64 rounded once
    (O [B, Sq_new, Hq, D] to the dtype, lse [B, Sq_new, Hq] to float32)."""
    dtype = dtype or dtype_of(q)
    o, lse = attention_decode_f64(q, k_cache, v_cache, seqlens_k, block_table, softmax_scale,
                                  dtype)
    return round_f64_to_dtype(o, dtype), lse.astype(np.float32)


def attention_split_bounds(seqlen, num_splits, block_n=1):
    """int64 [num_splits + 1]: split s covers the key positions bounds[s] .. bounds[s + 1] - 1
    of a sequence of seqlen keys. Splits deal whole blocks of block_n keys, as FlashAttention's
    split-KV kernel does: each holds c = ceil(ceil(seqlen / block_n) / num_splits) * block_n
    keys, in order, the last non-empty one the rest, and the splits after it are empty: all
    of them for seqlen = 0, some whenever num_splits > ceil(seqlen / block_n), and sometimes
    when not (9 blocks in 4 splits: 3, 3, 3 and 0 blocks)."""
    _attention_check_splits(num_splits, block_n)
    per_split = block_count(block_count(int(seqlen), block_n), num_splits) * block_n
    return np.minimum(np.arange(num_splits + 1, dtype=np.int64) * per_split, int(seqlen))


def attention_split_partials(q, k_cache, v_cache, seqlens_k, num_splits, block_table=None,
                             softmax_scale=None, dtype=None, block_n=1):
    """The split-KV decode's partial results in exact arithmetic: (O_s float64 [num_splits, B,
    Sq_new, Hq, D], lse_s float64 [num_splits, B, Sq_new, Hq]).

    Arguments as attention_decode_f64's. Split s of sequence b holds the keys at positions
    attention_split_bounds(seqlens_k[b], num_splits, block_n)[s] .. [s + 1] - 1; O_s and lse_s
    are the attention of the new queries to those keys alone, with the decode's causal mask
    (absolute positions), normalized within the split: 0 and -inf for a query that sees none of
    them (an empty split, or one wholly after the query). attention_combine of them is the
    unsplit decode.
    """
    _attention_check_splits(num_splits, block_n)
    q = np.asarray(q)
    qp, kp, vp, cu_q, cu_k = attention_decode_as_prefill(q, k_cache, v_cache, seqlens_k,
                                                         block_table)
    _, qf, kf, vf, _, _, scale = _attention_prepare(qp, kp, vp, cu_q, cu_k, softmax_scale, dtype)
    sq_new = q.shape[1]
    o = np.zeros((num_splits,) + qf.shape)
    lse = np.full((num_splits,) + qf.shape[:2], -np.inf)
    for b in range(q.shape[0]):
        rows = slice(b * sq_new, (b + 1) * sq_new)
        seqlen = int(cu_k[b + 1] - cu_k[b])
        bounds = attention_split_bounds(seqlen, num_splits, block_n) + cu_k[b]
        for s in range(num_splits):
            keys = slice(bounds[s], bounds[s + 1])
            # Query t sits at position seqlen - Sq_new + t and sees key position lo + j iff
            # j - t <= seqlen - Sq_new - lo.
            diagonal = seqlen - sq_new - int(bounds[s] - cu_k[b])
            o[s, rows], lse[s, rows] = _attention_sequence_f64(qf[rows], kf[keys], vf[keys],
                                                               scale, diagonal)
    return o.reshape((num_splits,) + q.shape), lse.reshape((num_splits,) + q.shape[:3])


def attention_combine(partials_o, partials_lse):
    """The split-KV combine: partials O_s [num_splits, ..., D] and lse_s [num_splits, ...] (any
    float arrays: the float32 workspace or attention_split_partials' values) -> (O float64
    [..., D], lse float64 [...]), in float64:
        M = max_s lse_s,  w_s = exp(lse_s - M),  O = sum_s w_s O_s / sum_s w_s,
        lse = M + ln(sum_s w_s).
    A split with lse_s = -inf contributes nothing, whatever its O_s holds (a kernel need not
    write it); where every split has lse_s = -inf, O = 0 and lse = -inf."""
    o = np.asarray(partials_o, dtype=np.float64)
    lse = np.asarray(partials_lse, dtype=np.float64)
    if o.ndim < 2 or o.shape[0] < 1 or lse.shape != o.shape[:-1]:
        raise ValueError(f"partials_o {o.shape} and partials_lse {lse.shape} must be "
                         "[num_splits >= 1, ..., D] and [num_splits, ...]")
    top = lse.max(axis=0)
    seen = top > -np.inf
    w = np.exp(lse - np.where(seen, top, 0))    # 0 for a split without keys
    total = w.sum(axis=0)
    out = np.zeros(o.shape[1:])
    with np.errstate(invalid="ignore"):     # 0 * inf in a split that is left out
        weighted = np.where(w[..., None] > 0, w[..., None] * o, 0).sum(axis=0)
    out[seen] = weighted[seen] / total[seen][:, None]
    out_lse = np.full(top.shape, -np.inf)
    out_lse[seen] = top[seen] + np.log(total[seen])
    return out, out_lse


# ---- Work and traffic -------------------------------------------------------------------------
def attention_allowed_pairs(seqlen_q, seqlen_k, causal):
    """The (query, key) pairs one sequence computes: Sq * Sk, or causal
    sum_i clamp(i + Sk - Sq + 1, 0, Sk) = 1 + 2 + ... + Sk less 1 + ... + (c0 - 1), where
    c0 = max(1, Sk - Sq + 1) is the key count of the first query that sees a key. A Python int."""
    sq, sk = int(seqlen_q), int(seqlen_k)
    if sq < 0 or sk < 0:
        raise ValueError(f"sequence lengths must be >= 0, got Sq={sq}, Sk={sk}")
    if not causal:
        return sq * sk
    c0 = max(1, sk - sq + 1)
    return (sk * (sk + 1) - (c0 - 1) * c0) // 2


def attention_flops(seqlens_q, seqlens_k, num_heads_q, head_dim, causal):
    """The floating-point operations of an attention forward: 4 * D * Hq * sum_b
    attention_allowed_pairs(Sq_b, Sk_b, causal) (q.k and p * v: 2 D each per pair; the softmax
    is not counted). Non-causal with equal lengths that is 4 B Hq Sq Sk D. Python int."""
    seqlens_q = np.asarray(seqlens_q).reshape(-1)
    seqlens_k = np.asarray(seqlens_k).reshape(-1)
    if seqlens_q.shape != seqlens_k.shape:
        raise ValueError(f"seqlens_q has {seqlens_q.size} lengths, seqlens_k {seqlens_k.size}")
    pairs = sum(attention_allowed_pairs(sq, sk, causal) for sq, sk in zip(seqlens_q, seqlens_k))
    return 4 * int(head_dim) * int(num_heads_q) * pairs


def attention_decode_kv_bytes(seqlens_k, num_heads_kv, head_dim, dtype, kv_format=None,
                              per_token=False):
    """The K and V bytes a decode call reads at least: sum_b seqlens_k[b] * Hkv * D * 2 (K and V)
    * the dtype's size, the floor its memory bandwidth is measured against. A quantized cache
    (kv_format 'fp8_e4m3' or 'int8') reads 1 byte per element, and with per-token scales the
    float32 key and value scale of every row (8 bytes per key and kv head). A Python int."""
    itemsize = 1 if kv_format else np.dtype(_numpy_dtype(dtype)).itemsize
    tokens = sum(int(n) for n in np.asarray(seqlens_k).reshape(-1))
    row_bytes = int(head_dim) * itemsize + (4 if kv_format and per_token else 0)
    return tokens * int(num_heads_kv) * row_bytes * 2


# ---- Quantized KV cache -----------------------------------------------------------------------
# A cache of 8-bit codes (cuda_kernels.h, "Quantized KV cache"): a row (one key or one value of
# one kv head at one position, D elements) means codes x scale. Formats: 'fp8_e4m3' (uint8
# E4M3 bytes) and 'int8' (int8 codes in [-127, 127]). Scales, float32: per head (static, [Hkv])
# or per token (one per row: the cache's shape without D), the latter computed from the row as
# quantize_fp8 / quantize_int8 do per row. The codes of a row x are those quantizers' codes.
KV_FORMATS = ("fp8_e4m3", "int8")


def _check_kv_format(fmt):
    if fmt not in KV_FORMATS:
        raise ValueError(f"unknown KV cache format {fmt!r} (use one of {KV_FORMATS})")


def kv_cache_quantize(x, dtype, fmt, scales=None):
    """Rows of a KV cache: x [..., Hkv, D] in dtype's representation -> (codes like x, uint8 E4M3
    bytes or int8; scales float32). Per token (scales None): one scale per row, shaped
    x.shape[:-1], amax / FMAX (448 or 127; NaN ignored), 0 -> 1 (and for E4M3 a subnormal one
    -> 1). Per head: scales float32 [Hkv] given (finite, > 0) and returned."""
    _check_kv_format(fmt)
    x = np.asarray(x)
    rows = x.reshape(-1, x.shape[-1])
    row_scales = None
    if scales is not None:
        scales = _require_dtype(np.asarray(scales), np.float32, "per-head scales")
        if scales.shape != x.shape[-2:-1]:
            raise ValueError(f"per-head scales must be [Hkv={x.shape[-2]}], got {scales.shape}")
        row_scales = np.broadcast_to(scales, x.shape[:-1]).reshape(-1)
    if fmt == "int8":
        codes, got = quantize_int8(rows, dtype, "row", row_scales)
    else:
        codes, got = quantize_fp8(rows, dtype, "e4m3", "row", row_scales)
    return codes.reshape(x.shape), (got.reshape(x.shape[:-1]) if scales is None else scales)


def kv_cache_dequantize(codes, scales, fmt):
    """codes [..., Hkv, D] (uint8 E4M3 bytes or int8) and their scales (per token, shaped
    codes.shape[:-1], or per head [Hkv]) -> the rows' values codes x scale, float64 (exact)."""
    _check_kv_format(fmt)
    codes = np.asarray(codes)
    if fmt == "int8":
        values = _require_dtype(codes, np.int8, "int8 codes").astype(np.float64)
    else:
        values = fp8_decode(_require_dtype(codes, np.uint8, "E4M3 codes"), "e4m3")
    scales = np.asarray(scales, np.float64)
    if scales.shape not in (codes.shape[:-1], codes.shape[-2:-1]):
        raise ValueError(f"scales of shape {scales.shape} fit neither per token "
                         f"{codes.shape[:-1]} nor per head {codes.shape[-2:-1]}")
    with np.errstate(invalid="ignore"):   # NaN codes
        return np.asarray(values, np.float64) * scales[..., None]


def kv_cache_append(k, v, slot_mapping, k_cache, v_cache, dtype, fmt=None, k_scale=None,
                    v_scale=None, per_token=False):
    """ck_kv_cache_append on copies: the new rows k, v [tokens, Hkv, D] (dtype's
    representation) written to the slots slot_mapping (int64 [tokens]; outside [0, num_slots):
    skipped) of k_cache, v_cache [num_slots, Hkv, D]: the values as they are (fmt None), or
    kv_cache_quantize's codes with per-head scales k_scale, v_scale [Hkv] (read) or per-token
    scales [num_slots, Hkv] (the slots' rows written). Returns (k_cache, v_cache, k_scale,
    v_scale), new arrays (the scales as given where they are per head or None)."""
    slots = _require_dtype(np.asarray(slot_mapping), np.int64, "slot_mapping").reshape(-1)
    k_cache, v_cache = np.array(k_cache), np.array(v_cache)
    kept = (slots >= 0) & (slots < k_cache.shape[0])
    outs = [k_cache, v_cache]
    scales = [k_scale, v_scale]
    for i, new in enumerate((k, v)):
        new = np.asarray(new)[kept]
        if fmt is None:
            outs[i][slots[kept]] = new
            continue
        if per_token:
            codes, row_scales = kv_cache_quantize(new, dtype, fmt)
            scales[i] = np.array(scales[i])
            scales[i][slots[kept]] = row_scales
        else:
            codes, _ = kv_cache_quantize(new, dtype, fmt, scales[i])
        outs[i][slots[kept]] = codes
    return outs[0], outs[1], scales[0], scales[1]


# ---- Error bound of a kernel ------------------------------------------------------------------
# The kernel model is FlashAttention-2's forward. Per query row, keys in blocks of block_n:
# s = q.k on tensor cores (float32 sums of the exact fp16/bf16 products), x = scale * s, an
# online softmax in float32 (running max m, p = exp(x - m), the row sum l and the accumulator
# rescaled by exp(m_old - m_new) when m grows), P rounded to the dtype before P V on tensor
# cores (float32 sums), l summed from the unrounded float32 p; at the end O = acc / l, rounded to
# the dtype, and lse = m + ln(l). A split-KV kernel runs that per split and merges the float32
# partials as attention_combine does. exp and ln may be the fast approximations (ex2.approx,
# lg2.approx), and may flush results below FLT_MIN = 2^-126 to zero.
#
# Exact quantities of one row (a query and a head), over the keys j it sees: x_j = scale q.k_j,
# a_j = |scale| sum_d |q_d k_jd|, X = max_j |x_j|, m = max_j x_j, p_j = exp(x_j - m), L = sum p_j,
# w_j = p_j / L, O = sum_j w_j v_j; Sk = the sequence's key count. u = 2^-24 (float32),
# u_mma = 2u (tensor cores may truncate: Fasi et al., "Numerical behavior of NVIDIA tensor
# cores", 2021), gamma(n) = n u_mma / (1 - n u_mma) (Higham, "Accuracy and Stability of
# Numerical Algorithms", Thm. 3.1); u_d = 2^-11 (fp16) or 2^-8 (bf16), tiny_d = 2^-14 or 2^-126
# the dtype's smallest normal; E_exp = 2^-22 (2 float32 ulps), E_log = 2^-21 (absolute).
#
# 1. Exponents. The kernel's weight of key j is c p_j exp(e_j), c common to the row, with
#        |e_j| <= tau_j = gamma(D) a_j + 24 u W + (nb + 1) E_exp  [+ gamma(n) + E_log with splits],
#    W = X + ln(Sk) (>= |lse| and |x_j - m| / 2), nb = ceil(Sk / block_n) + num_splits (the
#    exps: one per key, one per rescaling, one per split). gamma(D) a_j is the float32 dot
#    product. 24 u W covers the roundings of the scaling, of x - m, of a multiplication by
#    log2(e) and of that constant (6 u X at most); those of the rescalings, whose differences of
#    maxima telescope to at most 2X (6 u X); with splits, those of lse_s and of lse_s - M
#    (8 u W), whose sum l_s adds gamma(n) and its logarithm E_log. c cancels in O, so take the
#    weights relative to the row's largest key t: p_j exp(eps_j) with eps_t = 0 and
#    |eps_j| <= tau'_j = tau_j + tau_t for the others (tau'_t = 0).
# 2. Softmax. O' = sum_j p_j e^{eps_j} v_j / sum_j p_j e^{eps_j} = O + sum_{j != t} p_j
#    (e^{eps_j} - 1) (v_j - O) / sum_j p_j e^{eps_j}, hence with L_lo = sum_j p_j e^{-tau'_j}
#    (>= p_t = 1):
#        E_soft = sum_j p_j (e^{tau'_j} - 1) (|v_j| + |O|) / L_lo,
#    which vanishes when the softmax is one-hot (large logits), however large tau_t is.
# 3. P rounded to the dtype. In the kernel's frame p <= 1 (relative to the running maximum;
#    later rescalings only shrink it), |fl_d(p) - p| <= u_d max(p, tiny_d), a flushed exp loses
#    FLT_MIN at most, and the kernel's l >= 1 (its largest key contributes exp(0) = 1). The row
#    sum l adds the unrounded p (as FlashAttention does): the mismatch is this term.
#        E_P = u_d V_hi + (u_d tiny_d + FLT_MIN) sum_j |v_j|,
#        V_hi = sum_j p_j e^{tau'_j} |v_j| / L_lo.
# 4. float32 accumulation. Each product p v is exact; it goes through at most
#    n = Sk + nb + num_splits roundings (additions, rescalings, the split's weight), as does l:
#        E_acc = (2 gamma(n) + 4u) V_abs,
#        V_abs = (1 + u_d) V_hi + (u_d tiny_d + FLT_MIN) sum_j |v_j|,
#    4u for the division by l, the stored partial O_s, its weight and the final division (a
#    single pass that multiplies by the correctly rounded 1 / l instead rounds twice: 2u).
# Bound: |O_kernel - O| <= E + ulp_d(|O| + E) / 2 with E = SLACK (E_soft + E_P + E_acc) (the
# kernel rounds its float32 O to the dtype once), and
#        |lse_kernel - lse| <= SLACK (ln(sum_j w_j e^{tau_j}) + 2 gamma(n) + 2 E_log + 8 u W)
# (c does not cancel in lse: the argument errors move ln(l) by at most ln(sum_j w_j e^{tau_j});
# then the sums, ln, and the float32 roundings of m + ln(l) and of the combine). SLACK absorbs
# the second-order terms. A worst case: measured errors are smaller (P's roundings and the
# float32 sums partly cancel). For logits of order 1 the bound is a few ulps of the output for
# fp16 and mainly P's rounding for bf16; a wrong mask or a wrong kv head moves O by far more.
# A quantized cache (v_scales) multiplies S by the keys' scales (one rounding more of x, within
# the 24 u W) and each p by its value's scale before P's rounding (u more in E_P, whose absolute
# part then counts in units of the codes, |v_j| / s_j, which multiply p in P V).
ATTENTION_F32_ROUNDOFF = F32_ROUNDOFF
ATTENTION_MMA_ROUNDOFF = 2 * ATTENTION_F32_ROUNDOFF
ATTENTION_EXP_ERROR = 2.0**-22
ATTENTION_LOG_ERROR = 2.0**-21
ATTENTION_ARGUMENT_ROUNDINGS = 24
ATTENTION_SECOND_ORDER_SLACK = 1.01
ATTENTION_FLT_MIN = 2.0**-126
_ATTENTION_SMALLEST_NORMAL = {"fp16": 2.0**-14, "bf16": 2.0**-126}


def attention_error_bound(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, softmax_scale=None,
                          causal=False, dtype=None, block_n=64, num_splits=1, v_scales=None):
    """The bounds a kernel's outputs must meet (the derivation is in the comment above):
    (o_tol float64 shaped like O, lse_tol float64 shaped like lse) with

        |O_kernel - O| <= o_tol  and  |lse_kernel - lse| <= lse_tol  element by element,

    O and lse those of attention_forward_f64 (the exact values, not the rounded ones; O_kernel
    as the dtype's values). Arguments as attention_forward_f64's, plus block_n, the smallest key
    block the kernel processes at once (a rescaling at most per block), and num_splits, the
    splits of a split-KV kernel (1: a single pass). A decode kernel is checked on
    attention_decode_as_prefill's arrays with causal=True. Where a query sees no key both bounds
    are 0: the kernel must write O = 0 and lse = -inf exactly.
    v_scales: for a quantized cache (k, v the float64 values of codes x scales), the scale of
    every value row, shaped like v without its last axis: the kernel multiplies each p by its
    value's scale before rounding it to the dtype (and P V runs on the codes).
    """
    _attention_check_splits(num_splits, block_n)
    dtype, qf, kf, vf, cu_q, cu_k, scale = _attention_prepare(
        q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, dtype)
    hq, hkv = qf.shape[1], kf.shape[1]
    vs = None if v_scales is None else np.broadcast_to(
        np.asarray(v_scales, np.float64), np.shape(v)[:-1]).reshape(-1, hkv)
    o_tol, lse_tol = np.zeros(qf.shape), np.zeros(qf.shape[:2])
    for rows, keys, diagonal in _attention_sequences(cu_q, cu_k, causal):
        allowed = _attention_allowed(rows.stop - rows.start, keys.stop - keys.start, diagonal)
        for h in range(hq):
            g = h // (hq // hkv)
            o_tol[rows, h], lse_tol[rows, h] = _attention_head_bound(
                qf[rows, h], kf[keys, g], vf[keys, g], scale, allowed, dtype, block_n,
                num_splits, None if vs is None else vs[keys, g])
    shape = np.shape(q)
    return o_tol.reshape(shape), lse_tol.reshape(shape[:-1])


def _attention_gamma(n):
    if n * ATTENTION_MMA_ROUNDOFF >= 1:
        raise ValueError(f"no float32 error bound for sums of {n} terms")
    return n * ATTENTION_MMA_ROUNDOFF / (1 - n * ATTENTION_MMA_ROUNDOFF)


def _attention_head_bound(qh, kh, vh, scale, allowed, dtype, block_n, num_splits, vs=None):
    """attention_error_bound for one head of one sequence: q [Sq, D], k and v [Sk, D] (float64),
    the mask [Sq, Sk], the values' scales [Sk] or None -> (o_tol [Sq, D], lse_tol [Sq])."""
    sq, d = qh.shape
    sk = kh.shape[0]
    o_tol, lse_tol = np.zeros((sq, d)), np.zeros(sq)
    x, m, p = _attention_logits(qh, kh, scale, allowed)
    seen = m > -np.inf
    if not seen.any():
        return o_tol, lse_tol
    x, m, p, allowed = x[seen], m[seen], p[seen], allowed[seen]
    u, u_d = ATTENTION_F32_ROUNDOFF, 2.0**-_PRECISION[dtype][0]
    blocks = block_count(sk, block_n) + num_splits
    n = sk + blocks + num_splits
    width = np.max(np.where(allowed, np.abs(x), 0), axis=1) + np.log(sk)
    tau = (_attention_gamma(d) * abs(scale) * (np.abs(qh[seen]) @ np.abs(kh).T)
           + (ATTENTION_ARGUMENT_ROUNDINGS * u * width)[:, None]
           + (blocks + 1) * ATTENTION_EXP_ERROR)
    if num_splits > 1:
        tau += _attention_gamma(n) + ATTENTION_LOG_ERROR
    rows, top = np.arange(x.shape[0]), np.argmax(x, axis=1)
    tau_rel = tau + tau[rows, top][:, None]
    tau_rel[rows, top] = 0                                # tau'
    with np.errstate(over="ignore", invalid="ignore"):   # a huge tau: an infinite bound
        hi = np.exp(x - m[:, None] + tau_rel)             # p_j e^{tau'_j}, 0 where masked
        lo = np.exp(x - m[:, None] - tau_rel).sum(axis=1)     # L_lo
        total = p.sum(axis=1)
        o = p @ vh / total[:, None]
        absv = np.abs(vh)
        spread = hi - p                                   # p_j (e^{tau'_j} - 1)
        e_soft = (spread @ absv + np.abs(o) * spread.sum(axis=1)[:, None]) / lo[:, None]
        v_hi = hi @ absv / lo[:, None]
        # P's absolute roundings count in units of what multiplies p in P V: the value, or its
        # codes (|v_j| / s_j) where p carries the value's scale s_j, whose product adds u.
        absv_p = absv if vs is None else absv / vs[:, None]
        flushed = ((u_d * _ATTENTION_SMALLEST_NORMAL[dtype] + ATTENTION_FLT_MIN)
                   * (allowed @ absv_p))
        e_p = (u_d if vs is None else u_d + u) * v_hi + flushed
        e_acc = (2 * _attention_gamma(n) + 4 * u) * ((1 + u_d) * v_hi + flushed)
        err = ATTENTION_SECOND_ORDER_SLACK * (e_soft + e_p + e_acc)
        err = np.where(np.isnan(err), np.inf, err)
        o_tol[seen] = err + 0.5 * ulp(np.abs(o) + err, dtype)
        lse_err = (np.log(np.exp(x - m[:, None] + tau).sum(axis=1) / total)
                   + 2 * _attention_gamma(n) + 2 * ATTENTION_LOG_ERROR + 8 * u * width)
        lse_tol[seen] = ATTENTION_SECOND_ORDER_SLACK * np.where(np.isnan(lse_err), np.inf,
                                                                lse_err)
    return o_tol, lse_tol


# ---- Attention helpers ------------------------------------------------------------------------
def _attention_allowed(seqlen_q, seqlen_k, diagonal):
    """bool [Sq, Sk]: query i sees key j iff j - i <= diagonal (everywhere for None)."""
    if diagonal is None:
        return np.ones((seqlen_q, seqlen_k), dtype=bool)
    return np.arange(seqlen_k)[None, :] - np.arange(seqlen_q)[:, None] <= diagonal


def _attention_logits(qh, kh, scale, allowed):
    """One head: q [Sq, D], k [Sk, D] (float64), the mask [Sq, Sk] -> (x = scale q k^T [Sq, Sk]
    with -inf where masked, its row maxima m (-inf for a row without keys), p = exp(x - m),
    0 where masked and on such a row)."""
    x = np.where(allowed, scale * (qh @ kh.T), -np.inf)
    m = np.max(x, axis=1, initial=-np.inf)
    p = np.exp(x - np.where(m > -np.inf, m, 0)[:, None])
    return x, m, p


def _attention_sequence_f64(q, k, v, scale, diagonal):
    """One sequence: q [Sq, Hq, D], k and v [Sk, Hkv, D] (float64) -> (O [Sq, Hq, D], lse
    [Sq, Hq]) float64; query i sees key j iff j - i <= diagonal (every key for None)."""
    seqlen_q, hq, d = q.shape
    group = hq // k.shape[1]
    allowed = _attention_allowed(seqlen_q, k.shape[0], diagonal)
    o, lse = np.zeros((seqlen_q, hq, d)), np.full((seqlen_q, hq), -np.inf)
    for h in range(hq):
        _, m, p = _attention_logits(q[:, h], k[:, h // group], scale, allowed)
        seen = m > -np.inf
        total = p[seen].sum(axis=1)
        o[seen, h] = p[seen] @ v[:, h // group] / total[:, None]
        lse[seen, h] = m[seen] + np.log(total)
    return o, lse


def _attention_sequences(cu_q, cu_k, causal):
    """(query rows, key rows, mask diagonal) of each sequence of a packed batch."""
    for b in range(cu_q.size - 1):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        diagonal = (cu_k[b + 1] - cu_k[b]) - (cu_q[b + 1] - cu_q[b]) if causal else None
        yield rows, keys, diagonal


def _attention_dims(q_shape, k_shape, v_shape):
    """Checks the heads and the head dim of q [..., Hq, D], k and v [..., Hkv, D]."""
    if tuple(k_shape) != tuple(v_shape):
        raise ValueError(f"k {tuple(k_shape)} and v {tuple(v_shape)} must have the same shape")
    if len(q_shape) < 2 or len(k_shape) < 2:
        raise ValueError(f"q {tuple(q_shape)} and k {tuple(k_shape)} need [..., heads, D]")
    hq, d = q_shape[-2:]
    hkv, dk = k_shape[-2:]
    if dk != d:
        raise ValueError(f"q's head dim D={d} differs from k's and v's, {dk}")
    if d not in ATTENTION_HEAD_DIMS:
        raise ValueError(f"head dim D={d} is not one of {ATTENTION_HEAD_DIMS}")
    if hkv < 1 or hq < 1 or hq % hkv:
        raise ValueError(f"Hq={hq} query heads must be a positive multiple of Hkv={hkv} kv heads")


def _attention_cu(cu, total, what):
    """Checks cumulative offsets (int32 [B + 1], 0 first, non-decreasing, `total` last)."""
    cu = _require_dtype(np.asarray(cu), np.int32, what)
    if cu.ndim != 1 or cu.size < 1:
        raise ValueError(f"{what} must be int32 [B + 1], got shape {cu.shape}")
    if cu[0] != 0:
        raise ValueError(f"{what} must start at 0, got {cu[0]}")
    down = np.flatnonzero(np.diff(cu) < 0)
    if down.size:
        i = down[0]
        raise ValueError(f"{what} must be non-decreasing: {what}[{i}] = {cu[i]} > "
                         f"{what}[{i + 1}] = {cu[i + 1]}")
    if cu[-1] != total:
        raise ValueError(f"{what} must end at the token count {total}, got {cu[-1]}")
    return cu.astype(np.int64)


def _attention_seqlens(seqlens_k, batch, max_len, what_max):
    """Checks seqlens_k: int32 [B], each in [0, max_len]."""
    seqlens = _require_dtype(np.asarray(seqlens_k), np.int32, "seqlens_k")
    if seqlens.shape != (batch,):
        raise ValueError(f"seqlens_k must be int32 [B={batch}], got shape {seqlens.shape}")
    bad = np.flatnonzero((seqlens < 0) | (seqlens > max_len))
    if bad.size:
        b = bad[0]
        raise ValueError(f"seqlens_k[{b}] = {seqlens[b]} is outside [0, {what_max} = {max_len}]")
    return seqlens.astype(np.int64)


def _attention_check_splits(num_splits, block_n):
    if num_splits < 1 or block_n < 1:
        raise ValueError(f"num_splits={num_splits} and block_n={block_n} must be >= 1")


def _attention_prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, dtype):
    """Validates a prefill call -> (dtype, q [total_q, Hq, D], k and v [total_k, Hkv, D] as
    float64 values, cu_q, cu_k (int64), the float32 scale as a float)."""
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    dtype = dtype or dtype_of(q)
    if dtype not in ATTENTION_DTYPES:
        raise ValueError(f"attention runs on {ATTENTION_DTYPES}, not {dtype!r}")
    _attention_dims(q.shape, k.shape, v.shape)
    if q.ndim == 4 and k.ndim == 4:
        if cu_seqlens_q is not None or cu_seqlens_k is not None:
            raise ValueError("an equal-length batch (4-D q [B, Sq, Hq, D]) takes no cu_seqlens")
        if k.shape[0] != q.shape[0]:
            raise ValueError(f"q has B={q.shape[0]} sequences, k and v {k.shape[0]}")
        batch, sq, sk = q.shape[0], q.shape[1], k.shape[1]
        cu_q, cu_k = np.arange(batch + 1) * sq, np.arange(batch + 1) * sk
        q, k, v = (a.reshape((-1,) + a.shape[2:]) for a in (q, k, v))
    elif q.ndim == 3 and k.ndim == 3:
        if (cu_seqlens_q is None) != (cu_seqlens_k is None):
            raise ValueError("give both cu_seqlens_q and cu_seqlens_k, or neither (one sequence)")
        if cu_seqlens_q is None:
            cu_q, cu_k = np.array([0, q.shape[0]]), np.array([0, k.shape[0]])
        else:
            cu_q = _attention_cu(cu_seqlens_q, q.shape[0], "cu_seqlens_q")
            cu_k = _attention_cu(cu_seqlens_k, k.shape[0], "cu_seqlens_k")
            if cu_q.size != cu_k.size:
                raise ValueError(f"cu_seqlens_q has {cu_q.size - 1} sequences, cu_seqlens_k "
                                 f"{cu_k.size - 1}")
    else:
        raise ValueError(f"q must be [total_q, Hq, D] with k, v [total_k, Hkv, D], or "
                         f"[B, Sq, Hq, D] with [B, Sk, Hkv, D]; got q {q.shape}, k {k.shape}")
    head_dim = q.shape[-1]
    with np.errstate(over="ignore"):   # past the float32 range: inf, rejected below
        scale = np.float32(1 / np.sqrt(head_dim) if softmax_scale is None else softmax_scale)
    if not np.isfinite(scale):
        raise ValueError(f"softmax_scale={softmax_scale} is not a finite float32")
    qf = to_f32(q, dtype).astype(np.float64)
    # k and v: the dtype's representation, or float64 values (a quantized cache's rows,
    # kv_cache_dequantize).
    kf, vf = (a if a.dtype == np.float64 else to_f32(a, dtype).astype(np.float64)
              for a in (k, v))
    return dtype, qf, kf, vf, cu_q, cu_k, float(scale)


# ---------------------------------------------------------------------------------------------
# Fused Q/K/V projection with rotary position embedding (RoPE)
# ---------------------------------------------------------------------------------------------
# One GEMM for the three projections of an attention layer, written where attention reads them:
#   - x [T, H] (tokens, hidden) times W [N, H], N = (Hq + 2 Hkv) D: rows 0 .. Hq D - 1 are Wq
#     (head h at rows h D .. h D + D - 1), then Hkv D rows of Wk, then Hkv D rows of Wv (the
#     q_proj, k_proj and v_proj weights of a checkpoint stacked in that order, as vLLM's
#     qkv_proj holds them); W is any 4-bit format's dequantized weight (dequantized_int4_weight,
#     dequantized_block4_weight), in the dtype's representation. Optional bias [N].
#   - y = x W^T + bias, split into q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, D]: token-major, heads,
#     then D contiguous; the layout attention_forward reads (3-D, packed tokens).
#   - RoPE (optional) rotates q and k, never v. Token t's position is positions[t] (int32 [T],
#     0 <= p < P); the angles come from the caller's table cos_sin float32 [P, R]: row p holds
#     cos(p theta_i) for i < R/2, then sin(p theta_i) (vLLM's cos_sin_cache layout), R = rotary_dim
#     even and <= D. The table carries the frequencies (base 10000 or 500000, Llama-3's scaled
#     ones, YaRN, ...), so the library computes no trigonometry; rope_cos_sin_cache builds the
#     plain one. With c = cos_sin[p, i], s = cos_sin[p, R/2 + i], i < R/2:
#       rotate-half (Llama, GPT-NeoX): a = y[i], b = y[i + R/2] ->
#           y'[i] = a c - b s,  y'[i + R/2] = b c + a s;
#       interleaved (GPT-J):           a = y[2i], b = y[2i + 1] ->
#           y'[2i] = a c - b s, y'[2i + 1] = b c + a s;
#     components R .. D - 1 pass unchanged.
#   - Values: exact (float64) y, rotated with the table's float32 values taken as exact, rounded
#     once to the dtype. A float32 kernel is within dot_float32_error of y, and rope_float32_error
#     carries that bound through its rotation.
ROPE_STYLES = ("neox", "interleaved")
ROPE_DEFAULT_BASE = 10000.0


def qkv_output_columns(num_heads_q, num_heads_kv, head_dim):
    """N = (Hq + 2 Hkv) D, the rows of W; ValueError unless Hkv >= 1 divides Hq and D >= 1."""
    if num_heads_kv < 1 or num_heads_q < num_heads_kv or num_heads_q % num_heads_kv:
        raise ValueError(f"num_heads_q={num_heads_q} must be a positive multiple of "
                         f"num_heads_kv={num_heads_kv} >= 1")
    if head_dim < 1:
        raise ValueError(f"head_dim={head_dim} must be >= 1")
    return (num_heads_q + 2 * num_heads_kv) * head_dim


def qkv_split(y, num_heads_q, num_heads_kv, head_dim):
    """y [T, N] -> (q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, D]), copies."""
    y = _matrix(np.asarray(y))
    n = qkv_output_columns(num_heads_q, num_heads_kv, head_dim)
    if y.shape[1] != n:
        raise ValueError(f"(Hq + 2 Hkv) D = {n} columns expected, got {y.shape[1]}")
    t, q_cols, kv_cols = y.shape[0], num_heads_q * head_dim, num_heads_kv * head_dim
    return (y[:, :q_cols].reshape(t, num_heads_q, head_dim).copy(),
            y[:, q_cols:q_cols + kv_cols].reshape(t, num_heads_kv, head_dim).copy(),
            y[:, q_cols + kv_cols:].reshape(t, num_heads_kv, head_dim).copy())


def rope_cos_sin_cache(max_position, rotary_dim, base=ROPE_DEFAULT_BASE):
    """float32 [max_position, rotary_dim]: row p = cos(p theta_i), then sin(p theta_i), with
    theta_i = base^(-2i / rotary_dim), i < rotary_dim / 2; computed in float64, rounded once (the
    frameworks compute p theta_i in float32, whose rounding grows with p: any table is valid)."""
    if rotary_dim < 2 or rotary_dim % 2 or max_position < 1 or not base > 1:
        raise ValueError(f"rotary_dim={rotary_dim} must be even and >= 2, max_position="
                         f"{max_position} >= 1 and base={base} > 1")
    theta = float(base) ** (-np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    angle = np.arange(max_position, dtype=np.float64)[:, None] * theta[None, :]
    return np.concatenate([np.cos(angle), np.sin(angle)], axis=1).astype(np.float32)


def _rope_operands(shape, positions, cos_sin, style):
    """-> (index arrays of the a and b halves [R/2], c and s [T, 1, R/2] as float64)."""
    if style not in ROPE_STYLES:
        raise ValueError(f"style={style!r} is not one of {ROPE_STYLES}")
    cos_sin = _matrix(_require_dtype(np.asarray(cos_sin), np.float32, "cos_sin"))
    rotary_dim = cos_sin.shape[1]
    t, _, head_dim = shape
    if rotary_dim < 2 or rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"the cos/sin table's rotary_dim={rotary_dim} must be even, >= 2 and "
                         f"<= head_dim={head_dim}")
    positions = _require_dtype(np.asarray(positions), np.int32, "positions").reshape(-1)
    if positions.size != t:
        raise ValueError(f"positions needs one entry per token ({t}), got {positions.size}")
    if positions.size and (positions.min() < 0 or positions.max() >= cos_sin.shape[0]):
        raise ValueError(f"positions must lie in [0, {cos_sin.shape[0]}) (the table's rows)")
    half = rotary_dim // 2
    i = np.arange(half)
    a_idx, b_idx = (i, i + half) if style == "neox" else (2 * i, 2 * i + 1)
    rows = cos_sin[positions].astype(np.float64)
    return a_idx, b_idx, rows[:, None, :half], rows[:, None, half:]


def apply_rope_f64(x, positions, cos_sin, style="neox"):
    """x [T, heads, D] (float64 values) rotated by token: the formulas above, in float64."""
    x = np.asarray(x, dtype=np.float64)
    a_idx, b_idx, c, s = _rope_operands(x.shape, positions, cos_sin, style)
    out = x.copy()
    a, b = x[:, :, a_idx], x[:, :, b_idx]
    out[:, :, a_idx] = a * c - b * s
    out[:, :, b_idx] = b * c + a * s
    return out


def rope_float32_error(error, x_abs, positions, cos_sin, style="neox"):
    """The bound on a float32 rotation's error, given a bound `error` [T, heads, D] on its inputs'
    error and their exact magnitudes x_abs: each output a c - b s (b c + a s) is two float32
    products and a sum (or one of them fused) of inputs each off by at most its error, so it is
    within |c| e_a + |s| e_b + gamma_2 (|c| (|a| + e_a) + |s| (|b| + e_b)). Components past R
    keep their error."""
    error = np.asarray(error, dtype=np.float64)
    x_abs = np.asarray(x_abs, dtype=np.float64)
    a_idx, b_idx, c, s = _rope_operands(error.shape, positions, cos_sin, style)
    c, s = np.abs(c), np.abs(s)
    gamma2 = 2 * F32_ROUNDOFF / (1 - 2 * F32_ROUNDOFF)
    ea, eb = error[:, :, a_idx], error[:, :, b_idx]
    ma, mb = x_abs[:, :, a_idx] + ea, x_abs[:, :, b_idx] + eb
    out = error.copy()
    out[:, :, a_idx] = c * ea + s * eb + gamma2 * (c * ma + s * mb)
    out[:, :, b_idx] = c * eb + s * ea + gamma2 * (c * mb + s * ma)
    return out


def qkv_projection_f64(x, w, num_heads_q, num_heads_kv, dtype=None, bias=None, positions=None,
                       cos_sin=None, style="neox"):
    """The fused projection in exact arithmetic -> (q, k, v) float64 [T, Hq | Hkv, D].

    x [T, H], w [N, H] (a dequantized weight) and bias [N] in the representation of dtype
    ('fp16' or 'bf16'; None infers it from x). positions and cos_sin both or neither: RoPE on q
    and k as the section's top describes."""
    dtype = dtype or dtype_of(x)
    if dtype not in W4A16_DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of {W4A16_DTYPES}")
    wf = _matrix(np.asarray(w))
    head_dim = wf.shape[0] // max(num_heads_q + 2 * num_heads_kv, 1)
    if qkv_output_columns(num_heads_q, num_heads_kv, head_dim) != wf.shape[0]:
        raise ValueError(f"W has {wf.shape[0]} rows, not a multiple (Hq + 2 Hkv) D of "
                         f"Hq + 2 Hkv = {num_heads_q + 2 * num_heads_kv}")
    if (positions is None) != (cos_sin is None):
        raise ValueError("RoPE needs both positions and cos_sin (or neither)")
    q, k, v = qkv_split(linear_f64(x, w, bias, "none", dtype), num_heads_q, num_heads_kv,
                        head_dim)
    if positions is not None:
        q = apply_rope_f64(q, positions, cos_sin, style)
        k = apply_rope_f64(k, positions, cos_sin, style)
    return q, k, v


def qkv_prepack_rows(num_heads_q, num_heads_kv, head_dim, rotary_dim=0, style=None):
    """The weight rows ck_qkv_prepack lays out, in order: row j of the prepacked weight is row
    rows[j] of W. The identity, except for the rotate-half style ('neox'), where in each head of
    q and k row 2i holds row i and row 2i + 1 row i + R / 2 (i < R / 2), so that the two outputs
    of one rotation are adjacent columns of the GEMM."""
    n = qkv_output_columns(num_heads_q, num_heads_kv, head_dim)
    rows = np.arange(n)
    if style != "neox":
        return rows
    if rotary_dim < 2 or rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"rotary_dim={rotary_dim} must be even and in [2, {head_dim}]")
    half = rotary_dim // 2
    for h in range(num_heads_q + num_heads_kv):
        base = h * head_dim
        rows[base:base + rotary_dim:2] = base + np.arange(half)
        rows[base + 1:base + rotary_dim:2] = base + half + np.arange(half)
    return rows


def qkv_projection(x, w, num_heads_q, num_heads_kv, dtype=None, bias=None, positions=None,
                   cos_sin=None, style="neox"):
    """The fused projection, ideally: qkv_projection_f64's values rounded once to the dtype."""
    dtype = dtype or dtype_of(x)
    return tuple(round_f64_to_dtype(a, dtype) for a in qkv_projection_f64(
        x, w, num_heads_q, num_heads_kv, dtype, bias, positions, cos_sin, style))


# ---------------------------------------------------------------------------------------------
# Structured-sparse INT4 weights (2:4 and 16:32 along K)
# ---------------------------------------------------------------------------------------------
# A weight W [N, K] (row-major, nn.Linear layout) is split along K into aligned blocks: blocks of
# 4 for 2:4 (the pattern of PTX mma.sp m16n8k32 and cuSPARSELt: at most 2 non-zeros per block) and
# blocks of 32 for 16:32 (at most 16 non-zeros per block). Both keep exactly half of K, so the
# kept values of a row form a [K/2] vector in dense-k order, and a dense quantization group of
# group_size k holds exactly group_size / 2 kept values.
#
#   name              | arrays                                          | definition
#   ------------------+-------------------------------------------------+---------------------------
#   2:4 values        | [N, K/2] in the weight's dtype, or packed INT4  | kept value j of block b of
#                     | codes uint8 [N, K/4] (pack_int4 along the kept  | a row is value 2b + j,
#                     | values)                                         | j = 0, 1, by position
#   2:4 metadata      | uint32 [N, K/32] (logical, row-major)           | block b (k = 4b .. 4b+3)
#                     |                                                 | is nibble b % 8 of word
#                     |                                                 | b // 8: bits 4g..4g+3 hold
#                     |                                                 | idx0 | idx1 << 2, with
#                     |                                                 | 0 <= idx0 < idx1 <= 3
#   16:32 values      | as 2:4 values; block c holds values 16c..16c+15 | kept values by ascending
#                     |                                                 | position
#   16:32 mask        | uint32 [N, K/32]                                | bit i of word c set <=>
#                     |                                                 | k = 32c + i kept; exactly
#                     |                                                 | 16 bits set
#   scales, zeros     | [N, K / group_size] as quantize_int4            | groups in DENSE k (64, 128)
#
# Non-zero: a value whose float32 value is != 0 (NaN is non-zero; -0.0 is zero).
# Kept positions of a block (compress): its non-zeros, then, while fewer than half the block, its
# lowest-indexed zero positions. A position stored that way holds its (zero) value: mma.sp
# metadata must name two distinct positions in every block, so a block with fewer than 2
# non-zeros still stores 2 values, and the 16:32 mask always has 16 bits.
# K must be a multiple of 32 (one metadata word or mask per 32 k) and of group_size.
#
# The metadata above is the logical layout, one word per 32 k of a row: exactly the 8 blocks of
# 4 that one row of an m16n8k32 mma.sp A tile covers, each block's nibble as PTX stores the two
# indices of a 2:4 chunk. idx0 < idx1 also keeps out the nibbles PTX calls invalid (0b0000,
# 0b0101, 0b1010, 0b1111: a position named twice). In the instruction, the threads of each group
# of four that the sparsity selector names (0 or 1 for m16n8k32 f16) hold the metadata of the
# whole group, so a kernel's prepack permutes these words into that register order (as CUTLASS'
# reorder_meta and Sparse-Marlin do); that permutation belongs to the prepack's own spec.
SPARSE24_BLOCK = 4
SPARSE1632_BLOCK = 32
SPARSE_WORD_K = 32                    # k covered by one metadata word or mask
SPARSE_GROUP_SIZES = (64, 128)        # quantization groups, counted in dense k


def sparse_magnitude(w, dtype):
    """The pruning key of each element: |w| as float32, with NaN -> -1, below every number."""
    mag = np.abs(to_f32(w, dtype))
    return np.where(np.isnan(mag), np.float32(-1), mag)


def _sparse_blocks(arr, block, what):
    arr = _matrix(arr)
    if arr.shape[1] % SPARSE_WORD_K:
        raise ValueError(f"{what}: K={arr.shape[1]} must be a multiple of {SPARSE_WORD_K}")
    return arr.reshape(arr.shape[0], arr.shape[1] // block, block)


def _sparse_prune(w, dtype, block):
    """Keeps the block // 2 largest keys (sparse_magnitude) of every block of `block` k; the
    others become +0. Ties: the lower k wins (a stable sort of the keys, descending)."""
    w = np.asarray(w)
    key = _sparse_blocks(sparse_magnitude(w, dtype), block, "prune")
    order = np.argsort(-key, axis=2, kind="stable")[:, :, : block // 2]
    keep = np.zeros(key.shape, dtype=bool)
    np.put_along_axis(keep, order, True, axis=2)
    return np.where(keep.reshape(w.shape), w, to_dtype(np.float32(0), dtype))


def sparse24_prune(w, dtype):
    """w [N, K] in dtype's representation -> the 2:4-pruned weight, same shape and dtype.

    In every aligned block of 4 k, the 2 elements of largest |w| keep their value (bit for bit)
    and the other 2 become +0. Ties in |w| (+0 and -0 tie): the lower k wins. NaN ranks below
    every number, so it is pruned first (kept only where a block holds 3 or 4 NaN).
    """
    return _sparse_prune(w, dtype, SPARSE24_BLOCK)


def sparse1632_prune(w, dtype):
    """w [N, K] -> the 16:32-pruned weight: the 16 largest |w| of every aligned block of 32 k keep
    their value, the other 16 become +0; ties and NaN as sparse24_prune."""
    return _sparse_prune(w, dtype, SPARSE1632_BLOCK)


def _sparse_kept(w, dtype, block, name):
    """-> (kept positions [N, K/block, block/2] ascending, blocks of w): the non-zeros of each
    block, then its lowest zero positions. ValueError where a block has > block/2 non-zeros."""
    w = np.asarray(w)
    blocks = _sparse_blocks(w, block, name)
    is_zero = _sparse_blocks(to_f32(w, dtype), block, name) == 0      # NaN != 0
    nonzeros = block - is_zero.sum(axis=2)
    bad = np.argwhere(nonzeros > block // 2)
    if bad.size:
        row, b = bad[0]
        raise ValueError(f"{name}: row {row}, k {b * block}..{b * block + block - 1} has "
                         f"{nonzeros[row, b]} non-zeros, more than {block // 2}")
    # Stable sort on is_zero: non-zeros first, then zeros, each by ascending k.
    kept = np.argsort(is_zero, axis=2, kind="stable")[:, :, : block // 2]
    return np.sort(kept, axis=2), blocks


def sparse24_compress(w, dtype):
    """A 2:4 weight w [N, K] (K % 32 == 0) -> (values [N, K/2] in dtype's representation,
    metadata uint32 [N, K/32]); see the table at the top of this section.

    Kept positions of a block: its non-zeros, then its lowest zero positions, to 2 (so a block of
    zeros stores positions 0 and 1, and one non-zero at k = 3 stores positions 0 and 3).
    ValueError where a block of 4 has more than 2 non-zeros.
    """
    kept, blocks = _sparse_kept(w, dtype, SPARSE24_BLOCK, "sparse24_compress")
    values = np.take_along_axis(blocks, kept, axis=2).reshape(blocks.shape[0], -1)
    return values, sparse24_pack_metadata(kept.reshape(blocks.shape[0], -1))


def sparse24_pack_metadata(indices):
    """Positions [N, K/2] (0..3; pairs idx0 < idx1 per block) -> metadata uint32 [N, K/32]:
    block b in bits 4(b % 8) .. 4(b % 8) + 3 of word b // 8, idx0 in the low 2 bits."""
    idx = np.asarray(indices).astype(np.uint32).reshape(len(indices), -1, 8, 2)
    nibbles = idx[..., 0] | (idx[..., 1] << np.uint32(2))
    shifts = (np.arange(8, dtype=np.uint32) * np.uint32(4))
    return np.bitwise_or.reduce(nibbles << shifts, axis=2).astype(np.uint32)


def sparse24_unpack_metadata(meta):
    """metadata uint32 [N, K/32] -> positions uint8 [N, K/2] (inverse of sparse24_pack_metadata);
    ValueError unless every block names two positions idx0 < idx1."""
    meta = _matrix(_require_dtype(np.asarray(meta), np.uint32, "2:4 metadata"))
    shifts = np.arange(8, dtype=np.uint32) * np.uint32(4)
    nibbles = (meta[:, :, None] >> shifts) & np.uint32(0xF)
    idx = np.stack([nibbles & np.uint32(3), nibbles >> np.uint32(2)], axis=3)
    if (idx[..., 0] >= idx[..., 1]).any():
        raise ValueError("2:4 metadata: every block must name two positions idx0 < idx1")
    return idx.reshape(meta.shape[0], -1).astype(np.uint8)


def _sparse_scatter(values, positions, block, fill):
    """values [N, K/2] at positions [N, K/block, block/2] (within each block) -> [N, K]."""
    rows, nblocks, _ = positions.shape
    dense = np.full((rows, nblocks, block), fill, dtype=values.dtype)
    np.put_along_axis(dense, positions.astype(np.int64),
                      values.reshape(rows, nblocks, block // 2), axis=2)
    return dense.reshape(rows, nblocks * block)


def sparse24_decompress(values, meta, dtype):
    """(values [N, K/2], metadata [N, K/32]) -> dense [N, K] in dtype's representation: each
    value at its position, +0 elsewhere. decompress(compress(w)) == w bit for bit, except that a
    -0.0 at a position not stored reads back +0.0."""
    values = _matrix(_require_dtype(np.asarray(values), _numpy_dtype(dtype), "2:4 values"))
    idx = sparse24_unpack_metadata(meta)
    if idx.shape != values.shape:
        raise ValueError(f"metadata covers {idx.shape[1]} values per row, values have "
                         f"{values.shape[1]}")
    positions = idx.reshape(len(idx), -1, 2)
    return _sparse_scatter(values, positions, SPARSE24_BLOCK, to_dtype(np.float32(0), dtype))


def sparse1632_compress(w, dtype):
    """A 16:32 weight w [N, K] (K % 32 == 0) -> (values [N, K/2], mask uint32 [N, K/32]).

    Kept positions of a block of 32: its non-zeros, then its lowest zero positions, to 16; values
    in ascending k; bit i of the mask word set where k = 32c + i is kept (exactly 16 bits).
    ValueError where a block has more than 16 non-zeros.
    """
    kept, blocks = _sparse_kept(w, dtype, SPARSE1632_BLOCK, "sparse1632_compress")
    values = np.take_along_axis(blocks, kept, axis=2).reshape(blocks.shape[0], -1)
    masks = np.bitwise_or.reduce(np.uint32(1) << kept.astype(np.uint32), axis=2)
    return values, masks.astype(np.uint32)


def sparse1632_positions(masks):
    """mask uint32 [N, K/32] -> kept positions uint8 [N, K/32, 16] ascending; ValueError unless
    every mask has exactly 16 bits set."""
    masks = _matrix(_require_dtype(np.asarray(masks), np.uint32, "16:32 mask"))
    bits = (masks[:, :, None] >> np.arange(32, dtype=np.uint32)) & np.uint32(1)
    if (bits.sum(axis=2) != SPARSE1632_BLOCK // 2).any():
        raise ValueError("16:32 mask: every word must have exactly 16 bits set")
    return np.argsort(bits == 0, axis=2, kind="stable")[:, :, :16].astype(np.uint8)


def sparse1632_decompress(values, masks, dtype):
    """(values [N, K/2], mask [N, K/32]) -> dense [N, K]: values at the set bits in ascending k,
    +0 elsewhere (the round trip as sparse24_decompress)."""
    values = _matrix(_require_dtype(np.asarray(values), _numpy_dtype(dtype), "16:32 values"))
    positions = sparse1632_positions(masks)
    if positions.shape[1] * 16 != values.shape[1] or len(positions) != len(values):
        raise ValueError(f"masks {masks.shape} do not match values {values.shape}")
    return _sparse_scatter(values, positions, SPARSE1632_BLOCK, to_dtype(np.float32(0), dtype))


def sparse1632_to_24(values, masks):
    """16:32 (values, mask) -> 2:4 (values, metadata) where every aligned block of 4 has at most
    2 mask bits; ValueError otherwise. With 16 bits per 32 that means exactly 2 per block of 4,
    so the values (or their packed INT4 codes, which this leaves as they are) keep their order
    and block b's positions are its two set bits (mod 4). The stored zeros stay where the mask
    put them."""
    positions = sparse1632_positions(masks).astype(np.int64)
    per_block = np.stack([(positions // 4 == g).sum(axis=2) for g in range(8)], axis=2)
    bad = np.argwhere(per_block > 2)
    if bad.size:
        row, c, g = bad[0]
        raise ValueError(f"sparse1632_to_24: row {row}, k {32 * c + 4 * g}..{32 * c + 4 * g + 3}"
                         f" has {per_block[row, c, g]} kept positions, more than 2")
    idx = (positions % 4).reshape(len(positions), -1)
    return np.asarray(values).copy(), sparse24_pack_metadata(idx)


def _check_sparse_group(group_size, k):
    if group_size not in SPARSE_GROUP_SIZES:
        raise ValueError(f"group_size={group_size} is not one of {SPARSE_GROUP_SIZES}")
    if k % group_size or k % SPARSE_WORD_K:
        raise ValueError(f"K={k} must be a multiple of group_size={group_size} and of "
                         f"{SPARSE_WORD_K}")


def _sparse_quantize(values, dtype, group_size, mode, k):
    """INT4 of the kept values: quantize_int4 on values [N, K/2] with group_size / 2 (a dense
    group of group_size k holds exactly group_size / 2 kept values)."""
    _check_sparse_group(group_size, k)
    return quantize_int4(values, dtype, group_size // 2, mode)


def sparse24_quantize(w, dtype, group_size, mode):
    """A 2:4 weight w [N, K] -> (codes uint8 [N, K/4], metadata uint32 [N, K/32],
    scales [N, K/group_size], zeros uint8 [N, K/group_size] or None).

    (values, metadata) = sparse24_compress(w); then exactly quantize_int4's rules on the kept
    values of each dense group (group_size 64 or 128 dense k = 32 or 64 kept values): sym
    scale = absmax / 7, asym lo = min(min, 0), hi = max(max, 0), rint half to even, NaN -> the
    code of 0. The pruned zeros are not among the values, and would change nothing if they were
    (absmax, min(., 0) and max(., 0) ignore zeros), so scales and zeros equal those of
    quantize_int4(w) on the dense pruned weight, and the codes equal its codes at the kept
    positions. A stored zero gets the code of 0: 0 (sym) or the zero point (asym).
    """
    values, meta = sparse24_compress(w, dtype)
    packed, scales, zeros = _sparse_quantize(values, dtype, group_size, mode, values.shape[1] * 2)
    return packed, meta, scales, zeros


def sparse24_dequantize(packed, meta, scales, zeros, k, group_size, mode, out_dtype):
    """-> dense [N, K] in out_dtype's representation: dequantize_int4 of the kept codes (group
    size group_size / 2) scattered to their positions; +0 at pruned positions."""
    _check_sparse_group(group_size, k)
    values = dequantize_int4(packed, scales, zeros, k // 2, group_size // 2, mode, out_dtype)
    return sparse24_decompress(values, meta, out_dtype)


def sparse1632_quantize(w, dtype, group_size, mode):
    """A 16:32 weight w [N, K] -> (codes uint8 [N, K/4], mask uint32 [N, K/32], scales, zeros):
    sparse1632_compress, then the kept values quantized as in sparse24_quantize."""
    values, masks = sparse1632_compress(w, dtype)
    packed, scales, zeros = _sparse_quantize(values, dtype, group_size, mode, values.shape[1] * 2)
    return packed, masks, scales, zeros


def sparse1632_dequantize(packed, masks, scales, zeros, k, group_size, mode, out_dtype):
    """-> dense [N, K] in out_dtype's representation (as sparse24_dequantize, 16:32 masks)."""
    _check_sparse_group(group_size, k)
    values = dequantize_int4(packed, scales, zeros, k // 2, group_size // 2, mode, out_dtype)
    return sparse1632_decompress(values, masks, out_dtype)


# ---- The prepacked 2:4 layout (ck_sparse_w4a16_prepack) ----------------------------------------
# What the mma.sp kernels read (kernels/sparse/gemm_sparse_w4a16.cu), for N16 = ceil(N / 16) * 16
# rows (16-row tiles) and K / 128 chunks; K must be a multiple of 128. Lane l = 4g + t of tile T
# and chunk c:
#   codes: 16 bytes at ((T * chunks + c) * 32 + l) * 16, four little-endian words: (row g, k 0..63
#     of the chunk), (row g + 8, k 0..63), (row g, k 64..127), (row g + 8, k 64..127) with rows
#     counted in the tile. In the word of half h, nibbles j and j + 4 (j < 4) hold the two kept
#     values (2b, 2b + 1 of their k32 step's 16) of block b = t + 4 (j % 2) of step 2h + j // 2.
#     Codes are unsigned: a symmetric q is stored as q + 8. Padding rows: code 8 (symmetric) or 0.
#   metadata: after the codes (N16 K / 4 bytes), 8 bytes at the same lane index, two words: word
#     h holds, of step 2h + t // 2 (the k32 steps the lane gives metadata for with selector
#     t // 2), blocks 4 (t % 2) .. 4 (t % 2) + 3: row g's 16 bits of its metadata word in bits
#     0..15, row g + 8's in bits 16..31. Padding rows: positions 0 and 1 (0x4444).
#   scales, zeros: [N16 / 16][K / group_size][8][2]: value (g, r) is row 16 T + g + 8 r's;
#     padding rows scale 0 and zero point 8.
SPARSE_PACK_K = 128
SPARSE_PACK_ROWS = 16


def sparse24_prepack(codes, meta, scales, zeros, k, group_size):
    """A 2:4 weight (sparse24_quantize's codes, metadata, scales and zeros or None) ->
    (w_prepacked uint8 [N16 K 3 / 8], scales_prepacked [N16 K / group_size] in the scales'
    dtype, zeros_prepacked uint8 or None), the layout above."""
    codes = _matrix(_require_dtype(np.asarray(codes), np.uint8, "codes"))
    meta = _matrix(_require_dtype(np.asarray(meta), np.uint32, "2:4 metadata"))
    _check_sparse_group(group_size, k)
    if k % SPARSE_PACK_K:
        raise ValueError(f"K={k} must be a multiple of {SPARSE_PACK_K}")
    n = codes.shape[0]
    n16 = -(-n // SPARSE_PACK_ROWS) * SPARSE_PACK_ROWS
    tiles, chunks, groups = n16 // SPARSE_PACK_ROWS, k // SPARSE_PACK_K, k // group_size
    values = np.full((n16, k // 2), 0 if zeros is not None else 8, np.uint32)
    nib = np.stack([codes & 0xF, codes >> 4], axis=2).reshape(n, -1).astype(np.uint32)
    values[:n] = nib if zeros is not None else nib ^ 8
    words_meta = np.full((n16, k // 32), 0x44444444, np.uint32)
    words_meta[:n] = meta

    g = np.arange(8)[:, None]
    t = np.arange(4)[None, :]
    code_words = np.zeros((tiles, chunks, 8, 4, 4), np.uint32)      # [T][c][g][t][word]
    meta_words = np.zeros((tiles, chunks, 8, 4, 2), np.uint32)
    for tile in range(tiles):
        for c in range(chunks):
            for h in range(2):
                for r in range(2):
                    rows = tile * SPARSE_PACK_ROWS + g + 8 * r                 # [8, 1]
                    w = np.zeros((8, 4), np.uint32)
                    for j in range(4):
                        step = 4 * c + 2 * h + j // 2
                        value = step * 16 + 2 * (t + 4 * (j % 2))            # [1, 4]
                        w |= values[rows, value] << np.uint32(4 * j)
                        w |= values[rows, value + 1] << np.uint32(4 * (j + 4))
                    code_words[tile, c, :, :, 2 * h + r] = w
                word = 4 * c + 2 * h + t // 2                                  # [1, 4]
                shift = (16 * (t % 2)).astype(np.uint32)
                lo = words_meta[tile * SPARSE_PACK_ROWS + g, word] >> shift & 0xFFFF
                hi = words_meta[tile * SPARSE_PACK_ROWS + g + 8, word] >> shift & 0xFFFF
                meta_words[tile, c, :, :, h] = lo | hi << np.uint32(16)
    w_out = np.concatenate([code_words.reshape(-1).view(np.uint8),
                            meta_words.reshape(-1).view(np.uint8)])

    def pairs(a, pad):
        a = np.asarray(a)
        out = np.full((n16, groups), pad, a.dtype)
        out[:n] = a
        # [T][16 rows][groups] -> [T][groups][g][r], row = g + 8 r
        return out.reshape(tiles, 2, 8, groups).transpose(0, 3, 2, 1).reshape(-1).copy()
    scale_pad = np.zeros((), np.asarray(scales).dtype)
    return (w_out, pairs(scales, scale_pad),
            None if zeros is None else pairs(_require_dtype(np.asarray(zeros), np.uint8, "zeros"),
                                             np.uint8(8)))


def sparse_dense_int4(codes, meta, zeros, sparsity, k, group_size):
    """A sparse weight of either pattern ("2:4" or "16:32"; the codes, metadata and zeros or
    None of sparse24_quantize / sparse1632_quantize) as a dense INT4 weight w_packed [N, K/2]
    (quantize_int4's packing, the same scales and zeros): the kept codes at their positions,
    the code of 0 at the pruned ones (0 when symmetric, the group's zero point when
    asymmetric). dequantize_int4 of it is the sparse weight's w'."""
    codes = _matrix(_require_dtype(np.asarray(codes), np.uint8, "codes"))
    _check_sparse_group(group_size, k)
    n = codes.shape[0]
    symmetric = zeros is None
    kept = np.stack([codes & 0xF, codes >> 4], axis=2).reshape(n, k // 2).astype(np.int64)
    if sparsity == "2:4":
        positions = sparse24_unpack_metadata(meta).reshape(n, -1, SPARSE24_BLOCK // 2)
        block = SPARSE24_BLOCK
    elif sparsity == "16:32":
        positions = sparse1632_positions(meta)
        block = SPARSE1632_BLOCK
    else:
        raise ValueError(f"sparsity {sparsity!r} is not '2:4' or '16:32'")
    dense = _sparse_scatter(kept, positions, block, -1)
    if symmetric:
        dense = np.where(dense < 0, 0, dense)
        dense = np.where(dense >= 8, dense - 16, dense)     # two's complement nibbles -> q
    else:
        z = np.repeat(np.asarray(zeros).reshape(n, -1).astype(np.int64), group_size, axis=1)
        dense = np.where(dense < 0, z, dense)
    return pack_int4(dense, signed=symmetric)


def sparse_prepack_dense(codes, meta, scales, zeros, sparsity, k, group_size):
    """ck_sparse_w4a16_prepack_dense in NumPy: w4a16_prepack of sparse_dense_int4's weight,
    (w_prepacked, scales_prepacked, zeros_prepacked or None)."""
    packed = sparse_dense_int4(codes, meta, zeros, sparsity, k, group_size)
    return w4a16_prepack(packed, scales, zeros, len(packed), k, group_size)


# ---- Importer: compressed-tensors "sparse-24-bitmask" -----------------------------------------
# compressed-tensors (Sparse24BitMaskCompressor, format "sparse-24-bitmask") stores a 2:4 weight
# [N, K] as three tensors: `shape` int [2, 1] = [[N], [K]]; `bitmask` uint8 [N, ceil(K/8)], the
# bool mask of kept positions packed by numpy.packbits(mask, axis=-1, bitorder="little") (bit j
# of byte c <=> k = 8c + j); `compressed` [N, K/2] in the weight's dtype, the weight at the mask
# positions in row-major order (weight[mask].reshape(N, K/2)). The mask is its top-2 |w| of every
# 4, so it marks exactly 2 positions per block of 4, zeros included.
def import_compressed_tensors_sparse24(compressed, bitmask, shape, dtype):
    """-> (values [N, K/2], metadata uint32 [N, K/32]) in the library's 2:4 format: the dense
    weight (the compressed values at the mask positions, +0 elsewhere) through sparse24_compress.

    ValueError unless the mask has exactly K/2 bits per row and at most 2 per block of 4."""
    n, k = (int(v) for v in np.asarray(shape).reshape(-1))
    compressed = _matrix(_require_dtype(np.asarray(compressed), _numpy_dtype(dtype),
                                        "compressed"))
    bitmask = _matrix(_require_dtype(np.asarray(bitmask), np.uint8, "bitmask"))
    if compressed.shape != (n, k // 2) or bitmask.shape != (n, -(-k // 8)) or k % 4:
        raise ValueError(f"shape [{n}, {k}] needs compressed [{n}, {k // 2}] and bitmask "
                         f"[{n}, {-(-k // 8)}]; got {compressed.shape} and {bitmask.shape}")
    mask = np.unpackbits(bitmask, axis=-1, count=k, bitorder="little").astype(bool)
    if (mask.reshape(n, -1, 4).sum(axis=2) > 2).any() or (mask.sum(axis=1) != k // 2).any():
        raise ValueError("bitmask: want exactly 2 kept positions in every block of 4")
    dense = np.full((n, k), to_dtype(np.float32(0), dtype), dtype=compressed.dtype)
    dense[mask] = compressed.reshape(-1)
    return sparse24_compress(dense, dtype)


# ---- Importer: Sparse-Marlin ("marlin_24", vLLM's gptq_marlin_24) ----------------------------
# A symmetric 4-bit 2:4 weight of K inputs and N outputs (K % 32 == 0, N % 64 == 0: the tiles
# below; the Sparse-Marlin kernels also want K and N multiples of 128) is stored as three tensors
# (B_24, B_meta and s in vLLM's loader; fp16 scales there):
#   qweight int32 [K/32, 2N]: the codes q in 0..15 of the compressed weight Q [K/2, N], where
#       w = (q - 8) * s (the format "uint4b8") and Q[j, n] is kept value j of output n (values
#       2b and 2b + 1 are block b's, by ascending position). Q is cut into 16 x 16 tiles; tile
#       (t, u) = Q[16t .. 16t+15, 16u .. 16u+15] goes row-major to elements 256u + 16r + c of row
#       t of a [K/32, 16N] array; each aligned run of 1024 elements of a row is permuted by
#       marlin24_weight_perm() (out[j] = in[perm[j]]); then elements 8w .. 8w+7 of a row form
#       word w, element 8w + i in bits 4i .. 4i+3 (word 0 of row 0 thus holds Q[0, 0], Q[8, 0],
#       Q[0, 4], Q[8, 4], Q[1, 0], Q[9, 0], Q[1, 4], Q[9, 4]).
#   meta int16 [K/32, 2N]: the positions. Logically M [N, K/16] int16: M[n, c] covers blocks
#       4c .. 4c+3 of output n, block 4c + i in bits 4i .. 4i+3 as idx0 | idx1 << 2 (the nibble
#       of the library's 2:4 metadata, idx0 < idx1). M is scattered into a flat buffer of N K/16
#       halves by marlin24_meta_offsets (CUTLASS' reordering of sparse GEMM metadata:
#       ColumnMajorInterleaved<2> with its 2 x 2 swizzle), viewed as [K/32, 2N].
#   s [G, N] (fp16): one scale per group of group_size k (128, or -1: one group of all K); with
#       more than one group every aligned run of 64 scales of the flattened [G, N] is permuted by
#       marlin24_scale_perm() (out[j] = in[perm[j]]); a single group (per-channel, or group 128
#       with K = 128) is stored as it is.
MARLIN24_TILE = 16           # Q is permuted in 16 x 16 tiles
MARLIN24_PERM_SPAN = 1024    # one weight permutation covers 4 tiles (16 rows x 64 columns of Q)
MARLIN24_ROW_GROUP = 64      # the metadata reorder works on 64 rows (outputs) at a time
MARLIN24_BIAS = 8            # w = (q - 8) * s
MARLIN24_GROUP_SIZES = (128, GROUP_ROW)
MARLIN24_NIBBLE_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)   # the order of each run of 8 (see below)


def marlin24_weight_perm():
    """The permutation of each run of 1024 tile elements: for each of the 32 threads' indices i,
    the rows 2(i % 4), 2(i % 4) + 1, 2(i % 4 + 4), 2(i % 4 + 4) + 1 at column 8((i // 4) % 2)
    of tile (i // 4) // 2, then the same four rows 4 columns on, each of those eight for the
    columns j = 0..3 after it (+j); every run of eight is then reordered by
    MARLIN24_NIBBLE_ORDER (nibble p of a word holds element order[p] of its run)."""
    perm = []
    for i in range(32):
        col = i // 4
        first = [16 * row + 256 * (col // 2) + 8 * (col % 2) + 4 * half
                 for half in (0, 1)
                 for row in (2 * (i % 4), 2 * (i % 4) + 1, 2 * (i % 4 + 4), 2 * (i % 4 + 4) + 1)]
        for j in range(4):
            perm.extend(p + j for p in first)
    order = list(MARLIN24_NIBBLE_ORDER)
    return np.array(perm, dtype=np.int64).reshape(-1, 8)[:, order].reshape(-1)


def marlin24_scale_perm():
    """The permutation of each run of 64 group scales: 8i + (0, 4, 1, 5, 2, 6, 3, 7)."""
    return np.array([8 * i + j for i in range(8) for j in (0, 4, 1, 5, 2, 6, 3, 7)],
                    dtype=np.int64)


def marlin24_meta_offsets(n, k):
    """int64 [N, K/16]: where M[r, c] stands in the flat metadata buffer. Rows are renumbered
    within each group of 64 (r -> 64(r // 64) + 2(r % 2) + (r % 8) // 4 + 32((r % 4) // 2)
    + 4((r % 64) // 8)), the 2 x 2 blocks of (renumbered row, column) swizzled (an even row's
    odd column and the next odd row's even column trade places), and the result stored column
    pairs major: offset = (col // 2) 2N + 2 row + col % 2."""
    if n % MARLIN24_ROW_GROUP or k % SPARSE_WORD_K:
        raise ValueError(f"marlin_24 needs N % {MARLIN24_ROW_GROUP} == 0 and K % "
                         f"{SPARSE_WORD_K} == 0; got N={n}, K={k}")
    r = np.arange(n, dtype=np.int64)[:, None]
    c = np.arange(k // 16, dtype=np.int64)[None, :]
    row, col = np.broadcast_arrays(r // 64 * 64 + (r % 2) * 2 + (r % 8) // 4 + (r % 4) // 2 * 32
                                   + (r % 64) // 8 * 4, c)
    swap = ((row % 2 == 0) & (col % 2 == 1)).astype(np.int64) \
        - ((row % 2 == 1) & (col % 2 == 0)).astype(np.int64)
    row, col = row + swap, col - swap
    return (col // 2) * n * 2 + row * 2 + col % 2


def marlin24_tiles_to_rows(q):
    """Q [K/2, N] -> [K/32, 16N]: the 16 x 16 tiles of each 16-row band, tile after tile."""
    rows, n = q.shape
    t = MARLIN24_TILE
    return q.reshape(rows // t, t, n // t, t).transpose(0, 2, 1, 3).reshape(rows // t, n * t)


def marlin24_rows_to_tiles(rows, n):
    """The inverse of marlin24_tiles_to_rows: [K/32, 16N] -> Q [K/2, N]."""
    t = MARLIN24_TILE
    bands = rows.shape[0]
    return rows.reshape(bands, n // t, t, t).transpose(0, 2, 1, 3).reshape(bands * t, n)


def import_marlin24(qweight, meta, scales, group_size, dtype):
    """A marlin_24 checkpoint -> (codes uint8 [N, K/4], metadata uint32 [N, K/32],
    scales [N, K/g] in dtype's representation, g) in the library's 2:4 format (sym INT4).

    The stored values and positions are kept as they are: code q becomes the signed code q - 8
    (nibble q ^ 8), M's two halves of each 32 k form one metadata word (M[n, 2w] in the low 16
    bits). g is group_size, except that per-channel scales (group_size -1) become groups of 128
    k (64 where K % 128 != 0) holding the same scale, which dequantize to the same bits.
    ValueError on shapes that do not fit the format, or metadata naming a position twice."""
    qweight = _matrix(_require_dtype(np.asarray(qweight), np.int32, "marlin_24 qweight"))
    meta = _matrix(_require_dtype(np.asarray(meta), np.int16, "marlin_24 meta"))
    scales = _matrix(_require_dtype(np.asarray(scales), _numpy_dtype(dtype), "marlin_24 s"))
    k, n = qweight.shape[0] * 2 * MARLIN24_TILE, qweight.shape[1] // 2
    if qweight.shape[1] % 2 or meta.shape != qweight.shape:
        raise ValueError(f"qweight {qweight.shape} and meta {meta.shape} must both be "
                         f"[K/32, 2N] (4-bit codes)")
    if group_size not in MARLIN24_GROUP_SIZES:
        raise ValueError(f"group_size={group_size} is not one of {MARLIN24_GROUP_SIZES}")
    offsets = marlin24_meta_offsets(n, k)          # checks N and K against the tiles
    # Per-channel scales become the library's largest group that divides K.
    out_group = group_size if group_size != GROUP_ROW else next(
        (g for g in sorted(SPARSE_GROUP_SIZES, reverse=True) if k % g == 0), None)
    groups = 1 if group_size == GROUP_ROW else k // group_size
    if out_group is None or k % out_group or scales.shape != (groups, n):
        raise ValueError(f"K={k}, N={n} with group_size={group_size} needs s [{groups}, {n}] "
                         f"and K a multiple of {max(SPARSE_GROUP_SIZES)} (per-channel: of "
                         f"{min(SPARSE_GROUP_SIZES)}); got s {scales.shape}")

    words = qweight.view(np.uint32)
    nibbles = (words[:, :, None] >> (np.arange(8, dtype=np.uint32) * np.uint32(4))) & 0xF
    rows = nibbles.reshape(words.shape[0], -1)
    perm = marlin24_weight_perm()
    unpermuted = np.empty_like(rows)
    unpermuted.reshape(-1, MARLIN24_PERM_SPAN)[:, perm] = rows.reshape(-1, MARLIN24_PERM_SPAN)
    q = marlin24_rows_to_tiles(unpermuted, n).T                        # [N, K/2], 0..15
    signed = q.astype(np.int16) - MARLIN24_BIAS
    codes = pack_int4(signed, signed=True)

    halves = meta.reshape(-1).view(np.uint16)[offsets].astype(np.uint32)  # M [N, K/16]
    metadata = halves[:, 0::2] | (halves[:, 1::2] << np.uint32(16))
    sparse24_unpack_metadata(metadata)                                  # idx0 < idx1 throughout

    if group_size == GROUP_ROW:
        out_scales = np.repeat(scales.T, k // out_group, axis=1)
    elif groups == 1:
        out_scales = scales.T
    else:
        flat = scales.reshape(-1, len(marlin24_scale_perm()))
        unpermuted_scales = np.empty_like(flat)
        unpermuted_scales[:, marlin24_scale_perm()] = flat
        out_scales = unpermuted_scales.reshape(groups, n).T
    return codes, metadata, np.ascontiguousarray(out_scales), out_group
