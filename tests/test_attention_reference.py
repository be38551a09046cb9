"""CPU tests of the attention references in tests/reference.py (attention_forward(_f64),
attention_decode(_f64), the paged gather, the split-KV partials and combine, the work counts and
attention_error_bound): they must agree with plain loop implementations written from the words
of the Attention section, have the properties attention has, and the error bound must hold for a
float32 emulation of a FlashAttention-2 kernel while failing a kernel with a wrong mask or a
wrong kv head.

They run everywhere (no GPU). Data is fresh every run: each test draws a seed from os.urandom,
prints it and names it in its assertion messages; CK_TEST_SEED=<seed> replays a failure.
"""
import math

import numpy as np
import pytest

import reference as ref

# float64 evaluations of the same exact quantity in different orders (BLAS dot products, sums of
# a few hundred terms, a split and combined softmax) agree to a few hundred float64 roundings.
F64_RTOL = 1e-12
F64_ATOL = 1e-14

HEAD_DIM = 64   # the smallest supported D: the loop implementations stay fast


def random_values(rng, shape, dtype, magnitude=1.0):
    """Standard normal values times `magnitude`, in dtype's representation."""
    return ref.to_dtype(rng.standard_normal(shape).astype(np.float32) * np.float32(magnitude),
                        dtype)


def random_qkv(rng, total_q, total_k, hq, hkv, dtype, head_dim=HEAD_DIM, magnitude=1.0):
    """q [total_q, Hq, D], k and v [total_k, Hkv, D]; q and k times `magnitude` (the logits
    scale * q.k then have a spread of about magnitude**2), v standard normal."""
    return (random_values(rng, (total_q, hq, head_dim), dtype, magnitude),
            random_values(rng, (total_k, hkv, head_dim), dtype, magnitude),
            random_values(rng, (total_k, hkv, head_dim), dtype))


def as_f64(x, dtype):
    return ref.to_f32(x, dtype).astype(np.float64)


def brute_force_attention(q, k, v, lengths_q, lengths_k, scale, causal, dtype):
    """The Attention section's words, one query row at a time in Python floats: the keys
    j <= i + Sk - Sq (causal) or all, of kv head h // (Hq / Hkv); logits scale * q.k (fsum);
    weights math.exp(x - max x); O = sum w v / sum w, lse = max x + log(sum w); O = 0 and
    lse = -inf without keys. Returns float64 (O [total_q, Hq, D], lse [total_q, Hq])."""
    qf, kf, vf = (as_f64(a, dtype).tolist() for a in (q, k, v))
    hq, hkv, head_dim = q.shape[1], k.shape[1], q.shape[2]
    o = np.zeros(q.shape)
    lse = np.full(q.shape[:2], -np.inf)
    q0 = k0 = 0
    for sq, sk in zip(lengths_q, lengths_k):
        for h in range(hq):
            g = h // (hq // hkv)
            for i in range(sq):
                keys = [j for j in range(sk) if not causal or j <= i + sk - sq]
                if not keys:
                    continue
                logits = [scale * math.fsum(a * b for a, b in zip(qf[q0 + i][h], kf[k0 + j][g]))
                          for j in keys]
                top = max(logits)
                weights = [math.exp(x - top) for x in logits]
                total = math.fsum(weights)
                for d in range(head_dim):
                    o[q0 + i, h, d] = math.fsum(w * vf[k0 + j][g][d]
                                                for w, j in zip(weights, keys)) / total
                lse[q0 + i, h] = top + math.log(total)
        q0 += sq
        k0 += sk
    return o, lse


def assert_same_attention(got, want, seed, rtol=F64_RTOL, atol=F64_ATOL):
    """(O, lse) pairs equal within float64 rounding; -inf lse (and O = 0) at the same places."""
    (o, lse), (o_want, lse_want) = got, want
    np.testing.assert_allclose(o, o_want, rtol=rtol, atol=atol, err_msg=f"O, seed={seed}")
    np.testing.assert_array_equal(lse == -np.inf, lse_want == -np.inf, err_msg=f"seed={seed}")
    finite = lse_want > -np.inf
    np.testing.assert_allclose(lse[finite], lse_want[finite], rtol=rtol, atol=atol,
                               err_msg=f"lse, seed={seed}")


# ---------------------------------------------------------------------------------------------
# Prefill against the loops
# ---------------------------------------------------------------------------------------------
# (lengths_q, lengths_k, Hq, Hkv): one sequence, GQA with Sq < Sk, MQA, Sq > Sk (causal rows
# without keys), and a varlen batch with empty query and key sequences and length-1 sequences.
LOOP_CASES = {
    "one": ([7], [7], 2, 2),
    "gqa-sq<sk": ([5], [9], 8, 2),
    "mqa": ([6], [6], 4, 1),
    "sq>sk": ([9], [4], 2, 1),
    "varlen": ([3, 0, 1, 6, 2, 1], [5, 4, 1, 2, 0, 3], 4, 2),
}


@pytest.mark.parametrize("case", list(LOOP_CASES))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", ref.ATTENTION_DTYPES)
def test_forward_matches_loops(case, causal, dtype, seed):
    rng = np.random.default_rng(seed)
    lengths_q, lengths_k, hq, hkv = LOOP_CASES[case]
    q, k, v = random_qkv(rng, sum(lengths_q), sum(lengths_k), hq, hkv, dtype)
    cu_q, cu_k = ref.attention_cu_seqlens(lengths_q), ref.attention_cu_seqlens(lengths_k)
    scale = rng.uniform(0.05, 0.3)
    got = ref.attention_forward_f64(q, k, v, cu_q, cu_k, scale, causal)
    scale32 = float(np.float32(scale))   # the kernels receive a float32
    want = brute_force_attention(q, k, v, lengths_q, lengths_k, scale32, causal, dtype)
    assert_same_attention(got, want, seed)
    o, lse = ref.attention_forward(q, k, v, cu_q, cu_k, scale, causal)
    assert o.dtype == q.dtype and lse.dtype == np.float32
    np.testing.assert_array_equal(o, ref.round_f64_to_dtype(got[0], dtype))
    np.testing.assert_array_equal(lse, got[1].astype(np.float32))


