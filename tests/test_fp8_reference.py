"""CPU tests of the FP8 references in tests/reference.py: the E4M3 and E5M2 codecs (fp8_encode,
fp8_decode) and quantize_fp8 / dequantize_fp8 at every granularity. Each is checked against an
independent definition: the OCP 8-bit Floating Point Specification's bit fields and published
values, brute-force nearest-value rounding over every code, and element-by-element loops over
the scales' scopes.

They run everywhere (no GPU). Data is fresh every run: each test that draws data takes the `seed`
fixture (tests/conftest.py), which prints it; CK_TEST_SEED=<seed> replays a failure.
"""

import math

import numpy as np
import pytest

import reference as ref
from test_block4_reference import around, every_16_bit_float, nearest_code

FORMATS = ref.FP8_FORMATS
GRANULARITIES = ref.FP8_GRANULARITIES


# ---------------------------------------------------------------------------------------------
# The OCP definition, written out independently
# ---------------------------------------------------------------------------------------------
def ocp_value(code, fmt):
    """The value of one FP8 code by the OCP spec's bit fields (a Python float; NaN as nan)."""
    sign = -1.0 if code & 0x80 else 1.0
    if fmt == "e4m3":   # S.EEEE.MMM, bias 7; S.1111.111 is NaN, no infinities
        e, m = (code >> 3) & 0xF, code & 0x7
        if e == 0xF and m == 0x7:
            return math.nan
        return sign * (m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    e, m = (code >> 2) & 0x1F, code & 0x3   # S.EEEEE.MM, bias 15, IEEE-like specials
    if e == 0x1F:
        return sign * math.inf if m == 0 else math.nan
    return sign * (m / 4 * 2.0 ** -14 if e == 0 else (1 + m / 4) * 2.0 ** (e - 15))


# The values the OCP spec tabulates (OFP8, table "E4M3 and E5M2 encodings"), by code.
OCP_TABLE = {
    "e4m3": {0x7E: 448.0, 0xFE: -448.0, 0x08: 2.0 ** -6, 0x07: 0.875 * 2.0 ** -6,
             0x01: 2.0 ** -9, 0x00: 0.0, 0x80: -0.0, 0x38: 1.0, 0x78: 256.0, 0x7F: math.nan,
             0xFF: math.nan},
    "e5m2": {0x7B: 57344.0, 0xFB: -57344.0, 0x04: 2.0 ** -14, 0x03: 0.75 * 2.0 ** -14,
             0x01: 2.0 ** -16, 0x00: 0.0, 0x80: -0.0, 0x3C: 1.0, 0x7C: math.inf,
             0xFC: -math.inf, 0x7D: math.nan, 0x7E: math.nan, 0x7F: math.nan, 0xFD: math.nan,
             0xFE: math.nan, 0xFF: math.nan},
}
# The largest finite code (positive; | 0x80 for the negative one).
MAX_CODE = {"e4m3": 0x7E, "e5m2": 0x7B}
MANTISSA_BITS = {"e4m3": 3, "e5m2": 2}
SUBNORMAL_QUANTUM = {"e4m3": 2.0 ** -9, "e5m2": 2.0 ** -16}


def finite_magnitudes(fmt):
    """Values of the codes 0x00 .. MAX_CODE (the non-negative finite ones, in order)."""
    return [ocp_value(c, fmt) for c in range(MAX_CODE[fmt] + 1)]


# ---------------------------------------------------------------------------------------------
# The codecs
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_code_decodes_to_the_ocp_value(fmt):
    codes = np.arange(256, dtype=np.uint8)
    got = ref.fp8_decode(codes, fmt)
    want = np.array([ocp_value(c, fmt) for c in range(256)], np.float32)
    assert np.array_equal(got, want, equal_nan=True)
    # -0.0 and every negative code keep their sign; NaN codes are exactly the spec's.
    real = ~np.isnan(got)
    assert np.array_equal(np.signbit(got[real]), codes[real] >= 0x80)
    for code, value in OCP_TABLE[fmt].items():
        if math.isnan(value):
            assert np.isnan(got[code]), hex(code)
        else:
            assert got[code] == value and np.signbit(got[code]) == (math.copysign(1, value) < 0)
    assert int(np.isnan(got).sum()) == (2 if fmt == "e4m3" else 6)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_finite_code_round_trips(fmt):
    codes = np.arange(256, dtype=np.uint8)
    values = ref.fp8_decode(codes, fmt)
    finite = np.isfinite(values)
    assert np.array_equal(ref.fp8_encode(values[finite], fmt), codes[finite])
    assert (ref.fp8_encode(values[np.isnan(values)], fmt) == ref.FP8_NAN).all()


def test_e4m3_helpers_are_the_fp8_codec():
    """NVFP4's E4M3 scales use the same codec."""
    x = every_16_bit_float()
    assert np.array_equal(ref.e4m3_encode(x), ref.fp8_encode(x, "e4m3"))
    codes = np.arange(256, dtype=np.uint8)
    assert np.array_equal(ref.e4m3_decode(codes), ref.fp8_decode(codes, "e4m3"), equal_nan=True)


@pytest.mark.parametrize("fmt", FORMATS)
def test_encoder_matches_brute_force(fmt, seed):
    """Nearest value, ties to the even code, saturating at the largest finite value: on every
    fp16 and bf16 value, around every midpoint and the saturation threshold, on random float32
    bit patterns (every binade) and on random values of the format's range."""
    rng = np.random.default_rng(seed)
    mags = np.array(finite_magnitudes(fmt), np.float64)
    midpoints = ((mags[1:] + mags[:-1]) / 2).astype(np.float32)  # exact in float32
    top = mags[-1] + (mags[-1] - mags[-2]) / 2                   # where saturation begins
    wide = rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    fmax = ref.FP8_MAX[fmt]
    x = np.concatenate([every_16_bit_float(), around(np.concatenate([midpoints, -midpoints])),
                        around(np.float32([fmax, top, 2 * fmax, -top])), wide,
                        rng.uniform(-1.1 * fmax, 1.1 * fmax, 100_000).astype(np.float32)])
    got = ref.fp8_encode(x, fmt)
    want = nearest_code(x, mags, 7)
    want[np.isnan(x)] = ref.FP8_NAN
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, f"seed {seed}: {x[bad[:5]]} -> {got[bad[:5]]}, want {want[bad[:5]]}"


TIES_AND_LIMITS = {
    "e4m3": {1.0625: 0x38, 1.1875: 0x3A,                 # 1 + 1/16 -> 1.0; 1.1875 -> 1.25
             2.0 ** -10: 0x00, 3 * 2.0 ** -10: 0x02,     # subnormal ties: 0; 2**-8
             15 * 2.0 ** -10: 0x08,                      # 7.5 * 2**-9 -> 2**-6 (normal)
             448.0: 0x7E, 464.0: 0x7E, 464.00003: 0x7E, 1e30: 0x7E, np.inf: 0x7E,
             -464.0: 0xFE, -np.inf: 0xFE, -0.0: 0x80, -1e-30: 0x80},
    "e5m2": {1.125: 0x3C, 1.375: 0x3E,                   # 1 + 1/8 -> 1.0; 1.375 -> 1.5
             2.0 ** -17: 0x00, 3 * 2.0 ** -17: 0x02,     # subnormal ties: 0; 2**-15
             7 * 2.0 ** -17: 0x04,                       # 3.5 * 2**-16 -> 2**-14 (normal)
             57344.0: 0x7B, 61439.996: 0x7B,             # below the midpoint to 65536
             61440.0: 0x7B,                              # the tie: 65536 (inf), saturated
             1e30: 0x7B, np.inf: 0x7B, -61440.0: 0xFB, -np.inf: 0xFB, -0.0: 0x80,
             -1e-30: 0x80},
}


@pytest.mark.parametrize("fmt", FORMATS)
def test_ties_round_to_even_and_saturate(fmt):
    cases = TIES_AND_LIMITS[fmt]
    got = ref.fp8_encode(np.array(list(cases), np.float32), fmt)
    assert [int(g) for g in got] == list(cases.values()), {k: hex(g) for k, g in zip(cases, got)}


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_nan_encodes_as_0x7f(fmt):
    """NaN of either sign and any payload gives 0x7F, the byte PTX cvt writes."""
    bits = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF,
                     0x7FA00000], np.uint32)
    assert (ref.fp8_encode(bits.view(np.float32), fmt) == 0x7F).all()


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="e4m3"):
        ref.fp8_encode(np.float32([1]), "e3m4")
    with pytest.raises(ValueError, match="e4m3"):
        ref.fp8_decode(np.uint8([1]), "fp8")


