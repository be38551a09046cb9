"""CPU tests of the Mixture-of-experts references in tests/reference.py (moe_route, moe_pairs_f64,
moe_layer_f64, moe_layer_reference): they must have the properties the header's MoE section
promises, and agree with plain loop implementations written from its words.

They run everywhere (no GPU). Data is fresh every run: each test draws a seed from os.urandom,
prints it and names it in its assertion messages; CK_TEST_SEED=<seed> replays a failure.
"""
import math

import numpy as np
import pytest

import reference as ref

U32 = 2.0**-24   # the unit roundoff of float32

# Logits on a grid of 1/64 in [-16, 16] (float32 values): distinct values are far apart (their
# probabilities differ by 1.6% or more), equal ones are exact ties.
GRID_STEP = 1.0 / 64

# A draw whose h overflows (about one in 500 in fp16) is replaced; this many failures in a row
# would mean the draw is broken, not unlucky.
MAX_REDRAWS = 50


def grid_logits(rng, shape, distinct=None):
    """float32 logits, multiples of 1/64 in [-16, 16]; `distinct` values at most (ties are
    then common), or any of the 2049 grid values."""
    grid = np.arange(-1024, 1025) * GRID_STEP
    if distinct is not None:
        grid = rng.choice(grid, size=distinct, replace=False)
    return rng.choice(grid, size=shape).astype(np.float32)


def brute_force_route(logits_f32, top_k, renormalize):
    """The route of the header, token by token in Python: exact softmax (float64), the experts
    sorted by (-p, index), the float32 weights renormalized by their float32 sum."""
    ids, weights = [], []
    for row in logits_f32.astype(np.float64):
        e = [math.exp(v - max(row)) for v in row]
        p = [v / math.fsum(e) for v in e]
        order = sorted(range(len(row)), key=lambda i: (-p[i], i))[:top_k]
        w = [np.float32(p[i]) for i in order]
        if renormalize:
            total = np.float32(0)
            for v in w:
                total = np.float32(total + v)
            w = [np.float32(v / total) for v in w]
        ids.append(order)
        weights.append(w)
    return np.array(ids, np.int32), np.array(weights, np.float32)


# The reference's float32 softmax against the exact one: exp correctly rounded (u), a float32
# sum of E positive terms (gamma_{E-1} relative, Higham Thm. 3.1, plus the terms' own u) and the
# division (u): relative error <= (E + 2) u, to first order.
def softmax_bound(experts):
    return (experts + 2) * U32 * 1.001


# ---------------------------------------------------------------------------------------------
# Route
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("experts, top_k", [(1, 1), (8, 1), (8, 2), (8, 8), (64, 6), (1000, 8),
                                            (1024, 32)])
@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("ties", [False, True], ids=["spread", "ties"])
def test_route_matches_brute_force(experts, top_k, renormalize, ties, seed):
    """ids exactly as a sort by (-p, index) picks them; weights within the float32 softmax's
    bound of the exact ones (ties: 4 distinct logit values per call, so equal probabilities sit
    at every rank, the top-k boundary included)."""
    rng = np.random.default_rng(seed)
    logits = grid_logits(rng, (7, experts), distinct=4 if ties else None)
    ids, weights = ref.moe_route(logits, top_k, renormalize)
    assert ids.dtype == np.int32 and weights.dtype == np.float32
    assert ids.shape == weights.shape == (7, top_k)
    want_ids, want_weights = brute_force_route(logits, top_k, renormalize)
    np.testing.assert_array_equal(ids, want_ids, err_msg=f"seed={seed}")
    # Renormalized weights carry the bound twice (the numerator and the sum), plus k roundings.
    bound = softmax_bound(experts) * (2 if renormalize else 1) + (top_k + 2) * U32
    np.testing.assert_allclose(weights, want_weights, rtol=bound, atol=0, err_msg=f"seed={seed}")


