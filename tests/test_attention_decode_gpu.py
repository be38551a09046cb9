"""GPU tests of decode attention over a KV cache (ck_attention_decode) against tests/reference.py.

- O within ref.attention_error_bound of the float64 reference ref.attention_decode_f64 (checked
  on ref.attention_decode_as_prefill's arrays, causal, block_n = 16: the smallest key slice a
  warp rescales over, num_splits the call's plan), element by element, and lse within its
  bound; a token that sees no key has O = 0 and lse = -inf exactly.
- With several splits, the float32 partials in the workspace: lse_s = -inf exactly where the
  reference's split (ref.attention_split_partials, 64-key blocks) sees no key, finite elsewhere;
  and O, lse equal to the float64 combine of those partials (ref.attention_combine) up to the
  combine's own float32 roundings.
- Shapes: contiguous and paged caches (shuffled page ids, pages of 16, 64 and 256 keys), fp16
  and bf16, D 64 and 128, GQA ratios 1, 4 and 8 (and MQA), 1, 4 and 16 new tokens, lengths of 0
  and 1, below the new token count, around the 64-key tile, one sequence much longer than the
  others, a 32k+ cache; large logits; default, small and negative scales; the automatic and
  forced split counts (1 .. 64, empty splits included).
- The cache holds NaN past every sequence's length, the unused pages are NaN and the block
  table entries past a sequence's pages are garbage: none of it may be read.
- Paged and contiguous caches of the same keys give the same bits for the same split plan.
- Broken device-side promises: lengths past max_seqlen_k (and negative) are clamped (the values
  are then those of the clamped lengths), page ids out of range stay in bounds (guards intact).
- A workspace below the query's size is rejected and writes nothing; lse NULL writes the same
  O; a CUDA graph replays on fresh inputs; the wrapper's attention_decode() gives the raw bits.
- Two streams run calls at once; two calls back to back through one workspace keep their own
  results (the split kernel waits for the previous combine before it writes).

Every output and the workspace are poisoned and sit between guard regions. The tests skip
without a CUDA device. Each test draws a seed from os.urandom, prints it and names it in its
messages; CK_TEST_SEED=<seed> replays it.
"""
import numpy as np
import pytest

import cuda_wrapper as ck
import reference as ref
from fuzz_support import decode_num_splits
from gpu_support import (
    CK_DTYPE, GuardedBuffer, KernelCall, POISON, assert_bitwise_equal, assert_graph_replays,
    assert_within, compute_capability, launch_on_streams, random_normal, synchronize, to_host,
    write_buffers,
)

pytestmark = pytest.mark.gpu

# The bound allows one online-softmax rescaling per block of keys: a warp rescales per slice of
# a 64-key tile, 16 keys when 4 warps share one tile (one m16 row tile), plus the merge.
KERNEL_RESCALE_BLOCK = 16
# The splits deal whole 64-key blocks (cuda_kernels.h; ref.attention_split_bounds).
SPLIT_BLOCK = 64
STORAGE = {"fp16": np.float16, "bf16": np.uint16}
BF16_NAN = np.uint16(0x7FC0)
F32_U = 2.0**-24


@pytest.fixture(autouse=True)
def sm80():
    cc = compute_capability()
    if cc < (8, 0):
        pytest.skip(f"ck_attention_decode needs compute capability 8.0+ (this GPU: {cc})")


# What a cache holds past the sequences and in unused pages: NaN values (fp16, bf16 bits), NaN
# E4M3 codes, int8 codes outside [-127, 127], NaN scales: an array of `shape` in a's dtype.
def nan_like(a, shape):
    if a.dtype == np.uint8:
        return np.full(shape, 0x7F, np.uint8)
    if a.dtype == np.int8:
        return np.full(shape, -128, np.int8)
    if a.dtype == np.uint16:
        return np.full(shape, BF16_NAN, np.uint16)
    return np.full(shape, np.nan, a.dtype)


KV_FORMATS = {None: ck.KV_DTYPE, "fp8_e4m3": ck.KV_FP8_E4M3, "int8": ck.KV_INT8}
KV_FMAX = {"fp8_e4m3": 448.0, "int8": 127.0}


