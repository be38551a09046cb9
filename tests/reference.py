"""NumPy references of the quantization formats of libcuda_kernels.so: the executable spec.

Each function implements the words of the top comment of cuda_kernels.h literally: float32
arithmetic, round-half-to-even (np.rint), saturation at the type's range, NaN encoded as 0 and
ignored by absmax/min/max. The GPU kernels must match these references bit for bit, so every
intermediate here is a float32 operation that a CUDA kernel performs the same way (no float64,
no fused multiply-add, no reciprocal approximations).

Dtypes are named 'fp32', 'fp16' and 'bf16'. NumPy holds them as float32, float16 and uint16 (the
bfloat16 bit pattern; NumPy has no bfloat16): that is their "representation" below.
Matrices are 2-D [rows, cols], row-major.

Everything is vectorized (no Python loop over elements), fast enough for 4096 x 4096 inputs.
"""

import numpy as np

DTYPES = ("fp32", "fp16", "bf16")
NUMPY_DTYPE = {"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16}

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
