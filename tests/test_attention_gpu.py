"""GPU tests of prefill attention (ck_attention_forward) against tests/reference.py.

- O within ref.attention_error_bound (block_n = 64, the kernel's key tile) of the float64
  reference ref.attention_forward_f64, element by element, and lse within its lse bound; a query
  that sees no key has O = 0 and lse = -inf exactly.
- Shapes: one sequence of S = 1, 63, 65, 127, 129, 300, 700 queries and keys (partial tiles of
  64 and 128 rows; 700 wraps the Hopper kernel's ring of key tiles),
  Sq < Sk and Sq > Sk, causal (bottom-right aligned) and not; packed batches with empty
  sequences, sequences without keys and sequences shorter than their keys, and the reverse;
  GQA (32 query heads over 8 kv heads) and MQA (1 kv head); D 64 and 128; fp16 and bf16; large
  logits (a nearly one-hot softmax); the default and explicit scales (a negative one too).
- lse NULL writes O alone, with the same bits; a CUDA graph replays on fresh inputs; two
  streams run calls at once; a call without keys (the Hopper kernel, forced, refuses it).
- Bad arguments return their status and write nothing; device offsets that break the header's
  promise (past the totals, longer than max_seqlen_q) never write out of bounds.
- The wrapper's attention() gives the raw call's bits.
- Non-finite values in the next sequence's keys and values (a packed batch) leave a sequence's
  output as it is: its last key tile reads them, and must weigh them by nothing.

Every test runs twice: on the Hopper kernel ("wgmma", compute capability 9.0 only: skipped
elsewhere) and on the mma.sync kernel, forced through CK_ATTENTION_KERNEL. Both meet the bound
of 64-key blocks (the wgmma kernel's 128-key blocks rescale less often).

Every output is poisoned and sits between guard regions (gpu_support.GuardedBuffer): an
unwritten element or a write out of bounds fails. The tests skip without a CUDA device. Each
test draws a seed from os.urandom, prints it and names it in its messages; CK_TEST_SEED=<seed>
replays it.
"""
import numpy as np
import pytest

import cuda_wrapper as ck
import reference as ref
from gpu_support import (
    CK_DTYPE, GuardedBuffer, KernelCall, POISON, assert_bitwise_equal,
    assert_forced_variant_unsupported, assert_graph_replays, assert_within, compute_capability,
    force_variant, launch_on_streams, random_normal, synchronize, write_buffers,
)

pytestmark = pytest.mark.gpu

# The key tile of the kernel: the bound allows one online-softmax rescaling per block of keys.
KERNEL_BLOCK_N = 64
STORAGE = {"fp16": np.float16, "bf16": np.uint16}   # the NumPy representation of each dtype


@pytest.fixture(autouse=True)
def sm80():
    """ck_attention_forward requires compute capability 8.0 or newer."""
    cc = compute_capability()
    if cc < (8, 0):
        pytest.skip(f"ck_attention_forward needs compute capability 8.0+ (this GPU: {cc})")


# The library's override of the prefill kernel (read on every call, like CK_GEMM_*_KERNEL).
ATTENTION_KERNEL_ENV = "CK_ATTENTION_KERNEL"


@pytest.fixture(autouse=True, params=["wgmma", "mma"])
def kernel(request, monkeypatch, sm80):
    """Every test runs on both kernels: the Hopper one (skipped on other GPUs) and mma.sync."""
    force_variant(monkeypatch, ATTENTION_KERNEL_ENV, request.param)
    return request.param