@pytest.mark.parametrize("experts, top_k", [(8, 2), (64, 6), (1000, 8), (1024, 32)])
@pytest.mark.parametrize("dtype", ref.MOE_ROUTER_DTYPES)
def test_route_properties(experts, top_k, dtype, seed):
    """Distinct ids in [0, E) per token, weights in descending order (ties by ascending id),
    each the token's probability; renormalized weights sum to 1 within k float32 roundings and
    keep the order and ids; the weights without it sum to at most 1 (the top k of a softmax)."""
    rng = np.random.default_rng(seed)
    logits = ref.to_dtype(rng.standard_normal((33, experts)).astype(np.float32) * 3, dtype)
    ids, weights = ref.moe_route(logits, top_k, False, dtype)
    p = ref.moe_softmax(logits, dtype)
    assert ((ids >= 0) & (ids < experts)).all(), f"seed={seed}"
    assert all(len(set(row)) == top_k for row in ids.tolist()), f"duplicate ids, seed={seed}"
    np.testing.assert_array_equal(weights, np.take_along_axis(p, ids, axis=1))
    assert (np.diff(weights, axis=1) <= 0).all(), f"not descending, seed={seed}"
    tied = np.diff(weights, axis=1) == 0
    assert (np.diff(ids, axis=1)[tied] > 0).all(), f"ties not by ascending id, seed={seed}"
    # Every expert left out has a probability no larger than the last one chosen.
    left_out = np.ones_like(p, dtype=bool)
    np.put_along_axis(left_out, ids, False, axis=1)
    assert (np.where(left_out, p, -1).max(axis=1) <= weights[:, -1]).all(), f"seed={seed}"
    assert (weights.astype(np.float64).sum(axis=1) <= 1 + softmax_bound(experts)).all()

    ids_r, weights_r = ref.moe_route(logits, top_k, True, dtype)
    np.testing.assert_array_equal(ids_r, ids, err_msg="renormalize changes the ids")
    sums = weights_r.astype(np.float64).sum(axis=1)
    assert np.abs(sums - 1).max() <= 2 * (top_k + 1) * U32, f"{sums}, seed={seed}"
    assert (np.diff(weights_r, axis=1) <= 0).all(), f"seed={seed}"


@pytest.mark.parametrize("experts", [1, 5, 64])
def test_route_top_1_renormalized_is_exactly_one(experts, seed):
    rng = np.random.default_rng(seed)
    _, weights = ref.moe_route(grid_logits(rng, (16, experts)), 1, True)
    assert (weights == 1).all(), f"seed={seed}"


@pytest.mark.parametrize("experts, top_k", [(8, 2), (64, 6), (1000, 32)])
def test_route_ties_go_to_the_lower_index(experts, top_k, seed):
    """All logits equal: the first k experts, each with weight 1/E (exp(0) = 1 and a sum of E
    ones are exact, the division is one rounding). Then the largest logit on a random set S:
    S's members in ascending order first."""
    rng = np.random.default_rng(seed)
    flat = np.full((3, experts), rng.integers(-8, 8), np.float32)
    ids, weights = ref.moe_route(flat, top_k, False)
    np.testing.assert_array_equal(ids, np.tile(np.arange(top_k), (3, 1)))
    assert (weights == np.float32(1) / np.float32(experts)).all()

    logits = grid_logits(rng, (9, experts)) - 32     # all below the top value, 0
    chosen = [np.sort(rng.choice(experts, size=rng.integers(1, top_k + 1), replace=False))
              for _ in range(9)]
    for t, s in enumerate(chosen):
        logits[t, s] = 0
    ids, _ = ref.moe_route(logits, top_k, True)
    for t, s in enumerate(chosen):
        np.testing.assert_array_equal(ids[t, :len(s)], s, err_msg=f"token {t}, seed={seed}")