@pytest.mark.parametrize("dtype", ref.ATTENTION_DTYPES)
def test_large_logits_stay_finite(dtype, seed):
    """q and k of magnitude ~100: scale * q.k ~ 1e4, where exp overflows unless each row's
    maximum is subtracted. O and lse are finite and match the loops; the softmax is then nearly
    one-hot, so O is close to the v of the row's largest logit."""
    rng = np.random.default_rng(seed)
    lengths_q, lengths_k = [5, 8], [9, 8]
    q, k, v = random_qkv(rng, 13, 17, 4, 2, dtype, head_dim=128, magnitude=100)
    cu_q, cu_k = ref.attention_cu_seqlens(lengths_q), ref.attention_cu_seqlens(lengths_k)
    o, lse = ref.attention_forward_f64(q, k, v, cu_q, cu_k, causal=True)
    assert np.isfinite(o).all() and np.isfinite(lse).all(), f"seed={seed}"
    assert np.abs(lse).max() > 1e3, f"seed={seed}: the logits are not large"
    scale = float(np.float32(1 / math.sqrt(128)))
    want = brute_force_attention(q, k, v, lengths_q, lengths_k, scale, True, dtype)
    assert_same_attention((o, lse), want, seed)
    o16, lse32 = ref.attention_forward(q, k, v, cu_q, cu_k, causal=True)
    assert np.isfinite(as_f64(o16, dtype)).all() and np.isfinite(lse32).all()


@pytest.mark.parametrize("dtype", ref.ATTENTION_DTYPES)
def test_rows_without_keys(dtype, seed):
    """Causal with Sq > Sk: the first Sq - Sk queries see no key; with Sk = 0 no query does
    (causal or not). Their O is exactly 0 and their lse -inf, the others are finite."""
    rng = np.random.default_rng(seed)
    lengths_q, lengths_k = [6, 3, 4], [2, 0, 4]
    q, k, v = random_qkv(rng, 13, 6, 2, 1, dtype)
    cu_q, cu_k = ref.attention_cu_seqlens(lengths_q), ref.attention_cu_seqlens(lengths_k)
    for causal in (False, True):
        o, lse = ref.attention_forward(q, k, v, cu_q, cu_k, causal=causal)
        empty = np.zeros(13, bool)
        empty[6:9] = True                 # the sequence without keys
        if causal:
            empty[0:4] = True             # i < Sq - Sk = 4 in the first sequence
        assert (lse[empty] == -np.inf).all() and np.isfinite(lse[~empty]).all(), f"seed={seed}"
        assert not o[empty].any(), f"seed={seed}: O must be exactly 0 without keys"
        assert np.isfinite(as_f64(o, dtype)).all() and (o[~empty] != 0).any()
    o, lse = ref.attention_forward(q[:4], k[:0], v[:0], causal=True)   # one sequence, Sk = 0
    assert not o.any() and (lse == -np.inf).all()