class AttentionCall(KernelCall):
    """One ck_attention_forward call on guarded buffers. lengths_q, lengths_k: the sequences'
    query and key counts (packed with cu_seqlens), or None for one sequence of seqlen_q and
    seqlen_k tokens (no offsets). logit_scale multiplies q and k (large logits)."""

    def __init__(self, rng, dtype, head_dim, heads_q, heads_kv, causal, seqlen_q=None,
                 seqlen_k=None, lengths_q=None, lengths_k=None, scale=None, lse=True,
                 logit_scale=1.0):
        self.dtype, self.causal, self.scale = dtype, causal, scale
        self.logit_scale = logit_scale
        if lengths_q is None:
            self.cu_q = self.cu_k = None
            total_q, total_k = seqlen_q, seqlen_k
        else:
            self.cu_q = ref.attention_cu_seqlens(lengths_q)
            self.cu_k = ref.attention_cu_seqlens(lengths_k)
            total_q, total_k = int(self.cu_q[-1]), int(self.cu_k[-1])
        self.shape_q = (total_q, heads_q, head_dim)
        self.shape_k = (total_k, heads_kv, head_dim)
        self._draw(rng)
        self.q, self.k, self.v = (GuardedBuffer.input(a) for a in self.host)
        self.offsets = None if self.cu_q is None else (GuardedBuffer.input(self.cu_q),
                                                       GuardedBuffer.input(self.cu_k))
        self.outputs = {"out": GuardedBuffer.output(self.shape_q, STORAGE[dtype], POISON)}
        if lse:
            self.outputs["lse"] = GuardedBuffer.output(self.shape_q[:2], np.float32, POISON)

    def _draw(self, rng):
        q = random_normal(rng, self.shape_q, self.dtype, self.logit_scale)
        k = random_normal(rng, self.shape_k, self.dtype, self.logit_scale)
        v = random_normal(rng, self.shape_k, self.dtype)
        self.host = (q, k, v)

    def refill(self, rng):
        self._draw(rng)
        write_buffers((self.q, self.k, self.v), self.host)

    def params(self, **changes):
        total_q, heads_q, head_dim = self.shape_q
        fields = dict(dtype=CK_DTYPE[self.dtype], q=self.q.ptr, k=self.k.ptr, v=self.v.ptr,
                      out=self.outputs["out"].ptr,
                      lse=self.outputs["lse"].ptr if "lse" in self.outputs else 0,
                      total_q=total_q, total_k=self.shape_k[0], num_heads_q=heads_q,
                      num_heads_kv=self.shape_k[1], head_dim=head_dim,
                      softmax_scale=0.0 if self.scale is None else self.scale,
                      causal=int(self.causal))
        if self.offsets is not None:
            lengths_q, lengths_k = np.diff(self.cu_q), np.diff(self.cu_k)
            fields.update(batch=len(lengths_q), cu_seqlens_q=self.offsets[0].ptr,
                          cu_seqlens_k=self.offsets[1].ptr,
                          max_seqlen_q=int(lengths_q.max(initial=0)),
                          max_seqlen_k=int(lengths_k.max(initial=0)))
        fields.update(changes)
        return ck.AttentionParams(**fields)

    def launch(self, stream=0, **changes):
        ck.raw.attention_forward(self.params(**changes), stream=stream)

    def reference(self):
        q, k, v = self.host
        args = (q, k, v, self.cu_q, self.cu_k, self.scale, self.causal, self.dtype)
        o, lse = ref.attention_forward_f64(*args)
        o_tol, lse_tol = ref.attention_error_bound(*args, block_n=KERNEL_BLOCK_N)
        return o, lse, o_tol, lse_tol

    def check(self, ctx):
        synchronize()
        o, lse, o_tol, lse_tol = self.reference()
        got = ref.to_f32(self.outputs["out"].read(f"out, {ctx}"), self.dtype).astype(np.float64)
        assert_within(got, o, o_tol, f"O, {ctx}")
        unseen = lse == -np.inf   # queries without keys: O = 0 (checked above: tol 0), lse -inf
        if "lse" in self.outputs:
            got_lse = self.outputs["lse"].read(f"lse, {ctx}").astype(np.float64)
            assert (got_lse[unseen] == -np.inf).all(), f"{ctx}: lse of a query without keys"
            assert_within(got_lse[~unseen], lse[~unseen], lse_tol[~unseen], f"lse, {ctx}")
        return got


def context(seed, **facts):
    return ", ".join([f"seed={seed}"] + [f"{k}={v}" for k, v in facts.items()])