@pytest.mark.parametrize("shift", [-3.0, 0.5, 2.0, 7.25])
def test_route_is_invariant_to_an_exact_shift(shift, seed):
    """Adding a constant to every logit of a token leaves l - max(l) unchanged when the shifted
    values are exact (grid values and the shift are multiples of 1/64 below 2^18): the same
    bits, ids and weights."""
    rng = np.random.default_rng(seed)
    logits = grid_logits(rng, (12, 64))
    a = ref.moe_route(logits, 6, False)
    b = ref.moe_route(logits + np.float32(shift), 6, False)
    np.testing.assert_array_equal(a[0], b[0], err_msg=f"seed={seed}")
    np.testing.assert_array_equal(a[1].view(np.uint32), b[1].view(np.uint32))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_route_of_half_logits_is_the_route_of_their_values(dtype, seed):
    rng = np.random.default_rng(seed)
    logits = ref.to_dtype(rng.standard_normal((20, 64)).astype(np.float32) * 4, dtype)
    a = ref.moe_route(logits, 4, True, dtype)
    b = ref.moe_route(ref.to_f32(logits, dtype), 4, True, "fp32")
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_route_rejects_bad_top_k():
    with pytest.raises(ValueError):
        ref.moe_route(np.zeros((2, 8), np.float32), 9, False)
    with pytest.raises(ValueError):
        ref.moe_route(np.zeros((2, 8), np.float32), 0, False)


# ---------------------------------------------------------------------------------------------
# The layer
# ---------------------------------------------------------------------------------------------
def random_layer(rng, tokens, hidden, inter, experts, top_k, dtype, mode="asym", group_size=32):
    """x [T, H], ids [T, k] (distinct per token), float32 weights [T, k] and the dequantized
    INT4 weights w13 [E, 2I, H], w2 [E, H, I] (moe_quantize -> moe_dequantize)."""
    x = ref.to_dtype(rng.standard_normal((tokens, hidden)).astype(np.float32), dtype)
    w13 = ref.random_input(rng, (experts * 2 * inter, hidden), dtype, scale=hidden**-0.5)
    w2 = ref.random_input(rng, (experts * hidden, inter), dtype, scale=inter**-0.5)
    w13 = ref.moe_dequantize(*ref.moe_quantize(w13.reshape(experts, 2 * inter, hidden), dtype,
                                               group_size, mode), hidden, group_size, dtype)
    w2 = ref.moe_dequantize(*ref.moe_quantize(w2.reshape(experts, hidden, inter), dtype,
                                              group_size, mode), inter, group_size, dtype)
    ids = np.array([rng.choice(experts, size=top_k, replace=False) for _ in range(tokens)],
                   np.int32).reshape(tokens, top_k)
    weights = rng.random((tokens, top_k)).astype(np.float32)
    return x, ids, weights, w13, w2


def assert_same_sum(got, want, x, ids, weights, w13, w2, dtype, context):
    """got and want are float64 values of the same k-term combine sum_j w_j y_j, added in
    different orders: they differ by at most (k - 1) roundings of partial sums no larger than
    sum_j |w_j y_j| (a cancelling sum can have a value far below its terms). Non-finite sums
    (an h rounded to inf) must agree exactly."""
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite], want[~finite], err_msg=context)
    y = ref.moe_pairs_f64(x, ids, w13, w2, dtype)["y"]
    terms = np.abs(np.asarray(weights, np.float64)[:, :, None] * y).sum(axis=1)
    bound = ids.shape[1] * np.finfo(np.float64).eps * terms
    with np.errstate(invalid="ignore"):
        excess = np.where(finite, np.abs(got - want) - bound, 0)
    assert (excess <= 0).all(), \
        f"{context}: {np.count_nonzero(excess > 0)} sums differ beyond {ids.shape[1]} roundings"


