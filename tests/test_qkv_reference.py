"""CPU tests of the fused Q/K/V projection references in tests/reference.py (qkv_split,
rope_cos_sin_cache, apply_rope_f64, rope_float32_error, qkv_projection(_f64)): they must agree
with loops written from the words of the section, have the properties rotary embeddings have
(norms kept, position 0 the identity, q.k depending on the relative position only), equal the
published rotate-half formula, and the error bound must hold for a float32 emulation of the
projection and rotation while failing a rotation by the wrong position or in the wrong style.

Data is fresh every run (the `seed` fixture); CK_TEST_SEED=<seed> replays a failure.
"""
import math

import numpy as np
import pytest

import gpu_support as gs
import reference as ref

# (tokens, hidden, Hq, Hkv, D): MHA, GQA, MQA, and a head dim past the rotary dim.
SHAPES = [(5, 64, 4, 4, 16), (7, 96, 8, 2, 32), (3, 128, 4, 1, 64), (9, 32, 2, 1, 8)]
F64_RTOL = 1e-13


def random_problem(rng, shape, dtype, rotary_dim=None, bias=True, max_position=4096):
    """(x, w, bias, positions, cos_sin) for a projection of the given shape: N(0, 1) x, weights
    scaled by 1/sqrt(H) (so y ~ N(0, 1)), positions anywhere in the table."""
    t, hidden, hq, hkv, d = shape
    n = ref.qkv_output_columns(hq, hkv, d)
    x = ref.to_dtype(rng.standard_normal((t, hidden)).astype(np.float32), dtype)
    w = ref.to_dtype((rng.standard_normal((n, hidden)) / math.sqrt(hidden)).astype(np.float32),
                     dtype)
    b = ref.to_dtype(rng.standard_normal(n).astype(np.float32), dtype) if bias else None
    positions = rng.integers(0, max_position, size=t).astype(np.int32)
    cos_sin = ref.rope_cos_sin_cache(max_position, rotary_dim or d, base=500000.0)
    return x, w, b, positions, cos_sin


def rope_by_loop(x, positions, cos_sin, style):
    """The section's formulas, one pair at a time in Python floats."""
    out = np.array(x, dtype=np.float64)
    half = cos_sin.shape[1] // 2
    for t in range(x.shape[0]):
        row = [float(v) for v in cos_sin[positions[t]]]
        for h in range(x.shape[1]):
            for i in range(half):
                ia, ib = (i, i + half) if style == "neox" else (2 * i, 2 * i + 1)
                a, b, c, s = float(x[t, h, ia]), float(x[t, h, ib]), row[i], row[half + i]
                out[t, h, ia], out[t, h, ib] = a * c - b * s, b * c + a * s
    return out


def as_f64(a, dtype):
    return ref.to_f32(a, dtype).astype(np.float64)


# ---------------------------------------------------------------------------------------------
# Layout
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES)
def test_split_takes_q_then_k_then_v_rows_by_head(shape, seed):
    t, hidden, hq, hkv, d = shape
    y = np.random.default_rng(seed).standard_normal((t, ref.qkv_output_columns(hq, hkv, d)))
    q, k, v = ref.qkv_split(y, hq, hkv, d)
    assert q.shape == (t, hq, d) and k.shape == v.shape == (t, hkv, d)
    for h in range(hq):
        assert np.array_equal(q[:, h], y[:, h * d:(h + 1) * d])
    for h in range(hkv):
        assert np.array_equal(k[:, h], y[:, (hq + h) * d:(hq + h + 1) * d])
        assert np.array_equal(v[:, h], y[:, (hq + hkv + h) * d:(hq + hkv + h + 1) * d])