class DecodeCall(KernelCall):
    """One ck_attention_decode call on guarded buffers.

    lengths: the sequences' key counts (seqlens_k); capacity: max_seqlen_k (default the longest
    length); page_size: None for a contiguous cache [B, capacity, Hkv, D], else pages in
    shuffled order with a block table of ceil(capacity / page_size) entries per sequence.
    device_lengths: what seqlens_k holds on the device, if not `lengths` (broken promises: the
    reference then uses the clamped lengths). num_splits: None for the library's rule.
    kv_format: None (the cache holds the dtype's values), 'fp8_e4m3' or 'int8': the cache holds
    ref.kv_cache_quantize's codes of the drawn values, with per-token scales (per_token) or
    per-head scales drawn around the heads' amax / FMAX (some values saturate); the reference
    runs on the codes' values (ref.kv_cache_dequantize)."""

    def __init__(self, rng, dtype, head_dim, heads_q, heads_kv, seqlen_q, lengths,
                 page_size=None, capacity=None, num_splits=None, scale=None, lse=True,
                 logit_scale=1.0, device_lengths=None, kv_format=None, per_token=False):
        self.dtype, self.scale, self.logit_scale = dtype, scale, logit_scale
        self.page_size, self.num_splits = page_size, num_splits
        self.kv_format, self.per_token = kv_format, bool(kv_format and per_token)
        self.lengths = np.asarray(lengths, np.int32)
        batch = len(lengths)
        self.capacity = int(capacity or max(int(self.lengths.max()), 1))
        self.clamped = np.clip(self.lengths if device_lengths is None else device_lengths, 0,
                               self.capacity).astype(np.int32)
        self.shape_q = (batch, seqlen_q, heads_q, head_dim)
        self.shape_kv = (batch, self.capacity, heads_kv, head_dim)
        self.rng = rng
        self._draw(rng)
        self.q, self.k, self.v = (GuardedBuffer.input(a) for a in self.device_inputs())
        self.scale_buffers = [GuardedBuffer.input(a) for a in self.device_scales()]
        seqlens = self.lengths if device_lengths is None else np.asarray(device_lengths, np.int32)
        self.seqlens = GuardedBuffer.input(seqlens)
        self.table = None if page_size is None else GuardedBuffer.input(self.block_table)
        self.outputs = {"out": GuardedBuffer.output(self.shape_q, STORAGE[dtype], POISON)}
        if lse:
            self.outputs["lse"] = GuardedBuffer.output(self.shape_q[:3], np.float32, POISON)
        self.splits = decode_num_splits(self.model_params())
        self.workspace_bytes = ck.raw.attention_decode_workspace_size(self.params())
        self.workspace = None
        if self.workspace_bytes:
            self.workspace = GuardedBuffer.output((self.workspace_bytes,), np.uint8, POISON)
            self.outputs["workspace"] = self.workspace

    # ---- data --------------------------------------------------------------------------------
    def _draw(self, rng):
        """q, and the cache: random keys and values below each length, NaN past it."""
        q = random_normal(rng, self.shape_q, self.dtype, self.logit_scale)
        k = random_normal(rng, self.shape_kv, self.dtype, self.logit_scale)
        v = random_normal(rng, self.shape_kv, self.dtype)
        past = np.arange(self.capacity)[None, :] >= self.clamped[:, None]
        nan = nan_like(k, self.shape_kv)
        k[past], v[past] = nan[past], nan[past]
        self.host_q, self.k_cache, self.v_cache = q, k, v
        self.k_ref, self.v_ref = k, v   # what the reference computes on
        self.k_scales = self.v_scales = None
        if self.kv_format:
            self._quantize(rng, past)
        if self.page_size is not None:
            self._paginate(rng)

    def _quantize(self, rng, past):
        """The cache as codes: per-token scales (NaN past the lengths: never read), or per-head
        scales of 0.7 .. 1.3 x the head's amax / FMAX."""
        fmt, heads_kv = self.kv_format, self.shape_kv[2]
        made = []
        for x in (self.k_cache, self.v_cache):
            if self.per_token:
                codes, scales = ref.kv_cache_quantize(x, self.dtype, fmt)
                scales[past] = np.nan
            else:
                values = ref.to_f32(x, self.dtype)
                amax = np.nanmax(np.abs(values), axis=(0, 1, 3), initial=0.0)
                scales = (np.maximum(amax, 1e-3) / KV_FMAX[fmt]
                          * rng.uniform(0.7, 1.3, heads_kv)).astype(np.float32)
                codes, _ = ref.kv_cache_quantize(x, self.dtype, fmt, scales)
            made.append((codes, scales, ref.kv_cache_dequantize(codes, scales, fmt)))
        (self.k_cache, self.k_scales, self.k_ref), (self.v_cache, self.v_scales, self.v_ref) = made

    def _paginate(self, rng):
        """Pages of the contiguous cache (and of per-token scales) in a shuffled order, two
        spare NaN pages among them, and garbage block table entries past each sequence's
        pages."""
        batch, ps = self.shape_kv[0], self.page_size
        per_seq = ref.block_count(self.capacity, ps)
        used = [ref.block_count(int(n), ps) for n in self.clamped]
        num_pages = sum(used) + 2
        order = rng.permutation(num_pages)
        table = np.full((batch, per_seq), -7, np.int32)
        table[:, 1::2] = 2**30   # garbage, far past the pages
        placed = []   # (page, sequence, its keys)
        for b in range(batch):
            for i in range(used[b]):
                page = order[len(placed)]
                table[b, i] = page
                placed.append((page, b, slice(i * ps, min((i + 1) * ps, self.capacity))))

        def pages(a):
            out = nan_like(a, (num_pages, ps) + a.shape[2:])
            for page, b, keys in placed:
                out[page, :keys.stop - keys.start] = a[b, keys]
            return out

        self.block_table = table
        self.k_pages, self.v_pages = pages(self.k_cache), pages(self.v_cache)
        if self.per_token:
            self.k_scale_pages, self.v_scale_pages = pages(self.k_scales), pages(self.v_scales)

    def device_inputs(self):
        if self.page_size is None:
            return self.host_q, self.k_cache, self.v_cache
        return self.host_q, self.k_pages, self.v_pages

    def take_data(self, other, rng):
        """This call's inputs become `other`'s draw (paginated anew where this call is paged)
        and are written to the device."""
        for name in ("host_q", "k_cache", "v_cache", "k_ref", "v_ref", "k_scales", "v_scales"):
            setattr(self, name, getattr(other, name))
        if self.page_size is not None:
            self._paginate(rng)
        write_buffers((self.q, self.k, self.v), self.device_inputs())
        write_buffers(self.scale_buffers, self.device_scales())
        if self.table is not None:
            self.table.write(self.block_table)

    def device_scales(self):
        """The k_scale and v_scale arrays as the device holds them (none for a dtype cache)."""
        if not self.kv_format:
            return []
        if self.per_token and self.page_size is not None:
            return [self.k_scale_pages, self.v_scale_pages]
        return [self.k_scales, self.v_scales]

    def refill(self, rng):
        self._draw(rng)
        write_buffers((self.q, self.k, self.v), self.device_inputs())
        write_buffers(self.scale_buffers, self.device_scales())
        if self.table is not None:
            self.table.write(self.block_table)

    # ---- the call ----------------------------------------------------------------------------
    def params(self, **changes):
        batch, seqlen_q, heads_q, head_dim = self.shape_q
        fields = dict(dtype=CK_DTYPE[self.dtype], q=self.q.ptr, k_cache=self.k.ptr,
                      v_cache=self.v.ptr, seqlens_k=self.seqlens.ptr,
                      out=self.outputs["out"].ptr,
                      lse=self.outputs["lse"].ptr if "lse" in self.outputs else 0,
                      batch=batch, seqlen_q=seqlen_q, num_heads_q=heads_q,
                      num_heads_kv=self.shape_kv[2], head_dim=head_dim,
                      max_seqlen_k=self.capacity,
                      softmax_scale=0.0 if self.scale is None else self.scale,
                      num_splits=self.num_splits or 0)
        if self.table is not None:
            fields.update(block_table=self.table.ptr, num_pages=self.k_pages.shape[0],
                          page_size=self.page_size, max_blocks_per_seq=self.block_table.shape[1])
        if self.kv_format:
            fields.update(kv_format=KV_FORMATS[self.kv_format],
                          kv_scaling=ck.KV_SCALE_PER_TOKEN if self.per_token else
                          ck.KV_SCALE_PER_HEAD, k_scale=self.scale_buffers[0].ptr,
                          v_scale=self.scale_buffers[1].ptr)
        fields.update(changes)
        return ck.AttentionDecodeParams(**fields)

    def model_params(self):
        """The params as fuzz_support's model of the split rule reads them."""
        p = self.params()
        return {name: getattr(p, name) for name, _ in p._fields_}

    def launch(self, stream=0, workspace_bytes=None, **changes):
        ws = self.workspace.ptr if self.workspace is not None else 0
        nbytes = self.workspace_bytes if workspace_bytes is None else workspace_bytes
        ck.raw.attention_decode(self.params(**changes), ws, nbytes, stream=stream)

    # ---- the checks --------------------------------------------------------------------------
    def v_scales_per_key(self):
        """For a quantized cache, the value scales of the prefill arrays' keys [total_k, Hkv]."""
        if not self.kv_format:
            return None
        full = np.broadcast_to(np.asarray(self.v_scales, np.float64)[..., None], self.shape_kv)
        _, _, vs, _, _ = ref.attention_decode_as_prefill(self.host_q, full, full, self.clamped)
        return vs[..., 0]

    def reference(self):
        q, k, v = self.host_q, self.k_ref, self.v_ref
        o, lse = ref.attention_decode_f64(q, k, v, self.clamped, None, self.scale, self.dtype)
        qp, kp, vp, cu_q, cu_k = ref.attention_decode_as_prefill(q, k, v, self.clamped)
        o_tol, lse_tol = ref.attention_error_bound(
            qp, kp, vp, cu_q, cu_k, self.scale, True, self.dtype, block_n=KERNEL_RESCALE_BLOCK,
            num_splits=self.splits, v_scales=self.v_scales_per_key())
        return o, lse, o_tol.reshape(o.shape), lse_tol.reshape(lse.shape)

    def check(self, ctx):
        synchronize()
        o, lse, o_tol, lse_tol = self.reference()
        got = ref.to_f32(self.outputs["out"].read(f"out, {ctx}"), self.dtype).astype(np.float64)
        assert_within(got, o, o_tol, f"O, {ctx}")
        unseen = lse == -np.inf
        got_lse = None
        if "lse" in self.outputs:
            got_lse = self.outputs["lse"].read(f"lse, {ctx}").astype(np.float64)
            assert (got_lse[unseen] == -np.inf).all(), f"{ctx}: lse of a token without keys"
            assert_within(got_lse[~unseen], lse[~unseen], lse_tol[~unseen], f"lse, {ctx}")
        if self.workspace is not None:
            self.check_partials(got, got_lse, ctx)
        return got

    def partials(self, ctx):
        """The workspace's float32 (O_s [S, B, Sq, Hq, D], lse_s [S, B, Sq, Hq])."""
        raw = self.workspace.read(f"workspace, {ctx}")
        rows = self.splits * int(np.prod(self.shape_q[:3]))
        o_bytes = rows * self.shape_q[3] * 4
        lse_at = -(-o_bytes // 256) * 256
        o_s = raw[:o_bytes].view(np.float32).reshape((self.splits,) + self.shape_q)
        lse_s = raw[lse_at:lse_at + rows * 4].view(np.float32).reshape(
            (self.splits,) + self.shape_q[:3])
        return o_s, lse_s

    def check_partials(self, got, got_lse, ctx):
        o_s, lse_s = self.partials(ctx)
        _, want_lse_s = ref.attention_split_partials(
            self.host_q, self.k_ref, self.v_ref, self.clamped, self.splits,
            softmax_scale=self.scale, dtype=self.dtype, block_n=SPLIT_BLOCK)
        empty = want_lse_s == -np.inf
        assert (lse_s[empty] == -np.inf).all(), f"{ctx}: lse_s of a split without keys"
        assert np.isfinite(lse_s[~empty]).all(), f"{ctx}: lse_s of a split with keys"
        assert np.isfinite(o_s[~empty]).all(), f"{ctx}: O_s of a split with keys"
        # The combine kernel against the float64 combine of the same partials: float32 weights
        # (exp, 2 ulps), sums of S terms and a division, then O's rounding to the dtype.
        c_o, c_lse = ref.attention_combine(o_s, lse_s)
        width = np.abs(np.where(empty[..., None], 0, o_s)).max(axis=0)
        err = (self.splits + 8) * 2 * F32_U * width
        assert_within(got, c_o, err + 0.5 * ref.ulp(np.abs(c_o) + err, self.dtype),
                      f"O against the combine of the partials, {ctx}")
        if got_lse is not None:
            seen = c_lse > -np.inf
            assert (got_lse[~seen] == -np.inf).all(), ctx
            lse_err = 8 * F32_U * (np.abs(c_lse[seen]) + np.log(self.splits) + 1)
            assert_within(got_lse[seen], c_lse[seen], lse_err,
                          f"lse against the combine of the partials, {ctx}")


def context(seed, **facts):
    return ", ".join([f"seed={seed}"] + [f"{k}={v}" for k, v in facts.items()])


# ---------------------------------------------------------------------------------------------
# Shapes: layouts, dtypes, head dims, group ratios, new tokens
# ---------------------------------------------------------------------------------------------
# Lengths: 1 (below 4 and 16 new tokens: tokens without keys), around the 64-key tile, longer.
LENGTHS = [1, 63, 65, 300]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads_q, heads_kv", [(4, 4), (8, 2), (16, 2)],
                         ids=["ratio1", "ratio4", "ratio8"])