# ---------------------------------------------------------------------------------------------
# Prefill properties
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("hkv", [1, 2, 4], ids=["mqa", "gqa", "mha"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gqa_is_repeated_kv_heads(hkv, causal, seed):
    """Hkv kv heads serving Hq = 8 query heads give the result of each kv head repeated
    Hq / Hkv times in a row (query head h reads kv head h // (Hq / Hkv))."""
    rng = np.random.default_rng(seed)
    lengths_q, lengths_k = [4, 11, 1], [9, 11, 6]
    q, k, v = random_qkv(rng, 16, 26, 8, hkv, "bf16", head_dim=96)
    cu_q, cu_k = ref.attention_cu_seqlens(lengths_q), ref.attention_cu_seqlens(lengths_k)
    got = ref.attention_forward_f64(q, k, v, cu_q, cu_k, causal=causal)
    k8, v8 = np.repeat(k, 8 // hkv, axis=1), np.repeat(v, 8 // hkv, axis=1)
    assert_same_attention(got, ref.attention_forward_f64(q, k8, v8, cu_q, cu_k, causal=causal),
                          seed)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_is_each_sequence_alone(causal, seed):
    rng = np.random.default_rng(seed)
    lengths_q, lengths_k = [5, 0, 17, 1, 9], [5, 3, 30, 1, 4]
    q, k, v = random_qkv(rng, sum(lengths_q), sum(lengths_k), 4, 2, "fp16")
    cu_q, cu_k = ref.attention_cu_seqlens(lengths_q), ref.attention_cu_seqlens(lengths_k)
    o, lse = ref.attention_forward_f64(q, k, v, cu_q, cu_k, causal=causal)
    for b in range(len(lengths_q)):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        alone = ref.attention_forward_f64(q[rows], k[keys], v[keys], causal=causal)
        assert_same_attention((o[rows], lse[rows]), alone, seed)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_equal_lengths_batch_is_uniform_varlen(causal, seed):
    rng = np.random.default_rng(seed)
    batch, sq, sk = 3, 7, 12
    q, k, v = random_qkv(rng, batch * sq, batch * sk, 4, 4, "bf16", head_dim=128)
    o, lse = ref.attention_forward_f64(q.reshape(batch, sq, 4, 128), k.reshape(batch, sk, 4, 128),
                                       v.reshape(batch, sk, 4, 128), causal=causal)
    assert o.shape == (batch, sq, 4, 128) and lse.shape == (batch, sq, 4)
    packed = ref.attention_forward_f64(q, k, v, ref.attention_cu_seqlens([sq] * batch),
                                       ref.attention_cu_seqlens([sk] * batch), causal=causal)
    assert_same_attention((o.reshape(-1, 4, 128), lse.reshape(-1, 4)), packed, seed)


def test_non_causal_is_invariant_to_key_order(seed):
    """Permuting the keys (with their values) within each sequence changes no output."""
    rng = np.random.default_rng(seed)
    lengths_q, lengths_k = [6, 4], [13, 20]
    q, k, v = random_qkv(rng, 10, 33, 4, 2, "fp16", magnitude=2)
    cu_q, cu_k = ref.attention_cu_seqlens(lengths_q), ref.attention_cu_seqlens(lengths_k)
    order = np.concatenate([cu_k[b] + rng.permutation(n) for b, n in enumerate(lengths_k)])
    assert_same_attention(ref.attention_forward_f64(q, k[order], v[order], cu_q, cu_k),
                          ref.attention_forward_f64(q, k, v, cu_q, cu_k), seed)


@pytest.mark.parametrize("dtype", ref.ATTENTION_DTYPES)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_scale_folds_into_q(dtype, causal, seed):
    """softmax_scale s with q equals scale 1 with s * q. s = c / 2**e (c odd, <= 31) and q
    integers in [-8, 8], so that s * q is exact in both dtypes: the float64 results agree to
    float64 rounding, for a scale that is no power of two."""
    rng = np.random.default_rng(seed)
    c, e = int(rng.choice(np.arange(1, 32, 2))), int(rng.integers(3, 9))
    s = c / 2.0**e
    q_int = rng.integers(-8, 9, (9, 4, HEAD_DIM)).astype(np.float32)
    q, scaled_q = ref.to_dtype(q_int, dtype), ref.to_dtype(q_int * np.float32(s), dtype)
    assert np.array_equal(as_f64(scaled_q, dtype), q_int * s), "s * q must be exact"
    _, k, v = random_qkv(rng, 0, 12, 4, 2, dtype)
    assert_same_attention(ref.attention_forward_f64(q, k, v, softmax_scale=s, causal=causal),
                          ref.attention_forward_f64(scaled_q, k, v, softmax_scale=1.0,
                                                    causal=causal), seed)


def test_scale_is_a_float32_and_defaults_to_inverse_sqrt_d(seed):
    rng = np.random.default_rng(seed)
    q, k, v = random_qkv(rng, 5, 8, 2, 2, "fp16", head_dim=96)
    default = ref.attention_forward_f64(q, k, v)
    explicit = ref.attention_forward_f64(q, k, v, softmax_scale=1 / math.sqrt(96))
    np.testing.assert_array_equal(default[0], explicit[0])
    scale32 = np.float32(0.1)
    nearby = np.nextafter(float(scale32), 1.0)   # rounds to the same float32
    np.testing.assert_array_equal(ref.attention_forward_f64(q, k, v, softmax_scale=nearby)[0],
                                  ref.attention_forward_f64(q, k, v, softmax_scale=scale32)[0])


# ---------------------------------------------------------------------------------------------
# Decode: paged and contiguous caches, and prefill
# ---------------------------------------------------------------------------------------------
def nan_like(shape, dtype):
    return ref.to_dtype(np.full(shape, np.nan, np.float32), dtype)


def random_cache(rng, seqlens, max_len, hkv, dtype, head_dim=HEAD_DIM):
    """Contiguous k_cache, v_cache [B, max_len, Hkv, D]: random up to seqlens[b], NaN past it
    (the references must never read there)."""
    batch = len(seqlens)
    caches = []
    for _ in range(2):
        cache = random_values(rng, (batch, max_len, hkv, head_dim), dtype)
        cache[np.arange(max_len)[None, :] >= np.asarray(seqlens)[:, None]] = \
            nan_like((hkv, head_dim), dtype)
        caches.append(cache)
    return caches


def page_caches(rng, caches, seqlens, page_size, spare_pages):
    """Contiguous caches [B, max_pages * page_size, Hkv, D] (K and V) written into pages
    [num_pages, page_size, Hkv, D] at shuffled places, one block_table for both: (pages of each
    cache, block_table int32). Pages no sequence uses (spare_pages more than B * max_pages, and
    those past each sequence's length) are NaN, and the block_table entries past a sequence's
    pages are garbage: -1, num_pages or 2**31 - 1."""
    batch, length = caches[0].shape[:2]
    max_pages = length // page_size
    num_pages = batch * max_pages + spare_pages
    table = rng.permutation(num_pages)[:batch * max_pages].reshape(batch, max_pages)
    all_pages = []
    for cache in caches:
        pages = nan_like((num_pages, page_size) + cache.shape[2:], ref.dtype_of(cache))
        for b, n in enumerate(seqlens):
            used = ref.block_count(n, page_size)
            pages[table[b, :used]] = cache[b, :used * page_size].reshape(
                (used, page_size) + cache.shape[2:])
        all_pages.append(pages)
    for b, n in enumerate(seqlens):
        used = ref.block_count(n, page_size)
        table[b, used:] = rng.choice([-1, num_pages, 2**31 - 1], size=max_pages - used)
    return all_pages, table.astype(np.int32)


def decode_problem(rng, seqlens, sq_new, page_size, dtype, hq=4, hkv=2, max_pages=5):
    """(q [B, Sq_new, Hq, D], k_cache, v_cache [B, max_pages * page_size, Hkv, D] (random_cache),
    seqlens_k int32 [B])."""
    max_len = max_pages * page_size
    q = random_values(rng, (len(seqlens), sq_new, hq, HEAD_DIM), dtype)
    k_cache, v_cache = random_cache(rng, seqlens, max_len, hkv, dtype)
    return q, k_cache, v_cache, np.array(seqlens, np.int32)


@pytest.mark.parametrize("page_size", [1, 5, 16])
@pytest.mark.parametrize("sq_new", [1, 3, 16])
@pytest.mark.parametrize("dtype", ref.ATTENTION_DTYPES)
def test_paged_is_contiguous(page_size, sq_new, dtype, seed):
    """The paged decode of a cache scattered over shuffled pages equals the contiguous decode,
    bit for bit, and is finite: NaN in unused pages, past seqlens_k in the last page, and in
    the contiguous cache past seqlens_k is never read; nor is the garbage in block_table past a
    sequence's pages. The gather gives the cache's values, 0 past seqlens_k."""
    rng = np.random.default_rng(seed)
    max_pages = max(5, ref.block_count(ref.ATTENTION_DECODE_MAX_QUERIES, page_size))
    max_len = max_pages * page_size
    seqlens = [max_len, 0, int(rng.integers(1, max_len)), max(sq_new - 1, 1),
               int(rng.integers(1, max_len))]
    q, k_cache, v_cache, lens = decode_problem(rng, seqlens, sq_new, page_size, dtype,
                                               max_pages=max_pages)
    (k_pages, v_pages), table = page_caches(rng, (k_cache, v_cache), seqlens, page_size,
                                            spare_pages=3)
    contiguous = ref.attention_decode(q, k_cache, v_cache, lens)
    paged = ref.attention_decode(q, k_pages, v_pages, lens, block_table=table)
    for got, want in zip(paged, contiguous):
        np.testing.assert_array_equal(got, want, err_msg=f"seed={seed}")
    assert np.isfinite(as_f64(paged[0], dtype)).all(), f"seed={seed}"
    assert (paged[1][1] == -np.inf).all(), "a sequence without keys"
    gathered = ref.attention_gather_paged_kv(k_pages, table, lens)
    kept = np.arange(max_len)[None, :] < lens[:, None]
    np.testing.assert_array_equal(gathered[kept], k_cache[kept])
    assert not gathered[~kept].any()


@pytest.mark.parametrize("sq_new", [1, 4, 16])
def test_decode_is_causal_prefill_on_the_cache(sq_new, seed):
    """Decode of sequence b equals prefill of its new queries against the cache's first
    seqlens_k[b] keys, causal (bottom-right: the queries are the last positions)."""
    rng = np.random.default_rng(seed)
    seqlens = [37, sq_new, 1, 64, 0]
    q, k_cache, v_cache, lens = decode_problem(rng, seqlens, sq_new, 16, "bf16", hq=8, hkv=2)
    o, lse = ref.attention_decode_f64(q, k_cache, v_cache, lens)
    assert o.shape == q.shape and lse.shape == q.shape[:3]
    for b, n in enumerate(seqlens):
        want = ref.attention_forward_f64(q[b], k_cache[b, :n], v_cache[b, :n], causal=True)
        assert_same_attention((o[b], lse[b]), want, seed)


# ---------------------------------------------------------------------------------------------
# Split-KV
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seqlen", [0, 1, 7, 64, 100])
@pytest.mark.parametrize("num_splits", [1, 3, 8, 200])
@pytest.mark.parametrize("block_n", [1, 16])
def test_split_bounds_cover_the_keys(seqlen, num_splits, block_n):
    bounds = ref.attention_split_bounds(seqlen, num_splits, block_n)
    assert bounds.shape == (num_splits + 1,) and bounds[0] == 0 and bounds[-1] == seqlen
    sizes = np.diff(bounds)
    per_split = ref.block_count(ref.block_count(seqlen, block_n), num_splits) * block_n
    used = ref.block_count(seqlen, max(per_split, 1))     # the non-empty splits come first
    assert (sizes[:max(used - 1, 0)] == per_split).all() and not sizes[used:].any()
    assert used == 0 or 0 < sizes[used - 1] <= per_split
    assert (bounds[:used] % block_n == 0).all(), "splits start on a key block"


@pytest.mark.parametrize("num_splits", [1, 2, 3, 7, 80])
@pytest.mark.parametrize("block_n", [1, 16])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_split_combine_is_unsplit(num_splits, block_n, paged, seed):
    """Each split's O_s and lse_s are the attention of each new query to the split's keys it
    sees (those before its position), alone; attention_combine of them is the unsplit decode,
    for splits that cut the causal new tokens, empty splits (80 > the keys) and sequences
    without keys."""
    rng = np.random.default_rng(seed)
    seqlens, sq_new = [70, 5, 0, 33, 2], 5
    q, k_cache, v_cache, lens = decode_problem(rng, seqlens, sq_new, 16, "fp16")
    k_in, v_in, table = k_cache, v_cache, None
    if paged:
        (k_in, v_in), table = page_caches(rng, (k_cache, v_cache), seqlens, 16, 2)
    o_s, lse_s = ref.attention_split_partials(q, k_in, v_in, lens, num_splits, table,
                                              block_n=block_n)
    assert o_s.shape == (num_splits,) + q.shape and lse_s.shape == (num_splits,) + q.shape[:3]
    want = ref.attention_decode_f64(q, k_in, v_in, lens, table)
    assert_same_attention(ref.attention_combine(o_s, lse_s), want, seed)
    for b, n in enumerate(seqlens):
        bounds = ref.attention_split_bounds(n, num_splits, block_n)
        for s, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
            for t in range(sq_new):
                end = min(hi, n - sq_new + t + 1)   # past the query's position: not seen
                if end <= lo:
                    assert lse_s[s, b, t].max() == -np.inf and not o_s[s, b, t].any()
                    continue
                keys = slice(lo, end)
                alone = ref.attention_forward_f64(q[b, t:t + 1], k_cache[b, keys],
                                                  v_cache[b, keys])
                assert_same_attention((o_s[s, b, t:t + 1], lse_s[s, b, t:t + 1]), alone, seed)


def test_combine_leaves_out_splits_without_keys(seed):
    """Where lse_s = -inf, O_s is not read (a kernel need not write it): NaN there changes
    nothing, and where every split is -inf the result is O = 0, lse = -inf."""
    rng = np.random.default_rng(seed)
    o_s = rng.standard_normal((4, 6, 3, 64))
    lse_s = rng.standard_normal((4, 6, 3)) * 5
    lse_s[1] = -np.inf
    lse_s[:, 2, 1] = -np.inf
    o_nan = o_s.copy()
    o_nan[lse_s == -np.inf] = np.nan
    o, lse = ref.attention_combine(o_nan, lse_s)
    assert_same_attention((o, lse), ref.attention_combine(o_s, lse_s), seed, rtol=0, atol=0)
    assert not o[2, 1].any() and lse[2, 1] == -np.inf
    assert np.isfinite(o).all()


# ---------------------------------------------------------------------------------------------
# Work and traffic
# ---------------------------------------------------------------------------------------------
def test_allowed_pairs_count_the_mask(seed):
    rng = np.random.default_rng(seed)
    shapes = [(0, 0), (0, 5), (5, 0), (1, 1), (7, 7), (3, 9), (9, 3)]
    shapes += [tuple(int(n) for n in rng.integers(1, 70, 2)) for _ in range(20)]
    for sq, sk in shapes:
        loops = sum(1 for i in range(sq) for j in range(sk) if j <= i + sk - sq)
        assert ref.attention_allowed_pairs(sq, sk, True) == loops, (sq, sk)
        assert ref.attention_mask(sq, sk, True).sum() == loops, (sq, sk)
        assert ref.attention_allowed_pairs(sq, sk, False) == sq * sk
        assert ref.attention_mask(sq, sk, False).sum() == sq * sk


def test_flops(seed):
    rng = np.random.default_rng(seed)
    lengths_q, lengths_k = rng.integers(0, 300, 6), rng.integers(0, 300, 6)
    causal_pairs = sum(ref.attention_mask(sq, sk, True).sum() for sq, sk in zip(lengths_q,
                                                                                lengths_k))
    assert ref.attention_flops(lengths_q, lengths_k, 32, 128, True) == 4 * 32 * 128 * causal_pairs
    assert ref.attention_flops([4096] * 3, [4096] * 3, 32, 128, False) == 4 * 3 * 32 * 4096**2 * 128
    # Causal with Sq = Sk = S: S (S + 1) / 2 pairs, a little over half.
    assert ref.attention_flops([8192], [8192], 16, 64, True) == 4 * 16 * 64 * 8192 * 8193 // 2


def test_decode_kv_bytes():
    seqlens = np.array([1000, 0, 17], np.int32)
    assert ref.attention_decode_kv_bytes(seqlens, 8, 128, "bf16") == 1017 * 8 * 128 * 2 * 2
    assert ref.attention_decode_kv_bytes(seqlens, 8, 128, "fp32") == 1017 * 8 * 128 * 2 * 4


# ---------------------------------------------------------------------------------------------
# The error bound against an emulated kernel
# ---------------------------------------------------------------------------------------------
def exp_f32(x):
    """float32 exp, correctly rounded (exp(-inf) = 0)."""
    return np.exp(x.astype(np.float64)).astype(np.float32)


def emulate_split(q, k, v, first_key, diagonal, scale, dtype, block_n):
    """One split of a FlashAttention-2 forward in float32: q [H, Sq, D], k and v [H, Sk, D]
    (float32 values, the kv head of each query head already picked), keys at positions
    first_key + j; query i sees position p iff p - i <= diagonal (None: all). Per block of
    block_n keys: s = q k^T and P V as float32 matrix products, x = s * scale, the running max m,
    p = exp(x - m), l and the accumulator rescaled by exp(m_old - m_new), l summed from the
    float32 p and P rounded to the dtype before P V. Returns the normalized O [H, Sq, D] and lse
    [H, Sq] (float32; 0 and -inf for a query that sees no key)."""
    heads, sq, d = q.shape
    m = np.full((heads, sq), -np.inf, np.float32)
    l = np.zeros((heads, sq), np.float32)
    acc = np.zeros((heads, sq, d), np.float32)
    for start in range(0, k.shape[1], block_n):
        kb, vb = k[:, start:start + block_n], v[:, start:start + block_n]
        x = np.matmul(q, kb.transpose(0, 2, 1)) * np.float32(scale)
        if diagonal is not None:
            position = first_key + start + np.arange(kb.shape[1])
            x = np.where(position[None, :] - np.arange(sq)[:, None] <= diagonal, x,
                         np.float32(-np.inf))
        m_new = np.maximum(m, x.max(axis=2))
        m_used = np.where(m_new == -np.inf, np.float32(0), m_new)   # a row still without keys
        alpha = exp_f32(m - m_used)
        p = exp_f32(x - m_used[..., None])
        l = alpha * l + p.sum(axis=2, dtype=np.float32)
        p_low = ref.to_f32(ref.to_dtype(p, dtype), dtype)
        acc = alpha[..., None] * acc + np.matmul(p_low, vb)
        m = m_new
    seen = l > 0
    o = np.where(seen[..., None], acc / np.where(seen, l, 1)[..., None], np.float32(0))
    lse = np.where(seen, m + np.log(np.where(seen, l, 1).astype(np.float64)).astype(np.float32),
                   np.float32(-np.inf))
    return o.astype(np.float32), lse.astype(np.float32)


def emulate_kernel(q, k, v, cu_q, cu_k, causal, dtype, block_n=64, num_splits=1, fault=None):
    """A float32 FlashAttention-2 kernel on packed q [total_q, Hq, D], k, v [total_k, Hkv, D]:
    per sequence the keys are cut as attention_split_bounds(Sk, num_splits, block_n) cuts them,
    each split runs emulate_split, and the float32 partials are combined in float32 (for one
    split that is O and lse unchanged); O is rounded to the dtype. fault: None, 'mask' (the
    causal diagonal one key too far) or 'gqa' (query head h reads kv head h % Hkv). Returns
    (O in dtype's representation, lse float32)."""
    hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
    heads = np.arange(hq) % hkv if fault == "gqa" else np.arange(hq) // (hq // hkv)
    scale = np.float32(1 / math.sqrt(d))
    qf, kf, vf = (ref.to_f32(a, dtype) for a in (q, k, v))
    o = np.zeros(qf.shape, np.float32)
    lse = np.full(qf.shape[:2], -np.inf, np.float32)
    for b in range(len(cu_q) - 1):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        sq, sk = rows.stop - rows.start, keys.stop - keys.start
        diagonal = sk - sq + (fault == "mask") if causal else None
        qh = qf[rows].transpose(1, 0, 2)
        kh, vh = (a[keys][:, heads].transpose(1, 0, 2) for a in (kf, vf))
        bounds = ref.attention_split_bounds(sk, num_splits, block_n)
        parts = [emulate_split(qh, kh[:, lo:hi], vh[:, lo:hi], lo, diagonal, scale, dtype, block_n)
                 for lo, hi in zip(bounds[:-1], bounds[1:])]
        o_s, lse_s = np.stack([p[0] for p in parts]), np.stack([p[1] for p in parts])
        top = lse_s.max(axis=0)
        w = exp_f32(lse_s - np.where(top == -np.inf, np.float32(0), top))
        total = np.zeros(top.shape, np.float32)
        combined = np.zeros(o_s.shape[1:], np.float32)
        for s in range(num_splits):   # the combine's float32 sums, split by split
            total = total + w[s]
            combined = combined + w[s][..., None] * o_s[s]
        seen = total > 0
        o[rows] = np.where(seen[..., None], combined / np.where(seen, total, 1)[..., None],
                           np.float32(0)).transpose(1, 0, 2)
        lse[rows] = np.where(seen, top + np.log(np.where(seen, total, 1).astype(np.float64))
                             .astype(np.float32), np.float32(-np.inf)).T
    return ref.to_dtype(o, dtype), lse


def bound_check(q, k, v, cu_q, cu_k, causal, dtype, kernel_out, block_n, num_splits):
    """(O error / o_tol, lse error / lse_tol), their largest values, for a kernel's outputs
    against the float64 reference and attention_error_bound; a query without keys must have
    O = 0 and lse = -inf exactly (its tolerances are 0)."""
    o_ref, lse_ref = ref.attention_forward_f64(q, k, v, cu_q, cu_k, causal=causal)
    o_tol, lse_tol = ref.attention_error_bound(q, k, v, cu_q, cu_k, causal=causal,
                                               block_n=block_n, num_splits=num_splits)
    o, lse = kernel_out
    o_err = np.abs(as_f64(o, dtype) - o_ref)
    empty = lse_ref == -np.inf
    lse_err = np.where(empty, np.where(lse == -np.inf, 0, np.inf),
                       np.abs(lse.astype(np.float64) - np.where(empty, 0, lse_ref)))
    with np.errstate(divide="ignore", invalid="ignore"):
        o_ratio = np.where(o_err == 0, 0, o_err / o_tol)
        lse_ratio = np.where(lse_err == 0, 0, lse_err / lse_tol)
    return np.nan_to_num(o_ratio, nan=np.inf).max(), np.nan_to_num(lse_ratio, nan=np.inf).max()


# Lengths of the emulated-kernel tests: a sequence of one, Sq < Sk over several key blocks,
# Sq = Sk past two blocks of 64, Sq > Sk (causal rows without keys) and no queries.
BOUND_LENGTHS_Q = [1, 47, 130, 20, 0]
BOUND_LENGTHS_K = [1, 200, 130, 9, 5]
MAGNITUDES = {"flat": 1.0, "peaked": 3.0, "large": 100.0}   # logits spread ~1, ~9, ~1e4
KERNELS = [(64, 1), (128, 1), (64, 4)]                      # (block_n, num_splits)


@pytest.mark.parametrize("kernel", KERNELS, ids=[f"n{n}-s{s}" for n, s in KERNELS])
@pytest.mark.parametrize("magnitude", list(MAGNITUDES))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", ref.ATTENTION_DTYPES)
def test_emulated_kernel_is_within_the_bound(kernel, magnitude, causal, dtype, seed):
    rng = np.random.default_rng(seed)
    block_n, num_splits = kernel
    head_dim = int(rng.choice(ref.ATTENTION_HEAD_DIMS))
    q, k, v = random_qkv(rng, sum(BOUND_LENGTHS_Q), sum(BOUND_LENGTHS_K), 4, 2, dtype, head_dim,
                         MAGNITUDES[magnitude])
    cu_q = ref.attention_cu_seqlens(BOUND_LENGTHS_Q)
    cu_k = ref.attention_cu_seqlens(BOUND_LENGTHS_K)
    out = emulate_kernel(q, k, v, cu_q, cu_k, causal, dtype, block_n, num_splits)
    o_ratio, lse_ratio = bound_check(q, k, v, cu_q, cu_k, causal, dtype, out, block_n, num_splits)
    assert o_ratio <= 1 and lse_ratio <= 1, (f"seed={seed}, D={head_dim}: error / bound "
                                             f"{o_ratio:.3g} (O), {lse_ratio:.3g} (lse)")


@pytest.mark.parametrize("sq_new, num_splits", [(1, 1), (1, 5), (16, 3)])
def test_emulated_split_decode_is_within_the_bound(sq_new, num_splits, seed):
    """The split-KV decode of a paged cache, emulated on the prefill form of the call."""
    rng = np.random.default_rng(seed)
    seqlens = [300, 1, 0, sq_new + 70, 129]
    q, k_cache, v_cache, lens = decode_problem(rng, seqlens, sq_new, 16, "fp16", hq=8, hkv=2,
                                               max_pages=19)
    (k_pages, v_pages), table = page_caches(rng, (k_cache, v_cache), seqlens, 16, 4)
    qp, kp, vp, cu_q, cu_k = ref.attention_decode_as_prefill(q, k_pages, v_pages, lens, table)
    out = emulate_kernel(qp, kp, vp, cu_q, cu_k, True, "fp16", 64, num_splits)
    o_ratio, lse_ratio = bound_check(qp, kp, vp, cu_q, cu_k, True, "fp16", out, 64, num_splits)
    assert o_ratio <= 1 and lse_ratio <= 1, f"seed={seed}: {o_ratio:.3g}, {lse_ratio:.3g}"


@pytest.mark.parametrize("fault", ["mask", "gqa"])
@pytest.mark.parametrize("magnitude", ["flat", "peaked"])
@pytest.mark.parametrize("dtype", ref.ATTENTION_DTYPES)
def test_wrong_kernel_breaks_the_bound(fault, magnitude, dtype, seed):
    """The bound is tight enough to catch a kernel whose causal diagonal is one key off, or
    that maps query head h to kv head h % Hkv instead of h // (Hq / Hkv): on rows that do see
    keys (Sq <= Sk here), so that it is the bound, not the exact 0 / -inf of a row without
    keys, that the faulty kernel violates."""
    rng = np.random.default_rng(seed)
    lengths_q, lengths_k = [1, 47, 130], [1, 200, 130]
    q, k, v = random_qkv(rng, sum(lengths_q), sum(lengths_k), 4, 2, dtype, 128,
                         MAGNITUDES[magnitude])
    cu_q, cu_k = ref.attention_cu_seqlens(lengths_q), ref.attention_cu_seqlens(lengths_k)
    out = emulate_kernel(q, k, v, cu_q, cu_k, True, dtype, fault=fault)
    assert np.isfinite(out[1]).all()
    o_ratio, _ = bound_check(q, k, v, cu_q, cu_k, True, dtype, out, 64, 1)
    assert o_ratio > 10, f"seed={seed}: the faulty kernel's error is {o_ratio:.3g} x the bound"


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------
def validation_cases(rng):
    """{case: (a call that must raise ValueError, what its message says)} on valid inputs
    changed in one way each."""
    q, k, v = random_qkv(rng, 10, 12, 4, 2, "fp16")
    cu_q, cu_k = ref.attention_cu_seqlens([4, 6]), ref.attention_cu_seqlens([5, 7])
    fwd, dec = ref.attention_forward, ref.attention_decode
    q4 = q.reshape(2, 5, 4, HEAD_DIM)
    lengths = [20, 3]
    qd, kc, vc, lens = decode_problem(rng, lengths, 2, 16, "fp16", max_pages=2)   # max_len 32
    (kp, vp), table = page_caches(rng, (kc, vc), lengths, 16, 1)                  # 5 pages

    def i32(values):
        return np.array(values, np.int32)

    def with_entry(b, p, value):
        bad = table.copy()
        bad[b, p] = value
        return bad

    return {
        "head-dim": (lambda: fwd(*random_qkv(rng, 3, 3, 2, 2, "fp16", head_dim=80)),
                     "head dim D=80 is not one of"),
        "head-dim-k": (lambda: fwd(q, *random_qkv(rng, 0, 12, 2, 2, "fp16", head_dim=128)[1:]),
                       "differs"),
        "heads": (lambda: fwd(*random_qkv(rng, 3, 3, 6, 4, "bf16")), "multiple of Hkv=4"),
        "k-v-shapes": (lambda: fwd(q, k, v[:11]), "same shape"),
        "q-rank": (lambda: fwd(q[0], k, v), "q must be"),
        "mixed-rank": (lambda: fwd(q4, k, v), "q must be"),
        "batch": (lambda: fwd(q4, k.reshape(3, 4, 2, HEAD_DIM), v.reshape(3, 4, 2, HEAD_DIM)),
                  "B=2 sequences"),
        "4-d-with-offsets": (lambda: fwd(q4, k.reshape(2, 6, 2, HEAD_DIM),
                                         v.reshape(2, 6, 2, HEAD_DIM), cu_q, cu_k),
                             "takes no cu_seqlens"),
        "one-offsets": (lambda: fwd(q, k, v, cu_q, None), "both"),
        "offsets-start": (lambda: fwd(q, k, v, i32([1, 4, 10]), cu_k), "start at 0"),
        "offsets-decrease": (lambda: fwd(q, k, v, cu_q, i32([0, 8, 5, 12])),
                             r"non-decreasing: cu_seqlens_k\[1\] = 8"),
        "offsets-end": (lambda: fwd(q, k, v, i32([0, 4, 9]), cu_k), "end at the token count 10"),
        "offsets-batch": (lambda: fwd(q, k, v, cu_q, i32([0, 5, 7, 12])),
                          "cu_seqlens_q has 2 sequences, cu_seqlens_k 3"),
        "offsets-rank": (lambda: fwd(q, k, v, cu_q.reshape(1, 3), cu_k), r"\[B \+ 1\]"),
        "dtype": (lambda: fwd(*(ref.to_f32(a, "fp16") for a in (q, k, v))), "attention runs on"),
        "scale": (lambda: fwd(q, k, v, softmax_scale=np.nan), "softmax_scale"),
        "lengths": (lambda: ref.attention_cu_seqlens([3, -1]), ">= 0"),
        "decode-rank": (lambda: dec(q, kc, vc, lens), "decode takes q"),
        "decode-queries": (lambda: dec(random_values(rng, (2, 17, 4, HEAD_DIM), "fp16"), kc, vc,
                                       lens), "Sq_new = 1 .. 16"),
        "decode-heads": (lambda: dec(qd[:, :, :3], kc, vc, lens), "multiple of Hkv=2"),
        "seqlens-past-max-len": (lambda: dec(qd, kc, vc, i32([33, 3])),
                                 r"seqlens_k\[0\] = 33 is outside \[0, max_len = 32\]"),
        "seqlens-negative": (lambda: dec(qd, kc, vc, i32([20, -1])), r"seqlens_k\[1\] = -1"),
        "seqlens-shape": (lambda: dec(qd, kc, vc, i32([20])), r"int32 \[B=2\]"),
        "cache-batch": (lambda: dec(qd, kc[:1], vc[:1], lens),
                        "q has B = 2 sequences, the cache 1"),
        "block-table-past-pages": (lambda: dec(qd, kp, vp, lens, with_entry(0, 1, 5)),
                                   r"block_table\[0, 1\] = 5 .* outside \[0, num_pages=5\)"),
        "block-table-negative": (lambda: dec(qd, kp, vp, lens, with_entry(1, 0, -1)),
                                 r"block_table\[1, 0\] = -1"),
        "paged-seqlens": (lambda: dec(qd, kp, vp, i32([33, 3]), table),
                          "max_pages_per_seq"),
        "block-table-batch": (lambda: dec(qd, kp, vp, lens[:1], table[:1]),
                              "q has B = 2 sequences, block_table 1"),
        "num-splits": (lambda: ref.attention_split_partials(qd, kc, vc, lens, 0), "num_splits=0"),
        "split-block": (lambda: ref.attention_split_bounds(10, 2, 0), "block_n=0"),
        "combine-shapes": (lambda: ref.attention_combine(np.ones((2, 3, 64)), np.ones((2, 4))),
                           "partials_o"),
        "combine-no-split": (lambda: ref.attention_combine(np.ones((0, 3, 64)), np.ones((0, 3))),
                             "num_splits >= 1"),
        "pairs-negative": (lambda: ref.attention_allowed_pairs(3, -1, True), ">= 0"),
        "flops-lengths": (lambda: ref.attention_flops([3, 4], [3], 8, 64, True),
                          "seqlens_q has 2 lengths, seqlens_k 1"),
        "bound-block": (lambda: ref.attention_error_bound(q, k, v, block_n=0), "block_n=0"),
        "bound-dtype": (lambda: ref.attention_error_bound(q, k, v, dtype="fp32"),
                        "attention runs on"),
    }


VALIDATION_CASES = list(validation_cases(np.random.default_rng(0)))


@pytest.mark.parametrize("case", VALIDATION_CASES)
def test_rejects_bad_arguments(case, seed):
    call, message = validation_cases(np.random.default_rng(seed))[case]
    with pytest.raises(ValueError, match=message):
        call()


def test_offsets_and_lengths_must_be_int32(seed):
    rng = np.random.default_rng(seed)
    q, k, v = random_qkv(rng, 4, 5, 2, 2, "bf16")
    with pytest.raises(TypeError, match="int32"):
        ref.attention_forward(q, k, v, np.array([0, 4]), ref.attention_cu_seqlens([5]))
    qd, kc, vc, lens = decode_problem(rng, [3], 1, 16, "bf16", hq=2)
    with pytest.raises(TypeError, match="int32"):
        ref.attention_decode(qd, kc, vc, lens.astype(np.int64))
    with pytest.raises(TypeError, match="int32"):
        ref.attention_decode(qd, kc, vc, lens, block_table=np.zeros((1, 5), np.int64))


# ---------------------------------------------------------------------------------------------
# Quantized KV cache
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ref.KV_FORMATS)
@pytest.mark.parametrize("dtype", ref.ATTENTION_DTYPES)
def test_kv_cache_quantize_is_the_row_quantizer(fmt, dtype, seed):
    """Per token: quantize_fp8 / quantize_int8 of the rows [.., D] with dynamic row scales; per
    head: the same with each head's scale given. The values are within half a step."""
    rng = np.random.default_rng(seed)
    x = random_values(rng, (3, 5, 4, HEAD_DIM), dtype, 4.0)
    rows = x.reshape(-1, HEAD_DIM)

    def row_quantizer(scales):
        if fmt == "int8":
            return ref.quantize_int8(rows, dtype, "row", scales)
        return ref.quantize_fp8(rows, dtype, "e4m3", "row", scales)

    codes, scales = ref.kv_cache_quantize(x, dtype, fmt)
    want_codes, want_scales = row_quantizer(None)
    assert np.array_equal(codes.reshape(rows.shape), want_codes), f"seed={seed}"
    assert np.array_equal(scales.reshape(-1), want_scales) and scales.shape == x.shape[:-1]
    head = (rng.uniform(0.5, 2.0, 4) / 100).astype(np.float32)
    codes, scales = ref.kv_cache_quantize(x, dtype, fmt, head)
    assert scales is head
    want_codes, _ = row_quantizer(np.broadcast_to(head, x.shape[:-1]).reshape(-1).copy())
    assert np.array_equal(codes.reshape(rows.shape), want_codes), f"seed={seed}"

    codes, scales = ref.kv_cache_quantize(x, dtype, fmt)
    values = ref.kv_cache_dequantize(codes, scales, fmt)
    exact = as_f64(x, dtype)
    step = scales[..., None].astype(np.float64) * (1 if fmt == "int8" else 2.0**-9)
    if fmt == "fp8_e4m3":   # E4M3: 3 mantissa bits; subnormal steps of 2^-9 x scale
        step = np.maximum(step, np.abs(exact) * 2.0**-3)
    # (A tie rounds to even: half a step; x * inv in float32 may land on a tie: a little more.)
    assert (np.abs(values - exact) <= step / 2 * (1 + 2.0**-14)).all(), f"seed={seed}"


def test_kv_cache_append_writes_only_the_mapped_slots(seed):
    rng = np.random.default_rng(seed)
    k, v = (random_values(rng, (6, 2, HEAD_DIM), "fp16") for _ in range(2))
    slots = np.array([3, -1, 0, 9, 7, 10], np.int64)   # -1 and 10 (= num_slots): skipped
    cache = np.full((10, 2, HEAD_DIM), np.nan, np.float16)
    k_cache, v_cache, _, _ = ref.kv_cache_append(k, v, slots, cache, cache, "fp16")
    assert np.isnan(cache).all(), "the inputs stay as they were"
    for token, slot in enumerate(slots):
        if 0 <= slot < 10:
            assert np.array_equal(k_cache[slot], k[token]) and np.array_equal(v_cache[slot],
                                                                              v[token])
    untouched = np.setdiff1d(np.arange(10), slots)
    assert np.isnan(k_cache[untouched]).all() and np.isnan(v_cache[untouched]).all()
    codes = np.zeros((10, 2, HEAD_DIM), np.uint8)
    scales = np.full((10, 2), -1.0, np.float32)
    k_codes, _, k_scale, _ = ref.kv_cache_append(k, v, slots, codes, codes, "fp16", "fp8_e4m3",
                                                 scales, scales, per_token=True)
    want_codes, want_scales = ref.kv_cache_quantize(k, "fp16", "fp8_e4m3")
    kept = (slots >= 0) & (slots < 10)
    assert np.array_equal(k_codes[slots[kept]], want_codes[kept])
    assert np.array_equal(k_scale[slots[kept]], want_scales[kept])
    assert (k_scale[untouched] == -1).all() and (k_codes[untouched] == 0).all()


def test_decode_kv_bytes_of_a_quantized_cache():
    seqlens = np.array([1000, 0, 17], np.int32)
    assert ref.attention_decode_kv_bytes(seqlens, 8, 128, "fp16", "fp8_e4m3") == \
        1017 * 8 * 128 * 2
    assert ref.attention_decode_kv_bytes(seqlens, 8, 128, "bf16", "int8", per_token=True) == \
        1017 * 8 * (128 + 4) * 2


def emulate_quantized_split(q, k_codes, v_codes, k_scale, v_scale, scale, dtype, block_n):
    """A quantized-cache decode kernel in float32, one sequence, every key seen: q [H, Sq, D],
    the codes' values [H, Sk, D] and the keys' and values' scales [H, Sk] (float32). Per block:
    s = (q codes_k^T) times the keys' scales, x = s * scale; the online softmax of
    emulate_split; P' = fl_d(p * the values' scales) and acc += P' codes_v. -> O [H, Sq, D]."""
    heads, sq, d = q.shape
    m = np.full((heads, sq), -np.inf, np.float32)
    l = np.zeros((heads, sq), np.float32)
    acc = np.zeros((heads, sq, d), np.float32)
    for start in range(0, k_codes.shape[1], block_n):
        keys = slice(start, start + block_n)
        s = np.matmul(q, k_codes[:, keys].transpose(0, 2, 1)) * k_scale[:, None, keys]
        x = s * np.float32(scale)
        m_new = np.maximum(m, x.max(axis=2))
        alpha = exp_f32(m - m_new)
        p = exp_f32(x - m_new[..., None])
        l = alpha * l + p.sum(axis=2, dtype=np.float32)
        p_low = ref.to_f32(ref.to_dtype(p * v_scale[:, None, keys], dtype), dtype)
        acc = alpha[..., None] * acc + np.matmul(p_low, v_codes[:, keys])
        m = m_new
    return acc / l[..., None]


@pytest.mark.parametrize("fmt", ref.KV_FORMATS)
@pytest.mark.parametrize("per_token", [False, True], ids=["head", "token"])
@pytest.mark.parametrize("dtype", ref.ATTENTION_DTYPES)
def test_emulated_quantized_cache_is_within_the_bound(fmt, per_token, dtype, seed):
    """The bound with v_scales holds for the kernel's arithmetic on a quantized cache (scales
    of N(0, 1) rows, some of whose p * scale fall below fp16's normal range), and fails when
    per-token value scales are applied to the wrong keys."""
    rng = np.random.default_rng(seed)
    heads, sq, sk = 2, 3, 300
    q = random_values(rng, (sq, heads, HEAD_DIM), dtype, 2.0)
    x_k, x_v = (random_values(rng, (sk, heads, HEAD_DIM), dtype) for _ in range(2))
    head = None if per_token else (rng.uniform(0.5, 1.5, heads) * 4 / 448).astype(np.float32)
    (kc, ks), (vc, vs) = (ref.kv_cache_quantize(a, dtype, fmt, head) for a in (x_k, x_v))
    k_vals, v_vals = (ref.kv_cache_dequantize(c, s_, fmt) for c, s_ in ((kc, ks), (vc, vs)))
    ks, vs = (np.broadcast_to(s_, (sk, heads)) for s_ in (ks, vs))
    codes = {name: (ref.kv_cache_dequantize(c, np.ones(heads, np.float32), fmt)
                    .astype(np.float32).transpose(1, 0, 2)) for name, c in (("k", kc), ("v", vc))}
    qh = ref.to_f32(q, dtype).transpose(1, 0, 2)
    scale = np.float32(1 / math.sqrt(HEAD_DIM))
    cu_q, cu_k = ref.attention_cu_seqlens([sq]), ref.attention_cu_seqlens([sk])
    o_ref, _ = ref.attention_forward_f64(q, k_vals, v_vals, cu_q, cu_k, dtype=dtype)
    o_tol, _ = ref.attention_error_bound(q, k_vals, v_vals, cu_q, cu_k, dtype=dtype,
                                         block_n=16, v_scales=vs)
    for shift, must_hold in ((0, True), (1, False)) if per_token else ((0, True),):
        o = emulate_quantized_split(qh, codes["k"], codes["v"], ks.T.astype(np.float32),
                                    np.roll(vs, shift, axis=0).T.astype(np.float32), scale,
                                    dtype, 16)
        got = as_f64(ref.to_dtype(o.transpose(1, 0, 2), dtype), dtype)
        within = (np.abs(got - o_ref) <= o_tol).all()
        assert within == must_hold, (f"seed={seed}, value scales shifted by {shift}: max error"
                                     f" / bound {(np.abs(got - o_ref) / o_tol).max():.3g}")