def loop_layer(x, ids, weights, w13, w2, dtype):
    """The header's formula, one pair and one element at a time: exactly rounded sums
    (math.fsum), h rounded to dtype, the combine in the order j = 0 .. k-1 in float64, then one
    rounding. Returns (out in dtype's representation, the float64 value before rounding)."""
    xf = ref.to_f32(x, dtype).astype(np.float64)
    w13f = ref.to_f32(w13, dtype).astype(np.float64)
    w2f = ref.to_f32(w2, dtype).astype(np.float64)
    experts, two_i, hidden = w13f.shape
    inter = two_i // 2
    value = np.zeros((xf.shape[0], hidden))
    for t in range(ids.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if not 0 <= e < experts:
                continue
            h = np.empty(inter)
            for i in range(inter):
                g = math.fsum(xf[t] * w13f[e, i])
                u = math.fsum(xf[t] * w13f[e, inter + i])
                silu = g / (1 + math.exp(-g)) if g > -700 else 0.0
                h[i] = ref.to_f32(ref.round_f64_to_dtype(silu * u, dtype), dtype)
            y = np.array([math.fsum(h * w2f[e, c]) for c in range(hidden)])
            value[t] += float(weights[t, j]) * y
    return ref.round_f64_to_dtype(value, dtype), value


@pytest.mark.parametrize("dtype", ref.MOE_DTYPES)
@pytest.mark.parametrize("mode", ref.INT4_MODES)
@pytest.mark.parametrize("shape", [(1, 32, 32, 1, 1), (3, 64, 32, 4, 2), (5, 32, 64, 8, 3)],
                         ids=lambda s: "x".join(map(str, s)))
def test_layer_matches_loop(shape, mode, dtype, seed):
    """moe_layer_reference against the loop: the float64 values agree to float64 rounding
    (different summation orders), the outputs bit for bit (a difference would need a value
    within ~1e-16 of a rounding midpoint of dtype)."""
    rng = np.random.default_rng(seed)
    tokens, hidden, inter, experts, top_k = shape
    x, ids, weights, w13, w2 = random_layer(rng, tokens, hidden, inter, experts, top_k, dtype,
                                            mode)
    got = ref.moe_layer_reference(x, ids, weights, w13, w2, dtype)
    want, value = loop_layer(x, ids, weights, w13, w2, dtype)
    np.testing.assert_allclose(ref.moe_layer_f64(x, ids, weights, w13, w2, dtype), value,
                               rtol=1e-12, atol=1e-14, err_msg=f"seed={seed}")
    assert got.dtype == ref.NUMPY_DTYPE[dtype] and got.shape == (tokens, hidden)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16),
                                  err_msg=f"seed={seed}")


@pytest.mark.parametrize("dtype", ref.MOE_DTYPES)
def test_gate_and_up_halves_and_the_rounding_of_h(dtype):
    """x = e_0, W1 row i = 2 e_0 and W3 row i = 3 e_0 (gate 2, up 3 for every i), W2 = one
    1 per row: h = round(silu(2) * 3) and out = w * h exactly; with gate and up swapped,
    round(silu(3) * 2) instead."""
    hidden = inter = 32
    x = np.zeros((1, hidden), np.float32)
    x[0, 0] = 1
    w13 = np.zeros((1, 2 * inter, hidden), np.float32)
    w13[0, :inter, 0], w13[0, inter:, 0] = 2, 3
    w2 = np.zeros((1, hidden, inter), np.float32)
    w2[0, np.arange(hidden), np.arange(hidden) % inter] = 1
    args = [ref.to_dtype(a, dtype) for a in (x, w13, w2)]
    weights = np.array([[0.5]], np.float32)
    ids = np.zeros((1, 1), np.int32)
    pairs = ref.moe_pairs_f64(args[0], ids, args[1], args[2], dtype)
    h = float(ref.to_f32(ref.round_f64_to_dtype(2 / (1 + math.exp(-2)) * 3, dtype), dtype))
    assert (pairs["g"] == 2).all() and (pairs["u"] == 3).all()
    assert (pairs["h"] == h).all() and h != 2 / (1 + math.exp(-2)) * 3
    out = ref.to_f32(ref.moe_layer_reference(*args[:1], ids, weights, *args[1:], dtype), dtype)
    assert (out == np.float32(0.5 * h)).all()
    swapped = np.concatenate([args[1][:, inter:], args[1][:, :inter]], axis=1)
    out = ref.to_f32(ref.moe_layer_reference(args[0], ids, weights, swapped, args[2], dtype),
                     dtype)
    h_swapped = float(ref.to_f32(ref.round_f64_to_dtype(3 / (1 + math.exp(-3)) * 2, dtype), dtype))
    assert (out == np.float32(0.5 * h_swapped)).all() and h_swapped != h