@pytest.mark.parametrize("seqlen_q", [1, 4, 16])
@pytest.mark.parametrize("page_size", [None, 16], ids=["contiguous", "paged16"])
def test_shapes(seed, dtype, head_dim, heads_q, heads_kv, seqlen_q, page_size):
    rng = np.random.default_rng(seed)
    call = DecodeCall(rng, dtype, head_dim, heads_q, heads_kv, seqlen_q, LENGTHS,
                      page_size=page_size, capacity=320)
    call.launch()
    call.check(context(seed, dtype=dtype, D=head_dim, Hq=heads_q, Hkv=heads_kv, Sq=seqlen_q,
                       page=page_size, splits=call.splits))


@pytest.mark.parametrize("num_splits", [1, 2, 5, 64])
@pytest.mark.parametrize("page_size", [None, 64], ids=["contiguous", "paged64"])
def test_forced_splits(seed, num_splits, page_size):
    """Forced plans: one split (O written directly), a few, and 64 (most of them empty);
    lengths 0 and 1 and exact multiples of the 64-key block."""
    rng = np.random.default_rng(seed)
    call = DecodeCall(rng, "fp16", 128, 8, 2, 3, [0, 1, 64, 129, 1000], page_size=page_size,
                      num_splits=num_splits)
    assert call.splits == num_splits
    assert (call.workspace is None) == (num_splits == 1)
    call.launch()
    call.check(context(seed, splits=num_splits, page=page_size))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("page_size", [None, 64], ids=["contiguous", "paged64"])
