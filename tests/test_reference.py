"""CPU tests of tests/reference.py: the references must have the properties the header promises.

They run everywhere (no GPU). Data is fresh every run: each test draws a seed from os.urandom,
prints it and names it in its assertion messages; CK_TEST_SEED=<seed> replays a failure.
"""

import os

import numpy as np
import pytest

import reference as ref

# Named tolerance: a round trip x -> q -> x' is off by at most half a quantization step, plus the
# float32 rounding of inv = 1/scale, of x * inv and of q * scale. Those add at most about 2.3e-5
# of a step (a few ulps of 127); 1e-4 of a step is a safe bound.
ROUND_TRIP_SLACK = 1e-4

INT4_SHAPES = [(1, 1), (3, 5), (5, 100), (4, 257), (2, 1000)]


@pytest.fixture
def seed(request):
    seed = int(os.environ.get("CK_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    print(f"{request.node.nodeid}: seed {seed} (replay with CK_TEST_SEED={seed})")
    return seed


def group_scales_per_column(scales_f32, cols, group_size):
    """[rows, groups] -> [rows, cols]: the scale that applies to each element."""
    width = cols if group_size == ref.GROUP_ROW else group_size
    return scales_f32[:, np.arange(cols) // width]


# ---------------------------------------------------------------------------------------------
# Floating-point representations
# ---------------------------------------------------------------------------------------------
def test_bf16_ties_round_to_even():
    cases = {  # float32 bits -> expected bfloat16 bits
        0x3F808000: 0x3F80,  # 1 + half an ulp: tie, 0x3F80 is even
        0x3F818000: 0x3F82,  # tie, 0x3F81 is odd: round up
        0x3F808001: 0x3F81,  # just above the tie
        0x3F807FFF: 0x3F80,  # just below the tie
        0xBF818000: 0xBF82,  # negative tie
        0x7F7F8000: 0x7F80,  # tie at the top of the range rounds to +inf (0x7F7F is odd)
        0x7F7F7FFF: 0x7F7F,  # largest value that stays finite
        0x7F800000: 0x7F80,  # +inf
        0xFF800000: 0xFF80,  # -inf
        0x00008000: 0x0000,  # subnormal tie to even (zero)
        0x00018000: 0x0002,
        0x80000000: 0x8000,  # -0
    }
    x = np.array(list(cases), dtype=np.uint32).view(np.float32)
    got = ref.f32_to_bf16_bits(x)
    want = np.array(list(cases.values()), dtype=np.uint16)
    assert np.array_equal(got, want), [f"{a:#x}->{b:#x}" for a, b in zip(cases, got)]


def test_bf16_nan_stays_nan():
    nan_bits = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF, 0xFFFFFFFF], np.uint32)
    got = ref.bf16_bits_to_f32(ref.f32_to_bf16_bits(nan_bits.view(np.float32)))
    assert np.isnan(got).all(), got


def test_bf16_rounding_picks_the_nearer_neighbour(seed):
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    bits = bits[~np.isnan(bits.view(np.float32)) & ~np.isinf(bits.view(np.float32))]
    bits = bits[(bits & 0x7F7F0000) != 0x7F7F0000]  # the top binade may round to inf: see above
    x = bits.view(np.float32).astype(np.float64)
    got = ref.bf16_bits_to_f32(ref.f32_to_bf16_bits(bits.view(np.float32))).astype(np.float64)
    # The two bfloat16 neighbours of x (truncation and the next one away from zero), in float64.
    below = ref.bf16_bits_to_f32((bits >> 16).astype(np.uint16)).astype(np.float64)
    above = ref.bf16_bits_to_f32(((bits >> 16) + 1).astype(np.uint16)).astype(np.float64)
    d_below, d_above = np.abs(x - below), np.abs(above - x)
    even_is_below = ((bits >> 16) & 1) == 0
    tie_winner = np.where(even_is_below, below, above)
    want = np.where(d_below < d_above, below, np.where(d_above < d_below, above, tie_winner))
    assert np.array_equal(got, want), f"seed={seed}"


def test_bf16_round_trip_of_every_bf16_value():
    all_bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    values = ref.bf16_bits_to_f32(all_bits)
    keep = ~np.isnan(values)
    assert np.array_equal(ref.f32_to_bf16_bits(values)[keep], all_bits[keep])


def test_fp16_ties_round_to_even():
    x = np.array([2049, 2051, -2049, 65519, 65520], dtype=np.float32)  # ulp 2 above 2048
    got = ref.to_f32(ref.to_dtype(x, "fp16"), "fp16")
    assert np.array_equal(got, np.array([2048, 2052, -2048, 65504, np.inf], dtype=np.float32)), got


@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_random_input_is_representable_and_varied(dtype, seed):
    rng = np.random.default_rng(seed)
    x = ref.random_input(rng, (64, 256), dtype)
    assert x.dtype == ref.NUMPY_DTYPE[dtype]
    xf = ref.to_f32(x, dtype)
    assert np.array_equal(ref.to_dtype(xf, dtype).view(np.uint8), x.view(np.uint8)), f"seed={seed}"
    assert np.isfinite(xf).all(), f"seed={seed}"
    row_absmax = np.abs(xf).max(axis=1)
    assert row_absmax.max() > 10 * np.median(row_absmax), f"rows differ in scale, seed={seed}"
    zeroed = ref.random_input(rng, (4, 8), dtype, zero_rows=[1, 3])
    assert (ref.to_f32(zeroed, dtype)[[1, 3]] == 0).all()


# ---------------------------------------------------------------------------------------------
# Packed INT4
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cols", [1, 2, 7, 8, 33, 100])
@pytest.mark.parametrize("signed", [True, False])
def test_pack_unpack_identity(cols, signed, seed):
    rng = np.random.default_rng(seed)
    lo, hi = ref.INT4_SYM_RANGE if signed else ref.INT4_ASYM_RANGE
    q = rng.integers(lo, hi + 1, size=(3, cols)).astype(np.int8)
    packed = ref.pack_int4(q, signed)
    assert packed.dtype == np.uint8 and packed.shape == (3, (cols + 1) // 2)
    assert np.array_equal(ref.unpack_int4(packed, cols, signed), q), f"seed={seed}"
    if cols % 2:
        assert (packed[:, -1] >> 4 == 0).all(), "the last high nibble of an odd row must be 0"


def test_pack_int4_layout():
    # element 2i in the low nibble, 2i+1 in the high nibble, two's complement: -2 is 0xE
    assert ref.pack_int4(np.array([[1, -2, 3]]), signed=True).tolist() == [[0xE1, 0x03]]
    assert ref.pack_int4(np.array([[15, 0, 4, 9]]), signed=False).tolist() == [[0x0F, 0x94]]
    assert ref.unpack_int4(np.array([[0x8F]], np.uint8), 2, signed=True).tolist() == [[-1, -8]]


@pytest.mark.parametrize("signed, bad", [(True, 8), (True, -9), (False, 16), (False, -1)])
def test_pack_int4_rejects_out_of_range(signed, bad):
    with pytest.raises(ValueError):
        ref.pack_int4(np.array([[0, bad]]), signed)


@pytest.mark.parametrize(
    "cols, group_size, groups",
    [(100, 32, 4), (128, 128, 1), (129, 128, 2), (1, 32, 1), (64, 64, 1), (5, -1, 1),
     (40000, -1, 1)],
)
def test_int4_groups_per_row(cols, group_size, groups):
    assert ref.int4_groups_per_row(cols, group_size) == groups


# ---------------------------------------------------------------------------------------------
# INT8
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("granularity", ref.GRANULARITIES)
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_int8_round_trip_within_half_a_step(dtype, granularity, seed):
    rng = np.random.default_rng(seed)
    x = ref.random_input(rng, (33, 300), dtype)
    q, scales = ref.quantize_int8(x, dtype, granularity)
    assert q.dtype == np.int8 and scales.dtype == np.float32
    assert scales.shape == ((1,) if granularity == "tensor" else (33,))
    assert (np.abs(q.astype(np.int16)) <= 127).all()
    xf = ref.to_f32(x, dtype)
    back = ref.dequantize_int8(q, scales, granularity, "fp32")
    step = np.broadcast_to(scales[:, None], xf.shape)
    err = np.abs(xf - back)
    worst = np.max(err / step)
    assert (err <= step * (0.5 + ROUND_TRIP_SLACK)).all(), f"max err/step {worst}, seed={seed}"
    # Dynamic scales are absmax / 127: the largest element of each scale's span maps to +-127.
    span_max = np.abs(q.astype(np.int16)).max(axis=None if granularity == "tensor" else 1)
    assert (span_max == 127).all(), f"seed={seed}"
    # The output dtype rounding is the last step.
    assert np.array_equal(
        ref.dequantize_int8(q, scales, granularity, dtype).view(np.uint8),
        ref.to_dtype(back, dtype).view(np.uint8),
    )


@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_int8_ties_round_to_even(dtype):
    x = ref.to_dtype(np.array([[0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 126.5]], np.float32), dtype)
    q, _ = ref.quantize_int8(x, dtype, "tensor", scales=np.array([1.0], np.float32))
    assert q.tolist() == [[0, 2, 2, 0, -2, -2, 4, 126]]


@pytest.mark.parametrize("granularity", ref.GRANULARITIES)
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_int8_static_scale_saturates(dtype, granularity, seed):
    rng = np.random.default_rng(seed)
    x = ref.random_input(rng, (4, 500), dtype, scale=10.0)
    n_scales = 1 if granularity == "tensor" else 4
    tiny = np.full(n_scales, 0.01, np.float32)
    q, scales = ref.quantize_int8(x, dtype, granularity, scales=tiny)
    assert np.array_equal(scales, tiny), "static scales are returned as given"
    xf = ref.to_f32(x, dtype)
    big = np.abs(xf * np.float32(100)) >= 127.5
    assert big.any(), f"seed={seed}"
    assert np.array_equal(q[big], np.where(xf[big] > 0, 127, -127)), f"seed={seed}"
    assert q.min() >= -127, "never -128"


@pytest.mark.parametrize("granularity", ref.GRANULARITIES)
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_int8_zero_absmax_gives_scale_one(dtype, granularity, seed):
    rng = np.random.default_rng(seed)
    if granularity == "tensor":  # the whole tensor is zero
        x = ref.to_dtype(np.zeros((3, 40), np.float32), dtype)
        zero_rows, zero_scales = [0, 1, 2], [0]
    else:  # one row is zero
        x = ref.random_input(rng, (3, 40), dtype, zero_rows=[1])
        zero_rows, zero_scales = [1], [1]
    q, scales = ref.quantize_int8(x, dtype, granularity)
    assert (scales[zero_scales] == 1).all() and (q[zero_rows] == 0).all(), f"seed={seed}"
    back = ref.to_f32(ref.dequantize_int8(q, scales, granularity, dtype), dtype)
    assert not np.isnan(back).any() and (back[zero_rows] == 0).all(), f"seed={seed}"


@pytest.mark.parametrize("granularity", ref.GRANULARITIES)
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_int8_nan_encodes_as_zero_and_is_ignored(dtype, granularity, seed):
    rng = np.random.default_rng(seed)
    xf = ref.to_f32(ref.random_input(rng, (4, 64), dtype), dtype)
    nan_at = rng.random(xf.shape) < 0.1
    nan_at[2] = True  # a row of NaN only: its absmax is 0, its scale 1
    with_nan = ref.to_dtype(np.where(nan_at, np.nan, xf), dtype)
    q, scales = ref.quantize_int8(with_nan, dtype, granularity)
    q_clean, scales_clean = ref.quantize_int8(ref.to_dtype(np.where(nan_at, 0, xf), dtype), dtype,
                                              granularity)
    assert (q[nan_at] == 0).all(), f"seed={seed}"
    assert np.array_equal(q, q_clean) and np.array_equal(scales, scales_clean), f"seed={seed}"
    assert np.isfinite(scales).all()


# ---------------------------------------------------------------------------------------------
# INT4
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", INT4_SHAPES)
@pytest.mark.parametrize("group_size", ref.INT4_GROUP_SIZES)
@pytest.mark.parametrize("mode", ref.INT4_MODES)
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_int4_round_trip_within_half_a_step(dtype, mode, group_size, shape, seed):
    rng = np.random.default_rng(seed)
    rows, cols = shape
    groups = ref.int4_groups_per_row(cols, group_size)
    x = ref.random_input(rng, shape, dtype)
    packed, scales, zeros = ref.quantize_int4(x, dtype, group_size, mode)
    assert packed.shape == (rows, (cols + 1) // 2) and packed.dtype == np.uint8
    assert scales.shape == (rows, groups) and scales.dtype == ref.NUMPY_DTYPE[dtype]
    if mode == "sym":
        assert zeros is None
    else:
        assert zeros.shape == (rows, groups) and zeros.dtype == np.uint8 and zeros.max() <= 15

    xf = ref.to_f32(x, dtype)
    scales_f32 = ref.to_f32(scales, dtype)
    assert (scales_f32 > 0).all() and np.isfinite(scales_f32).all(), f"seed={seed}"
    step = group_scales_per_column(scales_f32, cols, group_size)
    scales_fp32 = ref.to_dtype(scales_f32, "fp32")  # dequantize to fp32 takes fp32 scales
    back = ref.dequantize_int4(packed, scales_fp32, zeros, cols, group_size, mode, "fp32")
    # Codes stay in range: saturation happens only where the unclamped code leaves it.
    q = ref.unpack_int4(packed, cols, signed=(mode == "sym")).astype(np.int16)
    lo, hi = ref.INT4_SYM_RANGE if mode == "sym" else ref.INT4_ASYM_RANGE
    unclamped = np.rint(xf * (np.float32(1) / step))
    if mode == "asym":
        unclamped += group_scales_per_column(zeros.astype(np.float32), cols, group_size)
    saturated = (unclamped < lo) | (unclamped > hi)
    assert np.array_equal(q[saturated], np.where(unclamped[saturated] < lo, lo, hi))
    err = np.abs(xf - back)
    assert (err[~saturated] <= (step * (0.5 + ROUND_TRIP_SLACK))[~saturated]).all(), (
        f"max err/step {np.max(err / step)}, seed={seed}"
    )
    # Saturation happens only in asym mode, at the top of the range when both the zero point and
    # hi * inv round up (and the stored scale rounded down): the error stays under one step.
    assert mode == "asym" or not saturated.any(), f"seed={seed}"
    assert (err[saturated] <= step[saturated]).all(), f"seed={seed}"
    # Dequantizing to the input dtype is the float32 result rounded once more.
    assert np.array_equal(
        ref.dequantize_int4(packed, scales, zeros, cols, group_size, mode, dtype).view(np.uint8),
        ref.to_dtype(back, dtype).view(np.uint8),
    )


@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_int4_ties_round_to_even(dtype):
    # sym: absmax 7 -> scale exactly 1 in every dtype
    x = ref.to_dtype(np.array([[7, 0.5, 1.5, 2.5, -2.5, -0.5, -6.5]], np.float32), dtype)
    packed, scales, _ = ref.quantize_int4(x, dtype, ref.GROUP_ROW, "sym")
    assert ref.to_f32(scales, dtype).tolist() == [[1.0]]
    assert ref.unpack_int4(packed, 7, signed=True).tolist() == [[7, 0, 2, 2, -2, 0, -6]]
    # asym: lo = -2.5, hi = 12.5 -> scale exactly 1, zero = rint(2.5) = 2
    x = ref.to_dtype(np.array([[-2.5, 12.5, 0.5, 1.5, 2.5, -1.5]], np.float32), dtype)
    packed, scales, zeros = ref.quantize_int4(x, dtype, ref.GROUP_ROW, "asym")
    assert ref.to_f32(scales, dtype).tolist() == [[1.0]] and zeros.tolist() == [[2]]
    assert ref.unpack_int4(packed, 6, signed=False).tolist() == [[0, 14, 2, 4, 4, 0]]


@pytest.mark.parametrize("mode", ref.INT4_MODES)
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_int4_zero_group_gives_scale_one(dtype, mode, seed):
    rng = np.random.default_rng(seed)
    xf = ref.to_f32(ref.random_input(rng, (3, 96), dtype, zero_rows=[0]), dtype)
    xf[2, 32:64] = 0  # one zero group inside a non-zero row
    packed, scales, zeros = ref.quantize_int4(ref.to_dtype(xf, dtype), dtype, 32, mode)
    scales_f32 = ref.to_f32(scales, dtype)
    assert (scales_f32[0] == 1).all() and scales_f32[2, 1] == 1, f"seed={seed}"
    q = ref.unpack_int4(packed, 96, signed=(mode == "sym"))
    assert (q[0] == 0).all() and (q[2, 32:64] == 0).all()
    if mode == "asym":
        assert (zeros[0] == 0).all() and zeros[2, 1] == 0
    back = ref.to_f32(ref.dequantize_int4(packed, scales, zeros, 96, 32, mode, dtype), dtype)
    assert not np.isnan(back).any() and (back[0] == 0).all() and (back[2, 32:64] == 0).all()


@pytest.mark.parametrize("mode", ref.INT4_MODES)
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_int4_nan_encodes_as_zero_and_is_ignored(dtype, mode, seed):
    rng = np.random.default_rng(seed)
    xf = ref.to_f32(ref.random_input(rng, (4, 128), dtype), dtype)
    nan_at = rng.random(xf.shape) < 0.1
    nan_at[1, :64] = True  # two groups of NaN only
    with_nan = ref.to_dtype(np.where(nan_at, np.nan, xf), dtype)
    packed, scales, zeros = ref.quantize_int4(with_nan, dtype, 32, mode)
    clean = ref.quantize_int4(ref.to_dtype(np.where(nan_at, 0, xf), dtype), dtype, 32, mode)
    assert np.array_equal(scales, clean[1]) and (mode == "sym" or np.array_equal(zeros, clean[2]))
    back = ref.to_f32(ref.dequantize_int4(packed, scales, zeros, 128, 32, mode, dtype), dtype)
    assert (back[nan_at] == 0).all(), f"NaN must encode as the code of 0, seed={seed}"
    assert not np.isnan(back).any()


@pytest.mark.parametrize("cols", [100, 33, 7])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("mode", ref.INT4_MODES)
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_int4_groups_are_independent(dtype, mode, group_size, cols, seed):
    """Each group (the last one partial) quantizes as if it were a whole row of its own."""
    rng = np.random.default_rng(seed)
    x = ref.random_input(rng, (3, cols), dtype)
    packed, scales, zeros = ref.quantize_int4(x, dtype, group_size, mode)
    signed = mode == "sym"
    q = ref.unpack_int4(packed, cols, signed)
    groups = ref.int4_groups_per_row(cols, group_size)
    assert scales.shape == (3, groups)
    for g in range(groups):
        in_group = slice(g * group_size, (g + 1) * group_size)
        part = x[:, in_group]
        p_packed, p_scales, p_zeros = ref.quantize_int4(part, dtype, ref.GROUP_ROW, mode)
        assert np.array_equal(scales[:, g : g + 1], p_scales), f"group {g}, seed={seed}"
        assert signed or np.array_equal(zeros[:, g : g + 1], p_zeros), f"group {g}, seed={seed}"
        p_q = ref.unpack_int4(p_packed, part.shape[1], signed)
        assert np.array_equal(q[:, in_group], p_q), f"group {g}, seed={seed}"


def test_int4_partial_group_scale():
    # cols = 100, group 32: groups of 32, 32, 32 and 4; the last scale comes from 4 values.
    x = np.zeros((1, 100), np.float32)
    x[0, :96] = 70.0
    x[0, 96:] = [0.7, -1.4, 0.0, 0.35]
    packed, scales, _ = ref.quantize_int4(x, "fp32", 32, "sym")
    assert scales.shape == (1, 4)
    full, partial = np.float32(70) / np.float32(7), np.float32(1.4) / np.float32(7)
    assert scales[0].tolist() == [full, full, full, partial]
    assert ref.unpack_int4(packed, 100, signed=True)[0, 96:].tolist() == [4, -7, 0, 2]


def test_int4_odd_cols_pack_a_zero_high_nibble():
    x = np.array([[1.0, -1.0, 7.0], [7.0, 7.0, 7.0]], np.float32)
    packed, scales, zeros = ref.quantize_int4(x, "fp32", ref.GROUP_ROW, "asym")
    assert packed.shape == (2, 2)
    assert (packed[:, 1] >> 4 == 0).all()
    packed, _, _ = ref.quantize_int4(x, "fp32", ref.GROUP_ROW, "sym")
    assert packed.tolist() == [[0xF1, 0x07], [0x77, 0x07]]


def test_int4_large_row_is_vectorized(seed):
    """1 x 1_000_003 (odd, not a multiple of any group): shapes and the round-trip bound."""
    rng = np.random.default_rng(seed)
    cols = 1_000_003
    x = ref.random_input(rng, (1, cols), "bf16")
    packed, scales, zeros = ref.quantize_int4(x, "bf16", 128, "asym")
    assert packed.shape == (1, 500_002) and scales.shape == (1, 7813) and zeros.shape == (1, 7813)
    back = ref.to_f32(ref.dequantize_int4(packed, ref.to_dtype(ref.to_f32(scales, "bf16"), "fp32"),
                                          zeros, cols, 128, "asym", "fp32"), "fp32")
    step = group_scales_per_column(ref.to_f32(scales, "bf16"), cols, 128)
    # Asymmetric saturation (see test_int4_round_trip_within_half_a_step): within one step.
    assert (np.abs(ref.to_f32(x, "bf16") - back) <= step).all(), f"seed={seed}"