@pytest.mark.parametrize("dtype", ref.MOE_DTYPES)
def test_h_is_rounded_to_dtype(dtype, seed):
    """Every h of moe_pairs_f64 is a dtype value, the nearest to silu(g) * u."""
    rng = np.random.default_rng(seed)
    x, ids, weights, w13, w2 = random_layer(rng, 6, 64, 64, 4, 2, dtype)
    pairs = ref.moe_pairs_f64(x, ids, w13, w2, dtype)
    h, h_exact = pairs["h"], pairs["h_exact"]
    assert np.array_equal(ref.to_f32(ref.to_dtype(h, dtype), dtype), h.astype(np.float32))
    # A product past the dtype's largest finite value rounds to inf (fp16: from 65520 on).
    over = np.isinf(h)
    assert np.array_equal(np.sign(h[over]), np.sign(h_exact[over])), f"seed={seed}"
    assert np.isinf(ref.to_f32(ref.to_dtype(h_exact[over], dtype), dtype)).all(), f"seed={seed}"
    assert (np.abs(h - h_exact)[~over] <= 0.5 * ref.ulp(h_exact[~over], dtype)).all(), \
        f"seed={seed}"
    assert (h != h_exact).mean() > 0.9, "h must be rounded (almost no product is a dtype value)"


@pytest.mark.parametrize("dtype", ref.MOE_DTYPES)
def test_out_of_range_ids_contribute_nothing(dtype, seed):
    """Pairs with an id outside [0, E) (negative, E, far beyond, the int32 extremes) add
    nothing: the same bits as a layer where those pairs name expert 0 with weight 0; a token
    whose pairs are all out of range gets exactly 0. That comparison needs expert 0's pairs
    finite (0 * inf is NaN): random_layer's 100x rows can round h to inf in fp16, so such a
    draw is replaced by the next one."""
    rng = np.random.default_rng(seed)
    tokens, experts, top_k = 9, 8, 3
    bad_values = np.array([-1, experts, experts + 5, -2**31, 2**31 - 1], np.int32)
    for _ in range(MAX_REDRAWS):
        x, ids, weights, w13, w2 = random_layer(rng, tokens, 64, 32, experts, top_k, dtype)
        bad = rng.random(ids.shape) < 0.4
        bad[0] = True                               # token 0: no valid pair at all
        bad[1] = False
        ids_zero = np.where(bad, 0, ids).astype(np.int32)
        if np.isfinite(ref.moe_pairs_f64(x, ids_zero, w13, w2, dtype)["y"]).all():
            break
    else:
        pytest.fail(f"seed={seed}: {MAX_REDRAWS} draws all overflowed")
    ids_bad = np.where(bad, rng.choice(bad_values, size=ids.shape), ids).astype(np.int32)
    got = ref.moe_layer_reference(x, ids_bad, weights, w13, w2, dtype)
    want = ref.moe_layer_reference(x, ids_zero, np.where(bad, 0, weights).astype(np.float32),
                                   w13, w2, dtype)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16),
                                  err_msg=f"seed={seed}")
    assert (ref.to_f32(got[0], dtype) == 0).all()
    pairs = ref.moe_pairs_f64(x, ids_bad, w13, w2, dtype)
    np.testing.assert_array_equal(pairs["valid"], ~bad)
    assert (pairs["y"][bad] == 0).all() and (pairs["y"][~bad] != 0).any()