def test_one_long_sequence(seed, dtype, page_size):
    """One sequence 100x longer than the others: its splits carry the work, theirs are empty."""
    rng = np.random.default_rng(seed)
    call = DecodeCall(rng, dtype, 128, 32, 8, 1, [5, 40, 3001, 17], page_size=page_size)
    call.launch()
    call.check(context(seed, dtype=dtype, page=page_size, splits=call.splits))


@pytest.mark.parametrize("page_size", [None, 256], ids=["contiguous", "paged256"])
def test_long_cache(seed, page_size):
    """A 32k+ cache: 16 splits of 2112 keys under the automatic rule (4 CTAs per split, one
    wave of the deeper pipeline), a group of 8 query heads per kv head."""
    rng = np.random.default_rng(seed)
    call = DecodeCall(rng, "bf16", 128, 32, 4, 2, [32768 + 37], page_size=page_size)
    call.launch()
    call.check(context(seed, page=page_size, splits=call.splits))


def test_mqa_many_rows(seed):
    """MQA with 64 query heads and 4 new tokens: 256 rows per kv head, 4 row groups of 64."""
    rng = np.random.default_rng(seed)
    call = DecodeCall(rng, "fp16", 64, 64, 1, 4, [700, 3], page_size=16)
    call.launch()
    call.check(context(seed, splits=call.splits))


# ---------------------------------------------------------------------------------------------
# Scales and large logits
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("scale", [None, 0.05, -0.3])
def test_scales(seed, dtype, scale):
    rng = np.random.default_rng(seed)
    call = DecodeCall(rng, dtype, 64, 4, 1, 2, [200, 77], scale=scale)
    call.launch()
    call.check(context(seed, dtype=dtype, scale=scale))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("num_splits", [1, 4])
def test_large_logits(seed, dtype, num_splits):
    """q and k 8x larger: logits of order 64 and beyond, a nearly one-hot softmax in each split
    and across them (the combine's maximum must keep every weight finite)."""
    rng = np.random.default_rng(seed)
    call = DecodeCall(rng, dtype, 128, 8, 2, 4, [500, 130], num_splits=num_splits,
                      logit_scale=8.0)
    call.launch()
    call.check(context(seed, dtype=dtype, splits=num_splits, logit_scale=8))


# ---------------------------------------------------------------------------------------------
# Paged == contiguous, bit for bit
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("page_size", [16, 64, 256])
@pytest.mark.parametrize("num_splits", [None, 1, 3])
def test_paged_equals_contiguous(seed, page_size, num_splits):
    rng = np.random.default_rng(seed)
    lengths = [1000, 1, 257, 0]
    contiguous = DecodeCall(rng, "bf16", 128, 16, 2, 2, lengths, capacity=1024,
                            num_splits=num_splits)
    paged = DecodeCall(rng, "bf16", 128, 16, 2, 2, lengths, page_size=page_size, capacity=1024,
                       num_splits=num_splits)
    paged.take_data(contiguous, rng)
    assert paged.splits == contiguous.splits
    contiguous.launch()
    paged.launch()
    ctx = context(seed, page=page_size, splits=paged.splits)
    paged.check(ctx)
    for name in ("out", "lse"):
        assert_bitwise_equal(paged.outputs[name].read(name), contiguous.outputs[name].read(name),
                             f"{name}, paged against contiguous, {ctx}")


def test_split_past_the_staged_page_ids(seed):
    """One split over 319 pages of 16 keys, more than the 256 page ids a CTA stages in shared
    memory: it reads the block table for every tile; the same bits as a contiguous cache."""
    rng = np.random.default_rng(seed)
    lengths = [5096, 300]
    contiguous = DecodeCall(rng, "fp16", 128, 8, 2, 1, lengths, capacity=5120, num_splits=1)
    paged = DecodeCall(rng, "fp16", 128, 8, 2, 1, lengths, page_size=16, capacity=5120,
                       num_splits=1)
    paged.take_data(contiguous, rng)
    contiguous.launch()
    paged.launch()
    ctx = context(seed, page=16, splits=1)
    paged.check(ctx)
    for name in ("out", "lse"):
        assert_bitwise_equal(paged.outputs[name].read(name), contiguous.outputs[name].read(name),
                             f"{name}, paged against contiguous, {ctx}")