@pytest.mark.parametrize("dtype", ref.W4A16_DTYPES)
def test_projection_without_rope_is_the_linear_layer_split(dtype, seed):
    rng = np.random.default_rng(seed)
    shape = SHAPES[1]
    x, w, b, _, _ = random_problem(rng, shape, dtype)
    q, k, v = ref.qkv_projection_f64(x, w, *shape[2:4], dtype, bias=b)
    y = ref.linear_f64(x, w, b, "none", dtype)
    assert all(np.array_equal(a, e) for a, e in zip((q, k, v), ref.qkv_split(y, *shape[2:])))
    rounded = ref.qkv_projection(x, w, *shape[2:4], dtype, bias=b)
    assert all(np.array_equal(a, ref.round_f64_to_dtype(e, dtype))
               for a, e in zip(rounded, (q, k, v))), seed


# ---------------------------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("style", ref.ROPE_STYLES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rope_matches_the_loop(shape, style, seed):
    rng = np.random.default_rng(seed)
    t, _, hq, _, d = shape
    x = rng.standard_normal((t, hq, d))
    for rotary_dim in sorted({d, max(2, d // 2)}):
        positions = rng.integers(0, 300, size=t).astype(np.int32)
        cos_sin = ref.rope_cos_sin_cache(300, rotary_dim)
        got = ref.apply_rope_f64(x, positions, cos_sin, style)
        np.testing.assert_allclose(got, rope_by_loop(x, positions, cos_sin, style),
                                   rtol=F64_RTOL, atol=1e-15, err_msg=f"seed={seed}")
        assert np.array_equal(got[:, :, rotary_dim:], x[:, :, rotary_dim:]), seed


def test_rope_equals_the_published_rotate_half_formula(seed):
    """Llama and GPT-NeoX: x * cat(cos, cos) + rotate_half(x) * cat(sin, sin), rotate_half(x) =
    cat(-x2, x1) over the rotary dims (the reference implementations' own expression)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((6, 3, 32))
    positions = rng.integers(0, 1000, size=6).astype(np.int32)
    cos_sin = ref.rope_cos_sin_cache(1000, 32)
    c, s = (cos_sin[positions][:, None, h * 16:(h + 1) * 16].astype(np.float64) for h in (0, 1))
    rotate_half = np.concatenate([-x[..., 16:], x[..., :16]], axis=-1)
    want = x * np.concatenate([c, c], -1) + rotate_half * np.concatenate([s, s], -1)
    np.testing.assert_allclose(ref.apply_rope_f64(x, positions, cos_sin), want, rtol=F64_RTOL,
                               atol=1e-15, err_msg=f"seed={seed}")


def test_rope_cos_sin_cache_values():
    table = ref.rope_cos_sin_cache(2048, 8, base=10000.0)
    assert table.dtype == np.float32 and table.shape == (2048, 8)
    for p in (0, 1, 7, 2047):
        for i in range(4):
            angle = p * 10000.0 ** (-2 * i / 8)
            assert table[p, i] == np.float32(math.cos(angle))
            assert table[p, 4 + i] == np.float32(math.sin(angle))


@pytest.mark.parametrize("style", ref.ROPE_STYLES)
def test_rope_keeps_pair_norms_and_position_zero_is_the_identity(style, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((8, 2, 64))
    cos_sin = ref.rope_cos_sin_cache(10000, 64)
    positions = rng.integers(1, 10000, size=8).astype(np.int32)
    got = ref.apply_rope_f64(x, positions, cos_sin, style)
    # |(a, b)| is kept up to the float32 table's c^2 + s^2 = 1 +- 2^-23.
    pairs = (lambda a: np.hypot(a[..., :32], a[..., 32:])) if style == "neox" else \
        (lambda a: np.hypot(a[..., 0::2], a[..., 1::2]))
    np.testing.assert_allclose(pairs(got), pairs(x), rtol=2.0**-22, err_msg=f"seed={seed}")
    at_zero = ref.apply_rope_f64(x, np.zeros(8, dtype=np.int32), cos_sin, style)
    assert np.array_equal(at_zero, x), seed


def test_rope_scores_depend_on_the_relative_position_only(seed):
    """q at position p and k at position p - delta: q'.k' is the same for every p (the reason
    RoPE exists), up to the float32 table's rounding."""
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((2, 1, 1, 128))
    cos_sin = ref.rope_cos_sin_cache(5000, 128)
    delta = int(rng.integers(0, 100))
    scores = []
    for p in rng.integers(delta, 5000, size=6):
        qr = ref.apply_rope_f64(q, np.array([p], dtype=np.int32), cos_sin)
        kr = ref.apply_rope_f64(k, np.array([p - delta], dtype=np.int32), cos_sin)
        scores.append(float(np.sum(qr * kr)))
    # The table's entries are rounded to float32 (2^-24 relative each): far below 1e-4.
    assert np.ptp(scores) <= 1e-4 * np.sum(np.abs(q * k)), f"seed={seed}: {scores}"


def test_rope_rejects_bad_tables_and_positions():
    x = np.zeros((2, 1, 8))
    table = ref.rope_cos_sin_cache(16, 8)
    ok = np.array([0, 15], dtype=np.int32)
    ref.apply_rope_f64(x, ok, table)
    cases = [
        (ValueError, dict(positions=np.array([0, 16], dtype=np.int32))),
        (ValueError, dict(positions=np.array([-1, 0], dtype=np.int32))),
        (ValueError, dict(positions=np.array([0], dtype=np.int32))),
        (TypeError, dict(positions=ok.astype(np.int64))),
        (TypeError, dict(cos_sin=table.astype(np.float64))),
        (ValueError, dict(cos_sin=ref.rope_cos_sin_cache(16, 16))),       # rotary_dim > D
        (ValueError, dict(cos_sin=table[:, :7])),                          # odd
        (ValueError, dict(style="gptj")),
    ]
    for error, change in cases:
        args = {"x": x, "positions": ok, "cos_sin": table, "style": "neox", **change}
        with pytest.raises(error):
            ref.apply_rope_f64(**args)
    for bad in [dict(rotary_dim=3), dict(rotary_dim=0), dict(max_position=0), dict(base=1.0)]:
        with pytest.raises(ValueError):
            ref.rope_cos_sin_cache(**{"max_position": 4, "rotary_dim": 8, **bad})


def test_projection_rejects_bad_heads_and_half_rope(seed):
    rng = np.random.default_rng(seed)
    x, w, b, positions, cos_sin = random_problem(rng, SHAPES[1], "fp16")
    for hq, hkv in [(8, 3), (2, 4), (8, 0)]:
        with pytest.raises(ValueError):
            ref.qkv_projection_f64(x, w, hq, hkv, "fp16")
    with pytest.raises(ValueError):
        ref.qkv_projection_f64(x, w[:-1], 8, 2, "fp16")
    with pytest.raises(ValueError, match="both"):
        ref.qkv_projection_f64(x, w, 8, 2, "fp16", positions=positions)
    with pytest.raises(ValueError):
        ref.qkv_projection_f64(ref.to_f32(x, "fp16"), w, 8, 2, "fp32")


# ---------------------------------------------------------------------------------------------
# The error bound of a float32 kernel
# ---------------------------------------------------------------------------------------------
def emulated_kernel(x, w, b, hq, hkv, positions, cos_sin, style, dtype, position_shift=0):
    """What a kernel does in float32: the product accumulated in float32 (BLAS' order), the bias
    added, q and k rotated with float32 products and sums, rounded once to dtype."""
    xf, wf = ref.to_f32(x, dtype), ref.to_f32(w, dtype)
    y = xf @ wf.T
    if b is not None:
        y = y + ref.to_f32(b, dtype)[None, :]
    d = w.shape[0] // (hq + 2 * hkv)
    q, k, v = ref.qkv_split(y, hq, hkv, d)
    shifted = (positions + position_shift).astype(np.int32)
    rows = cos_sin[shifted]
    half = cos_sin.shape[1] // 2
    c, s = rows[:, None, :half], rows[:, None, half:]
    i = np.arange(half)
    a_idx, b_idx = (i, i + half) if style == "neox" else (2 * i, 2 * i + 1)
    for a in (q, k):
        first, second = a[:, :, a_idx].copy(), a[:, :, b_idx].copy()
        a[:, :, a_idx] = first * c - second * s
        a[:, :, b_idx] = second * c + first * s
    return tuple(ref.round_f64_to_dtype(a.astype(np.float64), dtype) for a in (q, k, v))


@pytest.mark.parametrize("style", ref.ROPE_STYLES)
@pytest.mark.parametrize("dtype", ref.W4A16_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_emulated_kernel_is_within_the_bound(shape, dtype, style, seed):
    rng = np.random.default_rng(seed)
    rotary_dim = shape[4] // 2 if shape[4] >= 32 else None
    x, w, b, positions, cos_sin = random_problem(rng, shape, dtype, rotary_dim)
    hq, hkv = shape[2:4]
    got = emulated_kernel(x, w, b, hq, hkv, positions, cos_sin, style, dtype)
    exact, tols = gs.qkv_tolerances(x, w, b, hq, hkv, positions, cos_sin, style, dtype)
    for name, g, e, tol in zip("qkv", got, exact, tols):
        gs.assert_within(as_f64(g, dtype), e, tol, f"{name} ({dtype}, {style}), seed={seed}")


@pytest.mark.parametrize("fault", ["position + 1", "other style"])
def test_wrong_rotation_breaks_the_bound(fault, seed):
    rng = np.random.default_rng(seed)
    shape = (16, 128, 4, 2, 64)
    x, w, b, positions, cos_sin = random_problem(rng, shape, "fp16", max_position=4096)
    positions = np.minimum(positions, 4094).astype(np.int32)
    hq, hkv = shape[2:4]
    if fault == "position + 1":
        got = emulated_kernel(x, w, b, hq, hkv, positions, cos_sin, "neox", "fp16", 1)
    else:
        got = emulated_kernel(x, w, b, hq, hkv, positions, cos_sin, "interleaved", "fp16")
    exact, tols = gs.qkv_tolerances(x, w, b, hq, hkv, positions, cos_sin, "neox", "fp16")
    with pytest.raises(AssertionError):
        gs.assert_within(as_f64(got[0], "fp16"), exact[0], tols[0], fault)
    # v is not rotated: the same either way.
    gs.assert_within(as_f64(got[2], "fp16"), exact[2], tols[2], "v")


@pytest.mark.parametrize("style", ("neox", "interleaved", None))
@pytest.mark.parametrize("shape, rotary_dim", [((1, 32, 4, 2, 16), 16), ((1, 32, 2, 1, 64), 48),
                                               ((1, 32, 3, 3, 8), 2)])
def test_prepack_rows_put_each_rotation_pair_side_by_side(shape, rotary_dim, style):
    _, _, hq, hkv, d = shape
    rows = ref.qkv_prepack_rows(hq, hkv, d, rotary_dim, style)
    n = ref.qkv_output_columns(hq, hkv, d)
    assert sorted(rows) == list(range(n)), "a permutation of the rows"
    if style != "neox":
        assert (rows == np.arange(n)).all()
        return
    half = rotary_dim // 2
    for h in range(hq + 2 * hkv):
        got = rows[h * d:(h + 1) * d] - h * d
        if h >= hq + hkv:   # v is never rotated: its rows stay
            assert (got == np.arange(d)).all()
            continue
        assert (got[0:rotary_dim:2] == np.arange(half)).all()
        assert (got[1:rotary_dim:2] == half + np.arange(half)).all()
        assert (got[rotary_dim:] == np.arange(rotary_dim, d)).all()