@pytest.mark.parametrize("dtype", ref.MOE_DTYPES)
def test_layer_is_linear_in_the_routing_weights(dtype, seed):
    """out(w) = sum_j w_j y_j: with one weight 1 and the others 0 the float64 layer is that
    pair's y; for any weights, the weighted sum of those (float64 rounding apart); scaling
    every weight by 2 doubles the output exactly (a power of two: the same roundings).
    Linearity needs finite pairs (0 * inf is NaN): random_layer's 100x rows can round h to inf
    in fp16 (about one draw in 500), so such a draw is replaced by the next one."""
    rng = np.random.default_rng(seed)
    for _ in range(MAX_REDRAWS):
        x, ids, weights, w13, w2 = random_layer(rng, 7, 64, 64, 6, 3, dtype)
        y = ref.moe_pairs_f64(x, ids, w13, w2, dtype)["y"]
        if np.isfinite(y).all():
            break
    else:
        pytest.fail(f"seed={seed}: {MAX_REDRAWS} draws all overflowed")
    total = np.zeros_like(y[:, 0])
    for j in range(3):
        one_hot = np.zeros_like(weights)
        one_hot[:, j] = 1
        alone = ref.moe_layer_f64(x, ids, one_hot, w13, w2, dtype)
        np.testing.assert_array_equal(alone, y[:, j])
        total += weights[:, j, None].astype(np.float64) * alone
    value = ref.moe_layer_f64(x, ids, weights, w13, w2, dtype)
    assert_same_sum(value, total, x, ids, weights, w13, w2, dtype, f"seed={seed}")
    doubled = ref.moe_layer_f64(x, ids, 2 * weights, w13, w2, dtype)
    np.testing.assert_array_equal(doubled, 2 * value)


@pytest.mark.parametrize("dtype", ref.MOE_DTYPES)
def test_layer_is_equivariant(dtype, seed):
    """Tokens are independent (permuting them permutes the output, bit for bit) and experts are
    labels (relabeling the weights and the ids together changes nothing); permuting the k
    slots of a token (ids and weights together) changes only the float64 summation order."""
    rng = np.random.default_rng(seed)
    tokens, experts, top_k = 11, 8, 3
    x, ids, weights, w13, w2 = random_layer(rng, tokens, 64, 32, experts, top_k, dtype)
    base = ref.moe_layer_reference(x, ids, weights, w13, w2, dtype)
    perm = rng.permutation(tokens)
    got = ref.moe_layer_reference(x[perm], ids[perm], weights[perm], w13, w2, dtype)
    np.testing.assert_array_equal(got.view(np.uint16), base[perm].view(np.uint16))
    relabel = rng.permutation(experts)            # new expert relabel[e] holds old expert e
    w13_r, w2_r = np.empty_like(w13), np.empty_like(w2)
    w13_r[relabel], w2_r[relabel] = w13, w2
    got = ref.moe_layer_reference(x, relabel[ids].astype(np.int32), weights, w13_r, w2_r, dtype)
    np.testing.assert_array_equal(got.view(np.uint16), base.view(np.uint16))
    slots = rng.permutation(top_k)
    value = ref.moe_layer_f64(x, ids[:, slots], weights[:, slots], w13, w2, dtype)
    assert_same_sum(value, ref.moe_layer_f64(x, ids, weights, w13, w2, dtype), x, ids, weights,
                    w13, w2, dtype, f"seed={seed}")