# ---------------------------------------------------------------------------------------------
# Broken device-side promises, bad arguments
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("page_size", [None, 16], ids=["contiguous", "paged16"])
def test_lengths_past_max_are_clamped(seed, page_size):
    """seqlens_k past max_seqlen_k (by a little, by 2^31 - 1) and negative: the call computes
    the clamped lengths (max_seqlen_k, 0) and reads nothing outside the cache."""
    rng = np.random.default_rng(seed)
    capacity = 200
    call = DecodeCall(rng, "fp16", 128, 8, 2, 2, [capacity] * 4, page_size=page_size,
                      capacity=capacity, device_lengths=[capacity + 5, 2**31 - 1, -3, 10])
    assert call.clamped.tolist() == [capacity, capacity, 0, 10]
    call.launch()
    call.check(context(seed, page=page_size))


def test_page_ids_out_of_range_stay_in_bounds(seed):
    """Block table entries outside [0, num_pages): values unspecified, nothing outside the
    outputs written (the guards stay intact) and nothing outside the pages read."""
    rng = np.random.default_rng(seed)
    call = DecodeCall(rng, "fp16", 64, 4, 2, 1, [100, 50], page_size=16)
    table = call.block_table.copy()
    table[0, 0], table[0, 3], table[1, 1] = -1, 2**31 - 1, call.k_pages.shape[0]
    call.table.write(table)
    call.launch()
    synchronize()
    for name, buffer in call.outputs.items():
        buffer.read(f"{name}, seed={seed}")


def test_workspace_below_the_query_is_rejected(seed):
    rng = np.random.default_rng(seed)
    call = DecodeCall(rng, "fp16", 128, 8, 2, 1, [1000, 2000])
    assert call.workspace_bytes > 0
    for nbytes in (call.workspace_bytes - 1, 0):
        with pytest.raises(ck.CKError) as info:
            call.launch(workspace_bytes=nbytes)
        assert info.value.status == ck.Status.INVALID_VALUE, info.value.message
        assert "workspace_bytes" in info.value.message
    synchronize()
    call.assert_outputs_untouched(f"a rejected call, seed={seed}")


# ---------------------------------------------------------------------------------------------
# lse NULL, graph capture, the wrapper
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_splits", [1, 4])
def test_lse_null_writes_the_same_out(seed, num_splits):
    rng = np.random.default_rng(seed)
    with_lse = DecodeCall(rng, "bf16", 128, 8, 2, 2, [300, 7], num_splits=num_splits)
    with_lse.launch()
    want = with_lse.outputs["out"].read("out with lse")
    without = DecodeCall(rng, "bf16", 128, 8, 2, 2, [300, 7], num_splits=num_splits, lse=False)
    without.take_data(with_lse, rng)
    without.launch()
    without.check(context(seed, lse=None, splits=num_splits))
    assert_bitwise_equal(without.outputs["out"].read("out without lse"), want,
                         f"out with and without lse, seed={seed}")


@pytest.mark.parametrize("page_size", [None, 16], ids=["contiguous", "paged16"])
def test_graph_replays(seed, page_size):
    rng = np.random.default_rng(seed)
    call = DecodeCall(rng, "fp16", 128, 8, 2, 1, [600, 129, 3], page_size=page_size)
    assert call.splits > 1   # the graph holds both kernels
    assert_graph_replays(call, rng, seed)


def test_two_streams_run_concurrently(seed):
    """Two calls, each with its workspace, on two streams at once, repeated so that their
    kernels overlap: each gives its own result and partials."""
    rng = np.random.default_rng(seed)
    calls = [DecodeCall(rng, "fp16", 128, 32, 8, 1, [2000, 700]),
             DecodeCall(rng, "bf16", 64, 8, 2, 4, [300, 1, 1200], page_size=16)]
    assert all(call.splits > 1 for call in calls)
    launch_on_streams(calls)
    for i, call in enumerate(calls):
        call.check(context(seed, stream=i, splits=call.splits))


def test_back_to_back_calls_share_a_workspace(seed):
    """Two calls through one workspace, back to back on one stream: the second's split kernel
    (which may start early, as a programmatic dependent) must not write the partials before the
    first's combine has read them. The first keeps its own result; the workspace holds the
    second's partials."""
    rng = np.random.default_rng(seed)
    first = DecodeCall(rng, "fp16", 128, 32, 8, 1, [2000, 700], capacity=2048)
    second = DecodeCall(rng, "fp16", 128, 32, 8, 1, [900, 2048], capacity=2048)
    assert first.splits == second.splits > 1
    assert first.workspace_bytes == second.workspace_bytes
    second.workspace = second.outputs["workspace"] = first.workspace
    stream = ck.cuda.stream_create(non_blocking=True)
    try:
        for _ in range(3):
            first.launch(stream)
            second.launch(stream)
        ck.cuda.stream_synchronize(stream)
    finally:
        ck.cuda.stream_destroy(stream)
    second.check(context(seed, call="second", splits=second.splits))
    first.workspace = None   # its partials were overwritten: check O and lse alone
    del first.outputs["workspace"]
    first.check(context(seed, call="first", splits=first.splits))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("page_size", [None, 16], ids=["contiguous", "paged16"])
def test_wrapper_gives_the_raw_bits(seed, dtype, page_size):
    rng = np.random.default_rng(seed)
    call = DecodeCall(rng, dtype, 64, 8, 2, 2, [65, 300], page_size=page_size)
    call.launch()
    want_o = call.outputs["out"].read("out")
    want_lse = call.outputs["lse"].read("lse")
    q, k, v = call.device_inputs()
    table = None if page_size is None else call.block_table
    o, lse = ck.attention_decode(q, k, v, call.lengths, block_table=table,
                                 max_seqlen_k=call.capacity, return_lse=True,
                                 dtype="bf16" if dtype == "bf16" else None)
    assert_bitwise_equal(np.asarray(o), want_o, f"attention_decode() out, seed={seed}")
    assert_bitwise_equal(np.asarray(lse), want_lse, f"attention_decode() lse, seed={seed}")