# ---------------------------------------------------------------------------------------------
# One sequence: partial tiles, causal and not, Sq != Sk
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen", [1, 63, 65, 127, 129, 300, 700])
def test_one_sequence(seed, dtype, head_dim, causal, seqlen):
    rng = np.random.default_rng(seed)
    call = AttentionCall(rng, dtype, head_dim, 4, 2, causal, seqlen, seqlen)
    call.launch()
    call.check(context(seed, dtype=dtype, D=head_dim, causal=causal, S=seqlen))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(1, 300), (65, 129), (129, 65), (300, 1),
                                                (200, 63)])
def test_unequal_lengths(seed, dtype, causal, seqlen_q, seqlen_k):
    """Sq < Sk: the queries are the last positions; Sq > Sk causal: the first Sq - Sk queries
    see no key (O = 0, lse = -inf)."""
    rng = np.random.default_rng(seed)
    call = AttentionCall(rng, dtype, 128, 2, 1, causal, seqlen_q, seqlen_k)
    call.launch()
    call.check(context(seed, dtype=dtype, causal=causal, Sq=seqlen_q, Sk=seqlen_k))


# ---------------------------------------------------------------------------------------------
# Packed batches (cu_seqlens read on the device)
# ---------------------------------------------------------------------------------------------
VARLEN = {
    "mixed": ([5, 130, 64, 1], [70, 65, 64, 300]),
    "empty-sequences": ([0, 17, 0, 65], [9, 0, 0, 129]),   # no queries; queries without keys
    "q-longer": ([200, 129], [63, 1]),
}


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", sorted(VARLEN))
def test_varlen(seed, dtype, head_dim, causal, case):
    rng = np.random.default_rng(seed)
    lengths_q, lengths_k = VARLEN[case]
    call = AttentionCall(rng, dtype, head_dim, 4, 4, causal, lengths_q=lengths_q,
                         lengths_k=lengths_k)
    call.launch()
    call.check(context(seed, dtype=dtype, D=head_dim, causal=causal, case=case))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("heads_q, heads_kv", [(32, 8), (8, 1)], ids=["gqa", "mqa"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_grouped_heads(seed, dtype, heads_q, heads_kv, causal):
    """Query head h reads kv head h // (Hq / Hkv): a wrong mapping moves O far past the bound."""
    rng = np.random.default_rng(seed)
    call = AttentionCall(rng, dtype, 128, heads_q, heads_kv, causal, lengths_q=[129, 40],
                         lengths_k=[129, 100])
    call.launch()
    call.check(context(seed, dtype=dtype, Hq=heads_q, Hkv=heads_kv, causal=causal))


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_many_work_items_per_block(seed, head_dim, causal):
    """6 query blocks x 32 heads x 4 sequences = 768 work items of 128 query rows: the Hopper
    kernel's persistent blocks (one per SM) take several each, in both orders, some of them
    without queries (past a short sequence) or without keys."""
    rng = np.random.default_rng(seed)
    call = AttentionCall(rng, "bf16", head_dim, 32, 4, causal, lengths_q=[300, 5, 129, 700],
                         lengths_k=[300, 0, 200, 700])
    call.launch()
    call.check(context(seed, D=head_dim, causal=causal))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_next_sequence_nonfinite_values_stay_out(seed, dtype, head_dim, causal):
    """Sequence 0's last key tile (100 keys of 128, or of 64 and 36) ends inside sequence 1,
    whose k holds inf and v NaN: sequence 0's O and lse must be those of its own keys."""
    rng = np.random.default_rng(seed)
    call = AttentionCall(rng, dtype, head_dim, 2, 1, causal, lengths_q=[100, 30],
                         lengths_k=[100, 60])
    q, k, v = call.host
    bad = 0x7C00 if dtype == "fp16" else 0x7F80              # +inf
    k[100:].view(np.uint16)[...] = bad
    v[100:].view(np.uint16)[...] = bad | 0x0200              # a quiet NaN
    write_buffers((call.q, call.k, call.v), call.host)
    call.launch()
    synchronize()
    ctx = context(seed, dtype=dtype, D=head_dim, causal=causal)
    args = (q[:100], k[:100], v[:100], None, None, None, causal, dtype)
    o, lse = ref.attention_forward_f64(*args)
    o_tol, lse_tol = ref.attention_error_bound(*args, block_n=KERNEL_BLOCK_N)
    got = ref.to_f32(call.outputs["out"].read(f"out, {ctx}"), dtype).astype(np.float64)
    assert_within(got[:100], o, o_tol, f"O of sequence 0, {ctx}")
    got_lse = call.outputs["lse"].read(f"lse, {ctx}").astype(np.float64)
    assert_within(got_lse[:100], lse, lse_tol, f"lse of sequence 0, {ctx}")


# ---------------------------------------------------------------------------------------------
# Scales and large logits
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("scale", [None, 0.05, -0.3, 1.0])
def test_scales(seed, dtype, scale):
    rng = np.random.default_rng(seed)
    call = AttentionCall(rng, dtype, 64, 2, 2, True, 129, 200, scale=scale)
    call.launch()
    call.check(context(seed, dtype=dtype, scale=scale))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_large_logits(seed, dtype, causal):
    """q and k 8x larger: logits of order 64 sqrt(D) / sqrt(D) = 64 and beyond, a nearly
    one-hot softmax; the running maximum must keep every exp finite."""
    rng = np.random.default_rng(seed)
    call = AttentionCall(rng, dtype, 128, 2, 1, causal, 300, 300, logit_scale=8.0)
    call.launch()
    call.check(context(seed, dtype=dtype, causal=causal, logit_scale=8))


# ---------------------------------------------------------------------------------------------
# lse NULL, graph capture, the wrapper
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_lse_null_writes_the_same_out(seed, dtype):
    rng = np.random.default_rng(seed)
    with_lse = AttentionCall(rng, dtype, 128, 4, 2, True, lengths_q=[65, 0, 127],
                             lengths_k=[200, 5, 64])
    with_lse.launch()
    got = with_lse.outputs["out"].read("out with lse")
    without = AttentionCall(rng, dtype, 128, 4, 2, True, lengths_q=[65, 0, 127],
                            lengths_k=[200, 5, 64], lse=False)
    without.host = with_lse.host
    write_buffers((without.q, without.k, without.v), without.host)
    without.launch()
    without.check(context(seed, dtype=dtype, lse=None))
    assert_bitwise_equal(without.outputs["out"].read("out without lse"), got,
                         f"out with and without lse, seed={seed}")


def test_graph_replays(seed):
    rng = np.random.default_rng(seed)
    call = AttentionCall(rng, "fp16", 128, 4, 2, True, lengths_q=[65, 129],
                         lengths_k=[100, 129])
    assert_graph_replays(call, rng, seed)


def test_two_streams_run_concurrently(seed):
    """Two calls of different shapes (one sequence; a packed GQA batch) on two streams at once,
    repeated so that their kernels overlap: each gives its own result."""
    rng = np.random.default_rng(seed)
    calls = [AttentionCall(rng, "bf16", 128, 8, 8, True, seqlen_q=700, seqlen_k=700),
             AttentionCall(rng, "fp16", 64, 8, 2, False, lengths_q=[300, 0, 129],
                           lengths_k=[200, 64, 129])]
    launch_on_streams(calls)
    for i, call in enumerate(calls):
        call.check(context(seed, stream=i))


def test_a_call_without_keys(seed, kernel, monkeypatch):
    """total_k = 0: every query sees no key (O = 0, lse = -inf). The mma.sync kernel serves it;
    the Hopper kernel needs keys, so forcing it is refused (CK_STATUS_UNSUPPORTED, naming the
    override and total_k) with nothing written, and the automatic choice then serves the call."""
    rng = np.random.default_rng(seed)
    call = AttentionCall(rng, "bf16", 128, 4, 2, True, seqlen_q=100, seqlen_k=0)
    if kernel == "wgmma":
        assert_forced_variant_unsupported(call, ATTENTION_KERNEL_ENV, "wgmma", "total_k=0")
        monkeypatch.delenv(ATTENTION_KERNEL_ENV)
    call.launch()
    got = call.check(context(seed, kernel=kernel))
    assert (got == 0).all() and (call.outputs["lse"].read("lse") == -np.inf).all()


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_wrapper_gives_the_raw_bits(seed, dtype):
    rng = np.random.default_rng(seed)
    call = AttentionCall(rng, dtype, 64, 4, 2, True, lengths_q=[65, 3], lengths_k=[64, 130])
    call.launch()
    want_o = call.outputs["out"].read("out")
    want_lse = call.outputs["lse"].read("lse")
    q, k, v = call.host
    o, lse = ck.attention(q, k, v, cu_seqlens_q=call.cu_q, cu_seqlens_k=call.cu_k, causal=True,
                          return_lse=True, dtype=dtype)
    assert_bitwise_equal(np.asarray(o), want_o, f"attention() out, seed={seed}")
    assert_bitwise_equal(np.asarray(lse), want_lse, f"attention() lse, seed={seed}")


# ---------------------------------------------------------------------------------------------
# Bad arguments and broken device-side promises
# ---------------------------------------------------------------------------------------------
BAD = {
    "struct_size": (dict(struct_size=8), ck.Status.INVALID_VALUE),
    "dtype-fp32": (dict(dtype=ck.DType.FP32), ck.Status.UNSUPPORTED),
    "null-q": (dict(q=0), ck.Status.INVALID_VALUE),
    "null-out": (dict(out=0), ck.Status.INVALID_VALUE),
    "head_dim-96": (dict(head_dim=96), ck.Status.UNSUPPORTED),
    "heads-not-divisible": (dict(num_heads_kv=3), ck.Status.INVALID_VALUE),
    "max_seqlen_q-past-total": (dict(max_seqlen_q=10**6), ck.Status.INVALID_VALUE),
    "scale-nan": (dict(softmax_scale=float("nan")), ck.Status.INVALID_VALUE),
    "causal-2": (dict(causal=2), ck.Status.INVALID_VALUE),
    "misaligned-q": (dict(q="+2"), ck.Status.MISALIGNED),
    "misaligned-out": (dict(out="+8"), ck.Status.MISALIGNED),
    "misaligned-lse": (dict(lse="+2"), ck.Status.MISALIGNED),
    "cu_seqlens_k-alone": (dict(cu_seqlens_q=0), ck.Status.INVALID_VALUE),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_arguments_write_nothing(seed, case):
    rng = np.random.default_rng(seed)
    call = AttentionCall(rng, "bf16", 128, 4, 2, True, lengths_q=[65, 3], lengths_k=[64, 130])
    changes, status = BAD[case]
    base = call.params()
    changes = {name: getattr(base, name) + int(value[1:]) if isinstance(value, str) else value
               for name, value in changes.items()}
    with pytest.raises(ck.CKError) as info:
        call.launch(**changes)
    assert info.value.status == status, f"{case}: {info.value.message}"
    synchronize()
    call.assert_outputs_untouched(f"{case}, seed={seed}")


def test_offsets_past_the_contract_stay_in_bounds(seed):
    """Offsets past the totals and sequences longer than max_seqlen_q: the values written are
    unspecified, but nothing outside out and lse is (the guards stay intact)."""
    rng = np.random.default_rng(seed)
    call = AttentionCall(rng, "fp16", 64, 2, 1, False, lengths_q=[100, 100],
                         lengths_k=[100, 100])
    lying_q = np.array([0, 150, 10**6], np.int32)    # sequence 1 runs past total_q
    lying_k = np.array([-5, 2**31 - 1, 7], np.int32)  # negative, past total_k, decreasing
    call.offsets[0].write(lying_q)
    call.offsets[1].write(lying_k)
    call.launch(max_seqlen_q=64)   # sequence 0 holds 150 queries: rows 64 .. 149 left alone
    synchronize()
    call.outputs["out"].read(f"out, seed={seed}")
    call.outputs["lse"].read(f"lse, seed={seed}")