# ---------------------------------------------------------------------------------------------
# quantize_fp8 / dequantize_fp8, against loops over the scopes
# ---------------------------------------------------------------------------------------------
def scope_of(granularity, r, c):
    """The key of the scale that element (r, c) uses: its index into the scales' shape."""
    return {"tensor": (0,), "row": (r,), "block1x128": (r, c // 128),
            "block128x128": (r // 128, c // 128)}[granularity]


def loop_scales(xf, fmt, granularity):
    """Dynamic scales element by element: amax over each scope (NaN skipped), / FMAX in float32,
    0 or subnormal -> 1."""
    rows, cols = xf.shape
    amax = {}
    for r in range(rows):
        for c in range(cols):
            key = scope_of(granularity, r, c)
            v = xf[r, c]
            amax[key] = max(amax.get(key, np.float32(0)),
                            np.float32(0) if np.isnan(v) else abs(v))
    scales = np.zeros(ref.fp8_scale_shape(rows, cols, granularity), np.float32)
    for key, a in amax.items():
        s = np.float32(a) / np.float32(ref.FP8_MAX[fmt])
        scales[key] = s if s >= np.float32(2.0 ** -126) else np.float32(1)
    return scales


def loop_codes(xf, scales, fmt, granularity):
    rows, cols = xf.shape
    q = np.zeros((rows, cols), np.uint8)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        for r in range(rows):
            for c in range(cols):
                inv = np.float32(1) / scales[scope_of(granularity, r, c)]
                q[r, c] = ref.fp8_encode(np.float32([xf[r, c] * inv]), fmt)[0]
    return q


def small_input(rng, shape, dtype):
    """Random values with specials: zeros, NaN, and a scope of tiny values."""
    x = ref.to_f32(ref.random_input(rng, shape, dtype), dtype).copy()
    x[rng.random(shape) < 0.02] = np.nan
    x[rng.random(shape) < 0.02] = 0.0
    return ref.to_dtype(x, dtype)


@pytest.mark.parametrize("shape", [(3, 5), (130, 300), (129, 129), (1, 257), (200, 1)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_matches_loops(fmt, granularity, shape, seed):
    rng = np.random.default_rng(seed)
    dtype = ("fp32", "fp16", "bf16")[seed % 3]
    x = small_input(rng, shape, dtype)
    xf = ref.to_f32(x, dtype)
    q, scales = ref.quantize_fp8(x, dtype, fmt, granularity)
    want_scales = loop_scales(xf, fmt, granularity)
    assert scales.shape == ref.fp8_scale_shape(*shape, granularity)
    assert np.array_equal(scales.view(np.uint32), want_scales.view(np.uint32)), f"seed {seed}"
    assert np.array_equal(q, loop_codes(xf, scales, fmt, granularity)), f"seed {seed}"
    # Static: the given scales come back (in the scales' shape) and encode the same way.
    static = (want_scales * rng.uniform(0.5, 2, want_scales.shape)).astype(np.float32)
    q2, s2 = ref.quantize_fp8(x, dtype, fmt, granularity, static.reshape(-1))
    assert np.array_equal(s2, static) and s2.shape == static.shape
    assert np.array_equal(q2, loop_codes(xf, static, fmt, granularity)), f"seed {seed}"


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_scale_shapes_have_partial_blocks(granularity):
    want = {"tensor": [(1,)] * 3, "row": [(1,), (129,), (300,)],
            "block1x128": [(1, 1), (129, 2), (300, 1)],
            "block128x128": [(1, 1), (2, 2), (3, 1)]}[granularity]
    got = [ref.fp8_scale_shape(r, c, granularity) for r, c in ((1, 1), (129, 129), (300, 128))]
    assert got == want
    with pytest.raises(ValueError, match="block1x128"):
        ref.fp8_scale_shape(1, 1, "block")


@pytest.mark.parametrize("fmt", FORMATS)
def test_zero_nan_tiny_and_infinite_scopes(fmt):
    """1 x 128 blocks of a 1 x 640 row: all zero, all NaN, tiny (amax / FMAX subnormal), with
    an infinity, and an ordinary one."""
    fmax = np.float32(ref.FP8_MAX[fmt])
    x = np.zeros((1, 640), np.float32)
    x[0, 128:256] = np.nan
    x[0, 256:384] = 1e-37
    x[0, 256] = 0.0
    x[0, 384:512] = 3.0
    x[0, 400] = -np.inf
    x[0, 512:640] = np.linspace(-2, 2, 128, dtype=np.float32)
    q, scales = ref.quantize_fp8(x, "fp32", fmt, "block1x128")
    assert list(scales[0, :3]) == [1, 1, 1]              # zero, NaN, subnormal amax / FMAX
    assert scales[0, 3] == np.inf                         # inf amax: inv = 0
    assert scales[0, 4] == np.float32(2) / fmax
    assert (q[0, :128] == 0).all() and (q[0, 128:256] == ref.FP8_NAN).all()
    assert (q[0, 256:384] == 0).all()                     # 1e-37 under scale 1 rounds to 0
    assert q[0, 400] == ref.FP8_NAN and (np.delete(q[0, 384:512], 16) == 0).all()
    assert q[0, 512] == MAX_CODE[fmt] | 0x80 and q[0, 639] == MAX_CODE[fmt]
    back = ref.dequantize_fp8(q, scales, fmt, "block1x128", "fp32")
    assert (back[0, :128] == 0).all() and np.isnan(back[0, 128:256]).all()


@pytest.mark.parametrize("fmt", FORMATS)
def test_static_scales_saturate_and_keep_infinities_finite(fmt):
    x = np.float32([[1.0, -1.0, 1e6, -1e6, np.inf, -np.inf, np.nan, 0.0]])
    q, _ = ref.quantize_fp8(x, "fp32", fmt, "tensor", np.float32([1e-3]))
    m = MAX_CODE[fmt]
    assert list(q[0]) == [ref.fp8_encode(np.float32([1000.0]), fmt)[0],
                          ref.fp8_encode(np.float32([-1000.0]), fmt)[0],
                          m, m | 0x80, m, m | 0x80, ref.FP8_NAN, 0]


@pytest.mark.parametrize("out_dtype", ref.DTYPES)
@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_matches_loops(fmt, granularity, out_dtype, seed):
    rng = np.random.default_rng(seed)
    rows, cols = 130, 260
    q = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
    shape = ref.fp8_scale_shape(rows, cols, granularity)
    scales = (10.0 ** rng.uniform(-4, 2, shape)).astype(np.float32)
    got = ref.dequantize_fp8(q, scales.reshape(-1), fmt, granularity, out_dtype)
    want = np.empty((rows, cols), np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for r in range(rows):
            for c in range(cols):
                want[r, c] = np.float32(ocp_value(int(q[r, c]), fmt)) * \
                    scales[scope_of(granularity, r, c)]
    want = ref.to_dtype(want, out_dtype)
    as_f = ref.to_f32(got, out_dtype), ref.to_f32(want, out_dtype)
    assert np.array_equal(*as_f, equal_nan=True), f"seed {seed}"


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_error_is_half_a_step(fmt, granularity, seed):
    """|x - x'| is at most half an FP8 step of x / scale, times the scale: 2**-(M + 1) |x| in
    the normal range, half the subnormal quantum times the scale below it (plus float32
    roundings of x * inv and q * scale, covered by the 1e-6 relative slack)."""
    rng = np.random.default_rng(seed)
    x = ref.random_input(rng, (200, 300), "fp32")
    q, scales = ref.quantize_fp8(x, "fp32", fmt, granularity)
    back = ref.dequantize_fp8(q, scales, fmt, granularity, "fp32")
    ri, ci = np.indices(x.shape)
    scale = scales.reshape(scales.shape[0], -1)[
        {"tensor": (0 * ri, 0 * ci), "row": (ri, 0 * ci), "block1x128": (ri, ci // 128),
         "block128x128": (ri // 128, ci // 128)}[granularity]].astype(np.float64)
    bound = (np.maximum(np.abs(x) * 2.0 ** -(MANTISSA_BITS[fmt] + 1),
                        SUBNORMAL_QUANTUM[fmt] / 2 * scale) * (1 + 1e-6))
    err = np.abs(x.astype(np.float64) - back)
    assert (err <= bound).all(), f"seed {seed}: worst {np.max(err / bound)}"


def test_bad_scales_and_codes_are_refused():
    x = np.zeros((4, 200), np.float32)
    with pytest.raises(ValueError, match="scales"):
        ref.quantize_fp8(x, "fp32", "e4m3", "block1x128", np.ones(3, np.float32))
    with pytest.raises(TypeError):
        ref.quantize_fp8(x, "fp32", "e4m3", "tensor", np.ones(1, np.float64))
    with pytest.raises(ValueError, match="scales"):
        ref.dequantize_fp8(np.zeros((4, 200), np.uint8), np.ones(4, np.float32), "e5m2",
                           "block128x128", "fp32")
    with pytest.raises(TypeError):
        ref.dequantize_fp8(np.zeros((4, 200), np.int8), np.ones(1, np.float32), "e5m2",
                           "tensor", "fp32")