# ---------------------------------------------------------------------------------------------
# Quantized caches: FP8 E4M3 or int8 codes, per-head or per-token scales
# ---------------------------------------------------------------------------------------------
QUANTIZED = [("fp8_e4m3", False), ("fp8_e4m3", True), ("int8", False), ("int8", True)]
QUANTIZED_IDS = ["fp8-head", "fp8-token", "int8-head", "int8-token"]


@pytest.mark.parametrize("kv_format, per_token", QUANTIZED, ids=QUANTIZED_IDS)
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("page_size", [None, 16], ids=["contiguous", "paged16"])
def test_quantized_cache(seed, kv_format, per_token, dtype, head_dim, page_size):
    rng = np.random.default_rng(seed)
    call = DecodeCall(rng, dtype, head_dim, 8, 2, 3, LENGTHS, page_size=page_size, capacity=320,
                      kv_format=kv_format, per_token=per_token)
    call.launch()
    call.check(context(seed, kv=kv_format, per_token=per_token, dtype=dtype, D=head_dim,
                       page=page_size, splits=call.splits))


@pytest.mark.parametrize("kv_format, per_token", QUANTIZED, ids=QUANTIZED_IDS)
def test_quantized_cache_rows_and_splits(seed, kv_format, per_token):
    """MQA with 16 query heads and 4 new tokens (64 rows, 4 warps along M) over pages of 64,
    a forced plan of 5 splits, a length of 0 and large logits."""
    rng = np.random.default_rng(seed)
    call = DecodeCall(rng, "fp16", 128, 16, 1, 4, [700, 0, 64], page_size=64, num_splits=5,
                      logit_scale=4.0, kv_format=kv_format, per_token=per_token)
    call.launch()
    call.check(context(seed, kv=kv_format, per_token=per_token))


@pytest.mark.parametrize("kv_format", ["fp8_e4m3", "int8"])
def test_quantized_long_cache(seed, kv_format):
    """A 32k+ paged cache with per-token scales under the automatic plan (16 splits, the
    deeper pipeline)."""
    rng = np.random.default_rng(seed)
    call = DecodeCall(rng, "bf16", 128, 32, 4, 2, [32768 + 37], page_size=256,
                      kv_format=kv_format, per_token=True)
    call.launch()
    call.check(context(seed, kv=kv_format, splits=call.splits))


@pytest.mark.parametrize("kv_format, per_token", QUANTIZED, ids=QUANTIZED_IDS)
def test_quantized_paged_equals_contiguous(seed, kv_format, per_token):
    rng = np.random.default_rng(seed)
    lengths = [1000, 1, 257, 0]
    contiguous = DecodeCall(rng, "bf16", 128, 16, 2, 2, lengths, capacity=1024,
                            kv_format=kv_format, per_token=per_token)
    paged = DecodeCall(rng, "bf16", 128, 16, 2, 2, lengths, page_size=16, capacity=1024,
                       kv_format=kv_format, per_token=per_token)
    paged.take_data(contiguous, rng)
    assert paged.splits == contiguous.splits
    contiguous.launch()
    paged.launch()
    ctx = context(seed, kv=kv_format, per_token=per_token, splits=paged.splits)
    paged.check(ctx)
    for name in ("out", "lse"):
        assert_bitwise_equal(paged.outputs[name].read(name), contiguous.outputs[name].read(name),
                             f"{name}, paged against contiguous, {ctx}")


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_fp8_subnormal_values_are_exact(seed, dtype):
    """Values whose E4M3 codes are all subnormal (0x01 .. 0x07: 2^-9 .. 7 x 2^-9 times a
    per-head scale of 1): O is their weighted mean, of the same size, so a conversion that
    flushed them to zero would miss the bound by far."""
    rng = np.random.default_rng(seed)
    call = DecodeCall(rng, dtype, 128, 8, 2, 1, [200, 90], kv_format="fp8_e4m3")
    codes = rng.integers(1, 8, call.shape_kv).astype(np.uint8)
    call.v_cache, call.v_scales = codes, np.ones(call.shape_kv[2], np.float32)
    call.v_ref = ref.kv_cache_dequantize(codes, call.v_scales, "fp8_e4m3")
    write_buffers((call.v,) + tuple(call.scale_buffers[1:]), (codes, call.v_scales))
    call.launch()
    got = call.check(context(seed, dtype=dtype))
    assert np.abs(got).max() > 2.0**-10, "the subnormal values' mean"


def test_quantized_graph_replays(seed):
    rng = np.random.default_rng(seed)
    call = DecodeCall(rng, "fp16", 128, 8, 2, 1, [600, 129, 3], page_size=16,
                      kv_format="fp8_e4m3", per_token=True)
    assert call.splits > 1
    assert_graph_replays(call, rng, seed)


def test_first_struct_version_reads_no_appended_field(seed):
    """A caller of the first ck_attention_decode_params_t (struct_size ending at num_splits):
    the appended fields are not read (here garbage: an invalid kv_format and scales), the call
    is a dtype cache's, bit for bit."""
    rng = np.random.default_rng(seed)
    call = DecodeCall(rng, "fp16", 128, 8, 2, 2, [300, 65], num_splits=3)
    call.launch()
    want = {name: call.outputs[name].read(name) for name in ("out", "lse")}
    call.poison_outputs()
    first = ck.AttentionDecodeParams.kv_format.offset
    call.launch(struct_size=first, kv_format=7, kv_scaling=5, k_scale=0x10, v_scale=0x20)
    call.check(context(seed, struct_size=first))
    for name, value in want.items():
        assert_bitwise_equal(call.outputs[name].read(name), value,
                             f"{name}, first struct version, seed={seed}")