@pytest.mark.parametrize("mode", ref.INT4_MODES)
@pytest.mark.parametrize("group_size", ref.INT4_GROUP_SIZES)
def test_moe_quantize_is_per_expert_quantize_int4(mode, group_size, seed):
    """The stacked quantization is ck_quantize_int4 of each expert's [n, k] on its own, and
    moe_dequantize that of each expert's interchange weight."""
    rng = np.random.default_rng(seed)
    experts, n, k = 3, 16, 160
    w = ref.random_input(rng, (experts * n, k), "bf16").reshape(experts, n, k)
    packed, scales, zeros = ref.moe_quantize(w, "bf16", group_size, mode)
    deq = ref.moe_dequantize(packed, scales, zeros, k, group_size, "bf16")
    for e in range(experts):
        p, s, z = ref.quantize_int4(w[e], "bf16", group_size, mode)
        np.testing.assert_array_equal(packed[e], p)
        np.testing.assert_array_equal(scales[e], s)
        assert (z is None) == (zeros is None)
        if z is not None:
            np.testing.assert_array_equal(zeros[e], z)
        np.testing.assert_array_equal(deq[e], ref.dequantize_int4(p, s, z, k, group_size, mode,
                                                                  "bf16"))


def test_pairs_by_expert_covers_every_valid_pair(seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(-3, 12, size=(20, 4)).astype(np.int32)
    seen = np.zeros(ids.shape, int)
    for e, t, j in ref.moe_pairs_by_expert(ids, 8):
        assert (ids[t, j] == e).all() and 0 <= e < 8
        seen[t, j] += 1
    np.testing.assert_array_equal(seen, ((ids >= 0) & (ids < 8)).astype(int))


# ---------------------------------------------------------------------------------------------
# The prepacked expert weights
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("inter", [8, 32, 704])
def test_gate_up_rows_alternate_8_row_tiles(inter):
    """A permutation of the 2I rows; tile 2b holds gate rows 8b .. 8b+7 and tile 2b+1 the up
    rows I + 8b .. I + 8b+7: the gate and up halves of the same 8 outputs side by side."""
    rows = ref.moe_gate_up_rows(2 * inter)
    assert sorted(rows.tolist()) == list(range(2 * inter))
    tiles = rows.reshape(-1, 2, 8)
    np.testing.assert_array_equal(tiles[:, 0], np.arange(inter).reshape(-1, 8))
    np.testing.assert_array_equal(tiles[:, 1], inter + np.arange(inter).reshape(-1, 8))
    with pytest.raises(ValueError):
        ref.moe_gate_up_rows(24)


@pytest.mark.parametrize("mode", ref.INT4_MODES)
@pytest.mark.parametrize("gate_up", [False, True])
def test_moe_prepack_is_per_expert_w4a16_prepack(gate_up, mode, seed):
    """Expert e's prepacked weight, scales and zeros are ck_w4a16_prepack's of its rows (in
    moe_gate_up_rows order for the gate+up weight), at e times one expert's size."""
    rng = np.random.default_rng(seed)
    experts, n, k, group_size = 3, 32, 160, 64
    w = ref.random_input(rng, (experts * n, k), "fp16").reshape(experts, n, k)
    packed, scales, zeros = ref.moe_quantize(w, "fp16", group_size, mode)
    w_pre, s_pre, z_pre = ref.moe_prepack(packed, scales, zeros, k, group_size, gate_up)
    nbytes, nvalues = ref.w4a16_prepacked_sizes(n, k, group_size)
    assert (w_pre.size, s_pre.size) == ref.moe_prepacked_sizes(experts, n, k, group_size)
    assert (z_pre is None) == (mode == "sym")
    rows = ref.moe_gate_up_rows(n) if gate_up else np.arange(n)
    for e in range(experts):
        want = ref.w4a16_prepack(np.ascontiguousarray(packed[e][rows]), scales[e][rows],
                                 None if zeros is None else zeros[e][rows], n, k, group_size)
        np.testing.assert_array_equal(w_pre[e * nbytes:(e + 1) * nbytes], want[0])
        np.testing.assert_array_equal(s_pre[e * nvalues:(e + 1) * nvalues], want[1])
        if z_pre is not None:
            np.testing.assert_array_equal(z_pre[e * nvalues:(e + 1) * nvalues], want[2])
    if gate_up:   # the interleave moves rows: the prepacked bytes differ from the plain order
        plain = ref.moe_prepack(packed, scales, zeros, k, group_size, False)[0]
        assert not np.array_equal(plain, w_pre), f"seed={seed}"