@pytest.mark.parametrize("kv_format, per_token", QUANTIZED, ids=QUANTIZED_IDS)
def test_quantized_wrapper_gives_the_raw_bits(seed, kv_format, per_token):
    rng = np.random.default_rng(seed)
    call = DecodeCall(rng, "bf16", 64, 8, 2, 2, [65, 300], page_size=16, kv_format=kv_format,
                      per_token=per_token)
    call.launch()
    want_o = call.outputs["out"].read("out")
    q, k, v = call.device_inputs()
    ks, vs = call.device_scales()
    o = ck.attention_decode(q, k, v, call.lengths, block_table=call.block_table,
                            max_seqlen_k=call.capacity, dtype="bf16", k_scale=ks, v_scale=vs)
    assert_bitwise_equal(np.asarray(o), want_o, f"attention_decode() out, seed={seed}")


# ---------------------------------------------------------------------------------------------
# ck_kv_cache_append: bit for bit against ref.kv_cache_append
# ---------------------------------------------------------------------------------------------
class AppendCall(KernelCall):
    """One ck_kv_cache_append call: `tokens` new rows of k and v (magnitudes over 6 decades, a
    zero row, a NaN and an infinity) into a poisoned cache of `slots` slots, two of the tokens
    sent to slots outside it (-1 and `slots`: skipped), the others to distinct slots in a
    shuffled order."""

    def __init__(self, rng, dtype, head_dim, heads_kv, tokens, slots, kv_format=None,
                 per_token=False):
        self.dtype, self.kv_format = dtype, kv_format
        self.per_token = bool(kv_format and per_token)
        self.shape = (tokens, heads_kv, head_dim)
        self.slots = slots
        self._draw(rng)
        self.k, self.v, self.slot_mapping = (GuardedBuffer.input(a)
                                             for a in (self.host_k, self.host_v, self.mapping))
        code = {None: STORAGE[dtype], "fp8_e4m3": np.uint8, "int8": np.int8}[kv_format]
        cache_shape = (slots, heads_kv, head_dim)
        self.outputs = {name: GuardedBuffer.output(cache_shape, code, POISON)
                        for name in ("k_cache", "v_cache")}
        self.scale_inputs = {}
        if self.per_token:
            for name in ("k_scale", "v_scale"):
                self.outputs[name] = GuardedBuffer.output((slots, heads_kv), np.float32, POISON)
        elif kv_format:
            self.scale_inputs = {name: GuardedBuffer.input(a)
                                 for name, a in zip(("k_scale", "v_scale"), self.head_scales)}

    def _draw(self, rng):
        tokens, heads_kv, _ = self.shape
        made = []
        for _ in range(2):
            x = ref.to_f32(random_normal(rng, self.shape, self.dtype), self.dtype)
            x *= 10.0 ** rng.uniform(-3, 3, (tokens, heads_kv, 1))
            x[0, 0] = 0.0
            x[1, 0, 3], x[1, heads_kv - 1, 5] = np.nan, np.inf
            made.append(ref.to_dtype(x, self.dtype))
        self.host_k, self.host_v = made
        slots = rng.permutation(self.slots)[:tokens - 2]
        self.mapping = rng.permutation(np.concatenate([slots, [-1, self.slots]])).astype(np.int64)
        # Per-head scales: 0.7 .. 1.3 x the head's finite amax / FMAX (some values saturate).
        self.head_scales = []
        if self.kv_format and not self.per_token:
            for x in made:
                values = ref.to_f32(x, self.dtype)
                amax = np.max(np.where(np.isfinite(values), np.abs(values), 0), axis=(0, 2))
                self.head_scales.append((np.maximum(amax, 1e-3) / KV_FMAX[self.kv_format]
                                         * rng.uniform(0.7, 1.3, heads_kv)).astype(np.float32))

    def refill(self, rng):
        self._draw(rng)
        write_buffers((self.k, self.v, self.slot_mapping),
                      (self.host_k, self.host_v, self.mapping))
        write_buffers([self.scale_inputs[name] for name in ("k_scale", "v_scale")
                       if name in self.scale_inputs], self.head_scales)

    def params(self, **changes):
        tokens, heads_kv, head_dim = self.shape
        fields = dict(dtype=CK_DTYPE[self.dtype], kv_format=KV_FORMATS[self.kv_format],
                      kv_scaling=ck.KV_SCALE_PER_TOKEN if self.per_token else
                      ck.KV_SCALE_PER_HEAD, k=self.k.ptr, v=self.v.ptr,
                      slot_mapping=self.slot_mapping.ptr, k_cache=self.outputs["k_cache"].ptr,
                      v_cache=self.outputs["v_cache"].ptr, num_tokens=tokens,
                      num_heads_kv=heads_kv, head_dim=head_dim, num_slots=self.slots)
        scales = self.outputs if self.per_token else self.scale_inputs
        if self.kv_format:
            fields.update(k_scale=scales["k_scale"].ptr, v_scale=scales["v_scale"].ptr)
        fields.update(changes)
        return ck.KvCacheAppendParams(**fields)

    def launch(self, stream=0, **changes):
        ck.raw.kv_cache_append(self.params(**changes), stream=stream)

    def expected(self):
        poisoned = {name: np.full(b.nbytes, POISON, np.uint8).view(b.dtype).reshape(b.shape)
                    for name, b in self.outputs.items()}
        head = self.head_scales or [None, None]
        k_cache, v_cache, k_scale, v_scale = ref.kv_cache_append(
            self.host_k, self.host_v, self.mapping, poisoned["k_cache"], poisoned["v_cache"],
            self.dtype, self.kv_format, poisoned.get("k_scale", head[0]),
            poisoned.get("v_scale", head[1]), self.per_token)
        want = {"k_cache": k_cache, "v_cache": v_cache}
        if self.per_token:
            want.update(k_scale=k_scale, v_scale=v_scale)
        return want

    def check(self, ctx):
        synchronize()
        for name, value in self.expected().items():
            assert_bitwise_equal(self.outputs[name].read(f"{name}, {ctx}"), value,
                                 f"{name}, {ctx}")


@pytest.mark.parametrize("kv_format, per_token", [(None, False)] + QUANTIZED,
                         ids=["dtype"] + QUANTIZED_IDS)
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_append(seed, kv_format, per_token, dtype, head_dim):
    rng = np.random.default_rng(seed)
    call = AppendCall(rng, dtype, head_dim, 4, 37, 64, kv_format, per_token)
    call.launch()
    call.check(context(seed, kv=kv_format, per_token=per_token, dtype=dtype, D=head_dim))


@pytest.mark.parametrize("kv_format, per_token", [(None, False), ("fp8_e4m3", True),
                                                  ("int8", False)],
                         ids=["dtype", "fp8-token", "int8-head"])
def test_append_graph_replays(seed, kv_format, per_token):
    """A capture records the append without running it; each replay appends the fresh rows
    (new slots, new per-head scales) into the poisoned cache."""
    rng = np.random.default_rng(seed)
    call = AppendCall(rng, "bf16", 128, 4, 37, 64, kv_format, per_token)
    assert_graph_replays(call, rng, seed)


def test_append_many_tokens(seed):
    """More rows than the grid has threads: the grid-stride loop."""
    rng = np.random.default_rng(seed)
    call = AppendCall(rng, "fp16", 128, 8, 20000, 30000, "fp8_e4m3", True)
    call.launch()
    call.check(context(seed, tokens=20000))


def test_append_rejects_an_overlap_and_writes_nothing(seed):
    rng = np.random.default_rng(seed)
    call = AppendCall(rng, "bf16", 64, 2, 5, 16, "int8", True)
    with pytest.raises(ck.CKError) as info:
        call.launch(v_scale=call.outputs["k_scale"].ptr)
    assert info.value.status == ck.Status.INVALID_VALUE, info.value.message
    synchronize()
    call.assert_outputs_untouched(f"a rejected call, seed={seed}")


@pytest.mark.parametrize("kv_format", ["fp8_e4m3", "int8"])
def test_append_then_decode(seed, kv_format):
    """A decode step as a serving engine runs it, through the wrapper: the new token's keys and
    values appended to a paged quantized cache (per-token scales), then the decode over it; the
    same as ref.kv_cache_append's cache decoded by the reference, within the bound."""
    rng = np.random.default_rng(seed)
    batch, heads_q, heads_kv, head_dim, page = 3, 8, 2, 128, 16
    lengths = np.array([40, 1, 77], np.int32)
    num_pages = 16
    table = rng.permutation(num_pages)[:batch * 5].reshape(batch, 5).astype(np.int32)
    positions = [(b, t) for b in range(batch) for t in range(int(lengths[b]))]
    slots = np.array([table[b, t // page] * page + t % page for b, t in positions], np.int64)
    k_new = random_normal(rng, (len(slots), heads_kv, head_dim), "fp16")
    v_new = random_normal(rng, (len(slots), heads_kv, head_dim), "fp16")
    q = random_normal(rng, (batch, 1, heads_q, head_dim), "fp16")
    code = np.uint8 if kv_format == "fp8_e4m3" else np.int8
    cache_shape = (num_pages, page, heads_kv, head_dim)
    k_cache, v_cache = (ck.DeviceArray.from_numpy(np.zeros(cache_shape, code)) for _ in "kv")
    k_scale, v_scale = (ck.DeviceArray.from_numpy(np.ones(cache_shape[:3], np.float32))
                        for _ in "kv")
    ck.kv_cache_append(k_new, v_new, slots, k_cache, v_cache, k_scale, v_scale)
    o = ck.attention_decode(q, k_cache, v_cache, lengths, block_table=table, k_scale=k_scale,
                            v_scale=v_scale)
    flat = (num_pages * page, heads_kv, head_dim)
    want = ref.kv_cache_append(k_new, v_new, slots, np.zeros(flat, code), np.zeros(flat, code),
                               "fp16", kv_format, np.ones(flat[:2], np.float32),
                               np.ones(flat[:2], np.float32), per_token=True)
    ctx = context(seed, kv=kv_format)
    assert_bitwise_equal(k_cache.to_numpy().reshape(flat), want[0], f"k_cache, {ctx}")
    assert_bitwise_equal(v_scale.to_numpy().reshape(flat[:2]), want[3], f"v_scale, {ctx}")
    k_vals, v_vals = (ref.kv_cache_dequantize(c, s, kv_format).reshape(cache_shape)
                      for c, s in ((want[0], want[2]), (want[1], want[3])))
    o_ref, _ = ref.attention_decode_f64(q, k_vals, v_vals, lengths, table, dtype="fp16")
    full = np.broadcast_to(want[3].reshape(cache_shape[:3])[..., None], cache_shape)
    qp, kp, vp, cu_q, cu_k = ref.attention_decode_as_prefill(q, k_vals, v_vals, lengths, table)
    _, _, vsp, _, _ = ref.attention_decode_as_prefill(q, full, full, lengths, table)
    splits = decode_num_splits(dict(num_splits=0, num_heads_q=heads_q, num_heads_kv=heads_kv,
                                    seqlen_q=1, batch=batch, max_seqlen_k=5 * page,
                                    block_table=1, page_size=page))
    o_tol, _ = ref.attention_error_bound(qp, kp, vp, cu_q, cu_k, None, True, "fp16",
                                         block_n=KERNEL_RESCALE_BLOCK, num_splits=splits,
                                         v_scales=vsp[..., 0])
    assert_within(ref.to_f32(to_host(o), "fp16").astype(np.float64), o_ref,
                  o_tol.reshape(o_ref.shape), f"O, {ctx}")
