"""GPU tests of the Mixture-of-experts layer (ck_moe_route, ck_moe_prepack, ck_moe_forward)
against tests/reference.py.

- Route: ids exactly the reference's, weights within the float32 bound derived below, for
  fp32/fp16/bf16 logits, E in {1, 8, 33, 64, 1000, 1024}, k in {1, 2, 6, 8, 32}, with and
  without renormalization, on logits whose distinct values are far apart and on logits full of
  exact ties (the lower index first); probabilities that underflow to 0 tie too.
- Prepack: bit for bit ref.moe_prepack (ck_w4a16_prepack's layout per expert, the gate+up rows
  interleaved in 8-row tiles).
- Forward: against the float64 reference on the dequantized weights (ref.moe_layer_f64), with an
  element-wise worst-case bound and a norm-wise one (below), for fp16/bf16, every group size,
  sym/asym, H, I in {96 .. 384}, E in {1, 4, 8, 16, 64}, k in {1, 2, 4, 6}, T from 1 to 300,
  routed by the layer (fp32/fp16/bf16 logits) or by the caller's ids and weights; the layer's
  own routing gives the bits of ck_moe_route's ids and weights passed in; out-of-range ids
  contribute nothing; every pair on one expert, experts without tokens; the same bits on every
  run whatever the workspace held, and on every CUDA graph replay; a workspace below the query
  is refused; the least alignment the header asks for.
- The wrapper: moe_route, moe_prepack, moe_forward and QuantizedMoE give the raw calls' bits.
- QuantizedMoE.from_gptq / from_awq on random per-expert checkpoints (checkpoint_formats; GPTQ
  without g_idx, with the trivial one, symmetric; every calling convention, NumPy and device
  tensors): the stacked interchange tensors bit for bit each expert's import, the output the
  raw layer's bits on them (within the float64 bound) and those of QuantizedMoE built from
  them; act-order g_idx, experts of mismatched shapes and malformed experts are refused.

Every output and the workspace are poisoned and sit between guard regions
(gpu_support.GuardedBuffer): an unwritten element or a write out of bounds fails. The tests skip
without a CUDA device; CK_SANITIZE=1 leaves out the largest shapes. Each test draws a seed from
os.urandom, prints it and names it in its messages; CK_TEST_SEED=<seed> replays it.
"""
import math

import numpy as np
import pytest

import checkpoint_formats as cf
import cuda_wrapper as ck
import reference as ref
from gpu_support import (
    CK_DTYPE, CK_INT4_MODE, GROUP_IDS, GuardedBuffer, KernelCall, POISON, SANITIZE,
    SANITIZE_MAX_MACS, SECOND_ORDER_SLACK, U32, assert_bitwise_equal,
    assert_capture_records_then_replay_writes, assert_graph_replays, assert_meets_reference,
    assert_within, compute_capability, dtype_arg, force_variant, output_tolerance, ptr_or_null,
    random_normal, synchronize, to_device,
)

pytestmark = pytest.mark.gpu

# The library's override of the expert kernels (read on every call, like CK_GEMM_*_KERNEL):
# these tests run the automatic choice, whatever the caller's shell says.
MOE_KERNEL_ENV = "CK_MOE_KERNEL"


@pytest.fixture(autouse=True)
def _automatic_moe_kernel(monkeypatch):
    monkeypatch.delenv(MOE_KERNEL_ENV, raising=False)


@pytest.fixture
def sm80():
    """ck_moe_forward requires compute capability 8.0 or newer."""
    cc = compute_capability()
    if cc < (8, 0):
        pytest.skip(f"ck_moe_forward needs compute capability 8.0+ (this GPU: {cc})")


def gamma(n, u=U32):
    """gamma_n = n u / (1 - n u): the relative error bound of n float32 roundings (Higham)."""
    return n * u / (1 - n * u)


# ---------------------------------------------------------------------------------------------
# Route: data and tolerance
# ---------------------------------------------------------------------------------------------
# Logits on a grid: multiples of 1/64 in [-16, 16] (exact in fp32 and fp16), of 1/16 in [-8, 8]
# for bf16 (exact there). Distinct values differ by at least 1/64, so their probabilities by
# 1.6% (e^(1/64) - 1), far beyond any float32 rounding: the ids are unambiguous. Equal values
# are exact ties in any implementation (the same float32 operations on the same value).
GRID = {"fp32": (1 / 64, 16), "fp16": (1 / 64, 16), "bf16": (1 / 16, 8)}


def grid_logits(rng, tokens, experts, dtype, ties=False):
    """[tokens, experts] logits in dtype's representation, on dtype's grid: distinct per token
    where the grid has enough values, else drawn with repetition; ties: from 4 values only."""
    step, limit = GRID[dtype]
    grid = np.arange(-round(limit / step), round(limit / step) + 1) * step
    if ties:
        grid = rng.choice(grid, size=4, replace=False)
    rows = [rng.choice(grid, size=experts, replace=experts > len(grid)) for _ in range(tokens)]
    return ref.to_dtype(np.array(rows, np.float32).reshape(tokens, experts), dtype)


def route_rtol(experts, top_k, renormalize):
    """The relative bound on |w_gpu - w_ref| of a routing weight. Each side is within r of the
    exact probability: exp (CUDA's expf within 2 ulp, 4u; the reference's correctly rounded),
    the float32 sum over the E experts in any order (positive terms: gamma_{E-1} of the exact
    sum, Higham Thm. 3.1, plus the terms' own 4u), the division (a reciprocal and a product,
    2u): r = 10u + gamma_{E-1}. Renormalizing divides by a float32 sum of k of them: each side
    2r + gamma_{k-1} + u. The two sides' errors add. (A worst case: the sum's error is ~sqrt(E)
    times smaller in practice, and exact where a kernel and NumPy add alike.)"""
    side = 10 * U32 + gamma(experts - 1)
    if renormalize:
        side = 2 * side + gamma(top_k - 1) + U32
    return 2 * side * SECOND_ORDER_SLACK


def assert_route(ids, weights, logits, top_k, renormalize, dtype, ctx):
    """ids bitwise the reference's, weights within route_rtol (exactly 1 for k = 1 with
    renormalization, exactly 0 where the probability underflows)."""
    want_ids, want_weights = ref.moe_route(logits, top_k, renormalize, dtype)
    assert_bitwise_equal(ids, want_ids, f"ids, {ctx}")
    experts = logits.shape[1]
    tol = route_rtol(experts, top_k, renormalize) * np.abs(want_weights.astype(np.float64))
    assert_within(weights.astype(np.float64), want_weights.astype(np.float64), tol,
                  f"weights, {ctx}")
    if renormalize and top_k == 1:
        assert (weights == 1).all(), f"{ctx}: a single renormalized weight is 1"


class RouteCall(KernelCall):
    """One ck_moe_route call on guarded buffers."""

    def __init__(self, logits, top_k, renormalize, dtype, misalign=(0, 0, 0)):
        """misalign: extra bytes before logits, ids and weights."""
        self.top_k, self.renormalize, self.dtype = top_k, renormalize, dtype
        self.logits_host = logits
        tokens = logits.shape[0]
        self.logits = GuardedBuffer.input(logits, misalign[0])
        self.ids = GuardedBuffer.output((tokens, top_k), np.int32, POISON, misalign[1])
        self.weights = GuardedBuffer.output((tokens, top_k), np.float32, POISON, misalign[2])
        self.outputs = {"topk_ids": self.ids, "topk_weights": self.weights}

    def launch(self, stream=0):
        tokens, experts = self.logits_host.shape
        ck.raw.moe_route(self.logits.ptr, CK_DTYPE[self.dtype], tokens, experts, self.top_k,
                         int(self.renormalize), self.ids.ptr, self.weights.ptr, stream)

    def refill(self, rng, ties=False):
        tokens, experts = self.logits_host.shape
        self.logits_host = grid_logits(rng, tokens, experts, self.dtype, ties)
        self.logits.write(self.logits_host)

    def check(self, ctx):
        synchronize()
        ids, weights = self.ids.read(f"ids, {ctx}"), self.weights.read(f"weights, {ctx}")
        assert_route(ids, weights, self.logits_host, self.top_k, self.renormalize, self.dtype,
                     ctx)
        return ids, weights


# ---------------------------------------------------------------------------------------------
# Route tests
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("renormalize", [False, True], ids=["raw", "renormalized"])
@pytest.mark.parametrize("top_k", [1, 2, 6, 8])
@pytest.mark.parametrize("experts", [8, 64, 1000])
@pytest.mark.parametrize("dtype", ref.MOE_ROUTER_DTYPES)
def test_route(dtype, experts, top_k, renormalize, seed):
    """37 tokens (a partial block of the kernel), logits spread, then full of ties, on the
    same buffers."""
    rng = np.random.default_rng(seed)
    call = RouteCall(grid_logits(rng, 37, experts, dtype), top_k, renormalize, dtype)
    call.launch()
    call.check(f"spread, seed={seed}")
    call.refill(rng, ties=True)
    call.poison_outputs()
    call.launch()
    call.check(f"ties, seed={seed}")


@pytest.mark.parametrize("experts, top_k", [(1, 1), (33, 32), (1024, 1), (1024, 32)])
@pytest.mark.parametrize("renormalize", [False, True], ids=["raw", "renormalized"])
def test_route_limits(experts, top_k, renormalize, seed):
    """The smallest and largest E and k the header allows (E = 1: p = 1)."""
    rng = np.random.default_rng(seed)
    call = RouteCall(grid_logits(rng, 5, experts, "fp32"), top_k, renormalize, "fp32")
    call.launch()
    _, weights = call.check(f"seed={seed}")
    if experts == 1:
        assert (weights == 1).all()


def test_route_many_tokens(seed):
    rng = np.random.default_rng(seed)
    call = RouteCall(grid_logits(rng, 1 if SANITIZE else 4097, 64, "bf16"), 8, True, "bf16")
    call.launch()
    call.check(f"seed={seed}")


def test_route_underflowing_probabilities_tie_at_zero(seed):
    """Logits 1000 apart: every probability but the largest underflows to exactly 0, and the
    zeros tie (ascending ids after the first). Renormalized, the weights are 1, 0, 0, ..."""
    rng = np.random.default_rng(seed)
    logits = (rng.permuted(np.tile(np.arange(64), (9, 1)), axis=1) * 1000.0).astype(np.float32)
    for renormalize in (False, True):
        call = RouteCall(logits, 6, renormalize, "fp32")
        call.launch()
        ids, weights = call.check(f"renormalize={renormalize}, seed={seed}")
        assert (weights[:, 1:] == 0).all()
        assert (np.diff(ids[:, 1:], axis=1) > 0).all()


@pytest.mark.parametrize("dtype", ref.MOE_ROUTER_DTYPES)
def test_route_element_aligned_pointers(dtype, seed):
    """logits, ids and weights aligned to their element only."""
    rng = np.random.default_rng(seed)
    misalign = (ref.NUMPY_DTYPE[dtype]().itemsize, 4, 12)
    call = RouteCall(grid_logits(rng, 19, 40, dtype), 3, True, dtype, misalign)
    call.launch()
    call.check(f"seed={seed}")


def test_route_graph_replay(seed):
    rng = np.random.default_rng(seed)
    call = RouteCall(grid_logits(rng, 21, 64, "fp16"), 6, True, "fp16")
    assert_graph_replays(call, rng, seed)


# ---------------------------------------------------------------------------------------------
# Expert weights: data, prepack
# ---------------------------------------------------------------------------------------------
def random_experts(rng, experts, n, k, dtype, mode, group_size, source):
    """The interchange format (w_packed [E, n, k / 2], scales [E, n, groups], zeros or None) of
    E experts' [n, k] weights whose dequantized values are ~ N(0, 1/k), so that each projection
    keeps values ~ N(0, 1) (far inside fp16's range).

    source 'normal': ref.moe_quantize of N(0, 1/k) weights. 'codes': uniformly random bytes
    (every code), random zero points in [0, 15] and positive scales spread over a factor of 10.
    """
    if source == "normal":
        w = random_normal(rng, (experts, n, k), dtype, scale=k**-0.5)
        return ref.moe_quantize(w, dtype, group_size, mode)
    groups = ref.int4_groups_per_row(k, group_size)
    packed = rng.integers(0, 256, size=(experts, n, k // 2), dtype=np.uint8)
    typical_code = 5.0  # |q - zero| of uniform codes is ~4.6 (sym) to ~6.5 (asym) rms
    scales = 10.0 ** rng.uniform(-0.5, 0.5, (experts, n, groups)) / (typical_code * math.sqrt(k))
    scales = ref.to_dtype(scales.astype(np.float32), dtype)
    zeros = (rng.integers(0, 16, size=(experts, n, groups), dtype=np.uint8) if mode == "asym"
             else None)
    return packed, scales, zeros


class ExpertWeight:
    """One projection's weights: the interchange arrays on the host and in guarded device
    buffers, and what ck_moe_prepack makes of them in poisoned, guarded buffers."""

    def __init__(self, host, k, group_size, dtype, gate_up, misalign=0):
        self.k, self.group_size, self.dtype, self.gate_up = k, group_size, dtype, gate_up
        self.host = host
        packed, scales, zeros = host
        self.experts, self.n = packed.shape[:2]
        self.inputs = [None if a is None else GuardedBuffer.input(a) for a in host]
        nbytes, nvalues = ref.moe_prepacked_sizes(self.experts, self.n, k, group_size)
        assert ck.raw.moe_prepacked_bytes(self.experts, self.n, k) == nbytes
        assert ck.raw.moe_prepacked_groups(self.experts, self.n, k, group_size) == nvalues
        self.w = GuardedBuffer.output((nbytes,), np.uint8, POISON, misalign)
        self.scales = GuardedBuffer.output((nvalues,), ref.NUMPY_DTYPE[dtype], POISON, misalign)
        self.zeros = (None if zeros is None else
                      GuardedBuffer.output((nvalues,), np.uint8, POISON, misalign))
        self.prepack()

    def prepack(self, stream=0):
        w, s, z = self.inputs
        ck.raw.moe_prepack(w.ptr, s.ptr, ptr_or_null(z), CK_DTYPE[self.dtype], self.experts,
                           self.n, self.k, self.group_size,
                           CK_INT4_MODE["sym" if z is None else "asym"], int(self.gate_up),
                           self.w.ptr, self.scales.ptr, ptr_or_null(self.zeros), stream)

    def refill(self, host):
        """New interchange values in the same buffers, prepacked again (outside any graph)."""
        self.host = host
        for buffer, values in zip(self.inputs, host):
            if buffer is not None:
                buffer.write(values)
        self.prepack()

    def dequantized(self):
        """[E, n, k] in dtype: what the layer multiplies by."""
        return ref.moe_dequantize(*self.host, self.k, self.group_size, self.dtype)

    def check_prepacked(self, ctx):
        synchronize()
        want = ref.moe_prepack(*self.host, self.k, self.group_size, self.gate_up)
        for name, buffer, values in zip(("w_prepacked", "scales_prepacked", "zeros_prepacked"),
                                        (self.w, self.scales, self.zeros), want):
            assert (buffer is None) == (values is None), name
            if buffer is not None:
                assert_bitwise_equal(buffer.read(f"{name}, {ctx}"), values, f"{name}, {ctx}")


PREPACK_SHAPES = [(1, 16, 32), (3, 64, 160), (2, 96, 384), (4, 48, 96), (8, 256, 128)]


@pytest.mark.parametrize("experts, n, k", PREPACK_SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("gate_up", [False, True], ids=["w2", "w13"])
@pytest.mark.parametrize("group_size", ref.INT4_GROUP_SIZES, ids=lambda g: GROUP_IDS[g])
@pytest.mark.parametrize("mode", ref.INT4_MODES)
@pytest.mark.parametrize("dtype", ref.MOE_DTYPES)
def test_prepack_layout(dtype, mode, group_size, gate_up, experts, n, k, seed):
    """Bit for bit ref.moe_prepack: each expert's weight in ck_w4a16_prepack's layout at e times
    its size, the gate+up rows in 8-row tiles alternating between gate and up."""
    rng = np.random.default_rng(seed)
    weight = ExpertWeight(random_experts(rng, experts, n, k, dtype, mode, group_size, "codes"),
                          k, group_size, dtype, gate_up)
    weight.check_prepacked(f"{dtype}-{mode}-g{group_size}-{experts}x{n}x{k}, seed={seed}")


def test_prepack_is_captured_in_a_graph(seed):
    rng = np.random.default_rng(seed)
    weight = ExpertWeight(random_experts(rng, 3, 64, 96, "bf16", "asym", 32, "codes"), 96, 32,
                          "bf16", True)
    for buffer in (weight.w, weight.scales, weight.zeros):
        buffer.poison()
    assert_capture_records_then_replay_writes(weight.prepack, weight.w, "the prepack")
    weight.check_prepacked(f"replayed prepack, seed={seed}")


# ---------------------------------------------------------------------------------------------
# Forward: tolerance
# ---------------------------------------------------------------------------------------------
# The kernel computes the header's formula with float32 sums; the reference is its float64
# ideal with the same two roundings (h and out). A worst-case bound on the difference, element
# by element, for a pair (t, j) of expert e:
# - g, u: H products, exact in float32 (fp16/bf16 factors), summed in float32 in any order and
#   blocking, on tensor cores that may truncate (unit roundoff 2u, Fasi et al. 2021):
#   |g32 - g| <= gamma_{H+1}(2u) sum_h |x_h W1_ih| (likewise u).
# - silu(g32) = g / (1 + expf(-g)) in float32: within SILU_ERROR relative of silu(g32) (expf is
#   within 2 ulp; the add and the division round; a fast exp would stay far inside 64u), and
#   silu is SILU_LIPSCHITZ-Lipschitz, so |silu32 - silu(g)| <= L eg + SILU_ERROR (|silu| + L eg);
#   the product with u32 rounds once more. That bounds the kernel's h before its rounding: eh.
# - h is rounded to dtype on both sides: the kernel's h lies between round(h_exact - eh) and
#   round(h_exact + eh) (rounding is monotonic), the reference's is round(h_exact): their
#   difference is at most the larger distance to that interval's ends (0 where the interval
#   rounds to one value, which is most elements).
# - y = h W2^T: the kernel's h against the reference's, plus gamma_{I+2}(2u) sum_i |h_i W2_ci|
#   (float32 sums; +1 for the product with the routing weight, which may be applied to h or
#   to the sum).
# - out: w y in float32 (u), summed over j in float32 (gamma_k), rounded to dtype (half an ulp,
#   output_tolerance); the layer's own routing weights carry route_rtol.
# It is a worst case: real errors are orders of magnitude smaller, except for the roundings of h
# and of out, which the reference shares; the norm-wise check below holds the real error to a
# few ulps of the output dtype.
TENSOR_CORE_ROUNDOFF = 2 * U32
SILU_ERROR = 64 * U32
SILU_LIPSCHITZ = 1.1   # max |silu'(g)| = 1.0998 (at g ~ 2.4)
# The norm-wise error ||got - ref|| / ||ref||: the output rounding alone gives ~2^-p / sqrt(3)
# (p significand bits); the roundings of h are the reference's too, bar the rare elements the
# float32 sums push across a rounding boundary. 4 ulps leave a margin of ~7 and still catch a
# missing or doubled rounding of h, a weight applied twice or a lost pair, which are far larger
# (gpu_support.MAX_REL_ULPS, checked by gpu_support.assert_meets_reference).


def moe_float32_error(x, ids, weights, w13, w2, pairs, dtype, weight_rtol):
    """The bound (see above) on |out32 - value| before the rounding to dtype: float64 [T, H].
    x [T, H], w13 [E, 2I, H], w2 [E, H, I] in dtype's representation; pairs from
    ref.moe_pairs_f64; weight_rtol: the relative error of the routing weights (0 if given)."""
    xa = np.abs(ref.to_f32(x, dtype).astype(np.float64))
    w13a = np.abs(ref.to_f32(w13, dtype).astype(np.float64))
    w2a = np.abs(ref.to_f32(w2, dtype).astype(np.float64))
    experts, two_i, hidden = w13a.shape
    inter = two_i // 2
    tokens, top_k = ids.shape
    y_err = np.zeros((tokens, top_k, hidden))
    gamma_h = gamma(hidden + 1, TENSOR_CORE_ROUNDOFF)
    gamma_i = gamma(inter + 2, TENSOR_CORE_ROUNDOFF)
    for e, t, j in ref.moe_pairs_by_expert(ids, experts):
        eg = gamma_h * (xa[t] @ w13a[e, :inter].T)
        eu = gamma_h * (xa[t] @ w13a[e, inter:].T)
        g, u = pairs["g"][t, j], pairs["u"][t, j]
        with np.errstate(over="ignore"):
            silu = np.abs(g / (1.0 + np.exp(-g)))
        d_silu = SILU_LIPSCHITZ * eg + SILU_ERROR * (silu + SILU_LIPSCHITZ * eg)
        u_abs = np.abs(u) + eu
        eh = (d_silu * u_abs + silu * eu + U32 * (silu + d_silu) * u_abs) * SECOND_ORDER_SLACK
        h_exact, h = pairs["h_exact"][t, j], pairs["h"][t, j]
        lo = ref.to_f32(ref.round_f64_to_dtype(h_exact - eh, dtype), dtype).astype(np.float64)
        hi = ref.to_f32(ref.round_f64_to_dtype(h_exact + eh, dtype), dtype).astype(np.float64)
        h_err = np.maximum(hi - h, h - lo)
        h_abs = np.maximum(np.abs(lo), np.abs(hi))
        y_err[t, j] = h_err @ w2a[e].T + gamma_i * (h_abs @ w2a[e].T)
    w = np.abs(weights.astype(np.float64))[:, :, None]
    y_abs = np.abs(pairs["y"]) + y_err
    per_pair = (w * y_err + weight_rtol * w * y_abs + U32 * (1 + weight_rtol) * w * y_abs)
    total = (per_pair.sum(axis=1)
             + gamma(top_k) * ((1 + weight_rtol) * w * y_abs).sum(axis=1))
    return total * SECOND_ORDER_SLACK


# ---------------------------------------------------------------------------------------------
# Forward: one call
# ---------------------------------------------------------------------------------------------
def random_ids(rng, tokens, experts, top_k):
    """k distinct experts per token, and float32 weights in (0, 1]."""
    ids = np.argsort(rng.random((tokens, experts)), axis=1)[:, :top_k].astype(np.int32)
    weights = (1 - rng.random((tokens, top_k))).astype(np.float32)
    return np.ascontiguousarray(ids), weights


class MoECall(KernelCall):
    """One ck_moe_forward call on guarded buffers: x, the routing (logits, or ids and weights),
    both prepacked weights, the output and the workspace (poisoned outputs both)."""

    def __init__(self, rng, shape, dtype, mode, group_size, routing, renormalize=False,
                 source="normal", ids=None, misalign=False):
        """shape (T, H, I, E, k); routing: "ids" (the caller's: `ids` if given, else random
        distinct ones, with random weights) or a router dtype (the layer routes grid logits).
        misalign: every pointer only as aligned as the header asks (x, out and the weights 16
        bytes, the rest their element; the workspace keeps its 256)."""
        self.shape, self.dtype, self.mode, self.group_size = shape, dtype, mode, group_size
        self.routing, self.renormalize, self.source = routing, renormalize, source
        tokens, hidden, inter, experts, top_k = shape
        step = 16 if misalign else 0
        self.w13 = ExpertWeight(random_experts(rng, experts, 2 * inter, hidden, dtype, mode,
                                               group_size, source),
                                hidden, group_size, dtype, True, step)
        self.w2 = ExpertWeight(random_experts(rng, experts, hidden, inter, dtype, mode,
                                              group_size, source),
                               inter, group_size, dtype, False, step)
        self.x_host = random_normal(rng, (tokens, hidden), dtype)
        self.x = GuardedBuffer.input(self.x_host, step)
        if routing == "ids":
            ids_host, weights_host = random_ids(rng, tokens, experts, top_k)
            if ids is not None:
                ids_host = np.ascontiguousarray(ids, dtype=np.int32)
            self.route_host = (ids_host, weights_host)
            self.ids = GuardedBuffer.input(ids_host, 4 if misalign else 0)
            self.weights = GuardedBuffer.input(weights_host, 12 if misalign else 0)
            self.logits = None
        else:
            self.route_host = grid_logits(rng, tokens, experts, routing)
            self.logits = GuardedBuffer.input(self.route_host,
                                              ref.NUMPY_DTYPE[routing]().itemsize if misalign
                                              else 0)
            self.ids = self.weights = None
        self.out = GuardedBuffer.output((tokens, hidden), ref.NUMPY_DTYPE[dtype], POISON, step)
        self.workspace_bytes = ck.raw.moe_workspace_size(self.params())
        self.workspace = GuardedBuffer.output((self.workspace_bytes,), np.uint8, POISON)
        self.outputs = {"out": self.out, "workspace": self.workspace}
        self._expected = None

    def params(self, **changes):
        tokens, hidden, inter, experts, top_k = self.shape
        zeros = (self.w13.zeros, self.w2.zeros)
        fields = dict(
            tokens=tokens, hidden=hidden, intermediate=inter, experts=experts, top_k=top_k,
            dtype=CK_DTYPE[self.dtype], group_size=self.group_size,
            mode=CK_INT4_MODE[self.mode], x=self.x.ptr,
            router_logits=ptr_or_null(self.logits),
            router_dtype=CK_DTYPE[self.routing] if self.logits is not None else 0,
            renormalize=int(self.renormalize), topk_ids=ptr_or_null(self.ids),
            topk_weights=ptr_or_null(self.weights), w13=self.w13.w.ptr,
            w13_scales=self.w13.scales.ptr, w13_zeros=ptr_or_null(zeros[0]), w2=self.w2.w.ptr,
            w2_scales=self.w2.scales.ptr, w2_zeros=ptr_or_null(zeros[1]),
            activation=ck.MOE_SWIGLU, out=self.out.ptr)
        fields.update(changes)
        return ck.MoeParams(**fields)

    def launch(self, stream=0, workspace_bytes=None):
        ck.raw.moe_forward(self.params(), self.workspace.ptr,
                           self.workspace_bytes if workspace_bytes is None else workspace_bytes,
                           stream)

    def scramble_workspace(self, rng):
        """Random bytes in the workspace (its guards stay): results must not depend on them."""
        self.workspace.write(rng.integers(0, 256, self.workspace_bytes, dtype=np.uint8))

    def refill(self, rng):
        """Fresh x, routing and weights in the same buffers (the weights prepacked again)."""
        tokens, hidden, inter, experts, top_k = self.shape
        self.x_host = random_normal(rng, (tokens, hidden), self.dtype)
        self.x.write(self.x_host)
        if self.logits is None:
            self.route_host = random_ids(rng, tokens, experts, top_k)
            self.ids.write(self.route_host[0])
            self.weights.write(self.route_host[1])
        else:
            self.route_host = grid_logits(rng, tokens, experts, self.routing)
            self.logits.write(self.route_host)
        for weight, n, k in ((self.w13, 2 * inter, hidden), (self.w2, hidden, inter)):
            weight.refill(random_experts(rng, experts, n, k, self.dtype, self.mode,
                                         self.group_size, self.source))
        self._expected = None

    def use_weights(self, w13, w2):
        """The interchange weights w13 ([E, 2I, H] packed, scales, zeros) and w2 in the call's
        buffers, prepacked again."""
        self.w13.refill(w13)
        self.w2.refill(w2)
        self._expected = None

    def routed(self):
        """(ids, weights, their relative error bound) the layer uses."""
        if self.logits is None:
            return self.route_host[0], self.route_host[1], 0.0
        top_k, experts = self.shape[4], self.shape[3]
        ids, weights = ref.moe_route(self.route_host, top_k, self.renormalize, self.routing)
        return ids, weights, route_rtol(experts, top_k, self.renormalize)

    def expected(self):
        """(the float64 value of the output, the float32 error bound), once per inputs."""
        if self._expected is None:
            ids, weights, rtol = self.routed()
            w13, w2 = self.w13.dequantized(), self.w2.dequantized()
            pairs = ref.moe_pairs_f64(self.x_host, ids, w13, w2, self.dtype)
            value = ref.moe_combine_f64(pairs["y"], weights)
            error = moe_float32_error(self.x_host, ids, weights, w13, w2, pairs, self.dtype,
                                      rtol)
            self._expected = value, error
        return self._expected

    def check(self, ctx):
        """Compares with the reference; returns the raw output."""
        synchronize()
        out = self.out.read(f"out, {ctx}")
        self.workspace.read(f"workspace, {ctx}")   # its guards: nothing written past it
        value, error = self.expected()
        assert_meets_reference(ref.to_f32(out, self.dtype).astype(np.float64), value, error,
                               self.dtype, ctx)
        return out


def moe_small_enough(shape):
    tokens, hidden, inter, _, top_k = shape
    return not SANITIZE or 3 * tokens * top_k * hidden * inter <= SANITIZE_MAX_MACS


def moe_id(shape):
    return "T{}-H{}-I{}-E{}-k{}".format(*shape)


# ---------------------------------------------------------------------------------------------
# Forward tests
# ---------------------------------------------------------------------------------------------
# (T, H, I, E, k): T in {1, 3, 16, 33, 128, 300}, H and I in {128, 256, 384}, E in {1, 4, 8,
# 64}, k in {1, 2, 6}: few rows per expert (the decode path) and many (the tensor-core path),
# experts that get no token (E = 64 with few tokens), one expert (E = 1).
SHAPES = [
    (1, 128, 128, 1, 1), (3, 256, 128, 4, 2), (16, 128, 384, 8, 2), (33, 384, 256, 8, 6),
    (128, 256, 256, 64, 6), (300, 128, 128, 4, 1), (300, 384, 384, 8, 2), (16, 384, 128, 64, 1),
    (128, 128, 256, 1, 1), (33, 256, 384, 64, 2), (1, 384, 384, 64, 6), (3, 128, 256, 8, 6),
]
# Each shape gets one group size, routing and weight source, rotated so that every value meets
# both dtypes and modes (test_forward_group_sizes crosses the group sizes with the rest).
GROUP_ROTATION = (128, 32, ref.GROUP_ROW, 64)
ROUTING_ROTATION = (("fp32", True), ("ids", False), ("bf16", False), ("fp16", True),
                    ("ids", False), ("fp32", False))
SOURCE_ROTATION = ("normal", "codes", "codes")


def forward_cases():
    for i, shape in enumerate(SHAPES):
        if not moe_small_enough(shape):
            continue
        group = GROUP_ROTATION[i % len(GROUP_ROTATION)]
        routing, renormalize = ROUTING_ROTATION[i % len(ROUTING_ROTATION)]
        source = SOURCE_ROTATION[i % len(SOURCE_ROTATION)]
        for dtype in ref.MOE_DTYPES:
            for mode in ref.INT4_MODES:
                yield pytest.param(dtype, mode, shape, group, routing, renormalize, source,
                                   id=f"{dtype}-{mode}-{moe_id(shape)}-{GROUP_IDS[group]}-"
                                      f"route_{routing}{'-renorm' if renormalize else ''}-"
                                      f"{source}")


@pytest.mark.parametrize("dtype, mode, shape, group_size, routing, renormalize, source",
                         list(forward_cases()))
def test_forward(dtype, mode, shape, group_size, routing, renormalize, source, sm80, seed):
    rng = np.random.default_rng(seed)
    call = MoECall(rng, shape, dtype, mode, group_size, routing, renormalize, source)
    call.launch()
    call.check(f"seed={seed}")


# H = 160 and I = 96: partial last groups of 64 and 128.
GROUP_SHAPES = [(9, 160, 96, 4, 2), (40, 256, 128, 8, 2)]


@pytest.mark.parametrize("shape", GROUP_SHAPES, ids=moe_id)
@pytest.mark.parametrize("group_size", ref.INT4_GROUP_SIZES, ids=lambda g: GROUP_IDS[g])
@pytest.mark.parametrize("mode", ref.INT4_MODES)
@pytest.mark.parametrize("dtype", ref.MOE_DTYPES)
def test_forward_group_sizes(dtype, mode, group_size, shape, sm80, seed):
    rng = np.random.default_rng(seed)
    call = MoECall(rng, shape, dtype, mode, group_size, "ids", source="codes")
    call.launch()
    call.check(f"seed={seed}")


LARGE = [(64, 1024, 704, 16, 4), (8, 2048, 1408, 8, 6)]


@pytest.mark.parametrize("shape", [s for s in LARGE if moe_small_enough(s)], ids=moe_id)
@pytest.mark.parametrize("dtype", ref.MOE_DTYPES)
def test_forward_large(dtype, shape, sm80, seed):
    """Wider layers (the many-small-experts model's H and I, fewer experts: the reference
    dequantizes every expert), routed by the layer."""
    rng = np.random.default_rng(seed)
    call = MoECall(rng, shape, dtype, "sym", 128, "fp32", renormalize=True, source="codes")
    call.launch()
    call.check(f"seed={seed}")


# Every expert kernel forced, on shapes that all of them serve (more than 64 rows per expert:
# stream serves any, tc more than 16, wgmma more than 64): H = 160 and I = 96 (partial 128-k
# chunks, a partial last tile of columns in both GEMMs; 150 rows per expert, wgmma's 256-row
# blocks), one expert, 64 experts with 104 rows each on average, some experts idle, 300 rows
# per expert with a down GEMM of three 128-k chunks.
EACH_KERNEL_SHAPES = [(300, 384, 384, 8, 2), (128, 128, 256, 1, 1), (200, 160, 96, 4, 3),
                      (1100, 128, 128, 64, 6), (600, 128, 384, 4, 2)]
MOE_KERNELS = ("stream", "tc", "wgmma")


@pytest.mark.parametrize("variant", MOE_KERNELS)
@pytest.mark.parametrize("shape", [s for s in EACH_KERNEL_SHAPES if moe_small_enough(s)],
                         ids=moe_id)
def test_forward_each_kernel(shape, variant, monkeypatch, sm80, seed):
    """Within the reference's bound, with a tenth of the caller's ids outside [0, E) and the
    first expert idle; the same bits again on a workspace of random bytes."""
    force_variant(monkeypatch, MOE_KERNEL_ENV, variant)
    i = EACH_KERNEL_SHAPES.index(shape)
    dtype, mode = ref.MOE_DTYPES[i % 2], ref.INT4_MODES[i // 2 % 2]
    group = GROUP_ROTATION[i % len(GROUP_ROTATION)]
    rng = np.random.default_rng(seed)
    tokens, _, _, experts, top_k = shape
    ids, _ = random_ids(rng, tokens, experts, top_k)
    if experts > top_k:
        ids = np.where(ids == 0, experts - 1, ids).astype(np.int32)  # a repeated id is a pair too
    bad = rng.random(ids.shape) < 0.1
    ids = np.where(bad, rng.choice(np.array(BAD_IDS + (experts,), np.int64), size=ids.shape),
                   ids).astype(np.int32)
    call = MoECall(rng, shape, dtype, mode, group, "ids", ids=ids)
    ctx = f"{variant}, {dtype}-{mode}-{GROUP_IDS[group]}, seed={seed}"
    call.launch()
    first = call.check(ctx).copy()
    call.poison_outputs()
    call.scramble_workspace(rng)
    call.launch()
    synchronize()
    assert_bitwise_equal(call.out.read(f"second run, {ctx}"), first, f"second run, {ctx}")


@pytest.mark.parametrize("router_dtype", ref.MOE_ROUTER_DTYPES)
@pytest.mark.parametrize("renormalize", [False, True], ids=["raw", "renormalized"])
@pytest.mark.parametrize("shape", [(3, 128, 128, 8, 2), (200, 256, 128, 16, 6)], ids=moe_id)
def test_router_logits_give_the_bits_of_the_routed_ids(shape, renormalize, router_dtype, sm80,
                                                       seed):
    """The layer routing its logits and the layer given ck_moe_route's ids and weights of the
    same logits write the same bits (the header's route is ck_moe_route)."""
    rng = np.random.default_rng(seed)
    call = MoECall(rng, shape, "bf16", "asym", 64, router_dtype, renormalize)
    call.launch()
    routed_out = call.check(f"logits, seed={seed}").copy()
    tokens, _, _, experts, top_k = shape
    ids = GuardedBuffer.output((tokens, top_k), np.int32, POISON)
    weights = GuardedBuffer.output((tokens, top_k), np.float32, POISON)
    ck.raw.moe_route(call.logits.ptr, CK_DTYPE[router_dtype], tokens, experts, top_k,
                     int(renormalize), ids.ptr, weights.ptr)
    synchronize()
    assert_route(ids.read("ids"), weights.read("weights"), call.route_host, top_k, renormalize,
                 router_dtype, f"seed={seed}")
    call.poison_outputs()
    ck.raw.moe_forward(call.params(router_logits=0, router_dtype=0, topk_ids=ids.ptr,
                                   topk_weights=weights.ptr),
                       call.workspace.ptr, call.workspace_bytes)
    synchronize()
    assert_bitwise_equal(call.out.read("out"), routed_out,
                         f"given ck_moe_route's ids vs routed, seed={seed}")


@pytest.mark.parametrize("routing", ["ids", "fp32"])
@pytest.mark.parametrize("shape", [(5, 256, 128, 8, 2), (300, 128, 256, 4, 2)], ids=moe_id)
def test_forward_is_deterministic(shape, routing, sm80, seed):
    """The same bits on every run, whatever the workspace held (random bytes each time), and
    on every replay of a captured graph."""
    rng = np.random.default_rng(seed)
    call = MoECall(rng, shape, "fp16", "sym", 128, routing, renormalize=True)
    call.launch()
    first = call.check(f"seed={seed}").copy()
    for run in range(3):
        call.poison_outputs()
        call.scramble_workspace(rng)
        call.launch()
        synchronize()
        assert_bitwise_equal(call.out.read(f"run {run}"), first, f"run {run}, seed={seed}")
    stream = ck.cuda.stream_create()
    try:
        with ck.cuda.graph_capture(stream) as graph:
            call.launch(stream)
        try:
            for replay in range(2):
                call.poison_outputs()
                call.scramble_workspace(rng)
                graph.launch(stream)
                ck.cuda.stream_synchronize(stream)
                assert_bitwise_equal(call.out.read(f"replay {replay}"), first,
                                     f"graph replay {replay}, seed={seed}")
        finally:
            graph.close()
    finally:
        ck.cuda.stream_destroy(stream)


@pytest.mark.parametrize("routing", ["ids", "bf16"])
@pytest.mark.parametrize("dtype", ref.MOE_DTYPES)
def test_forward_graph_replay(dtype, routing, sm80, seed):
    """Capture records the launches without running them; each replay reads the new contents
    of the same buffers (x, routing, weights) and writes the whole output."""
    rng = np.random.default_rng(seed)
    call = MoECall(rng, (40, 128, 128, 8, 2), dtype, "asym", 32, routing)
    assert_graph_replays(call, rng, seed)


BAD_IDS = (-1, -7, -2**31, 2**31 - 1)   # and E, E + 3: set per call


@pytest.mark.parametrize("shape", [(9, 128, 128, 8, 3), (130, 256, 128, 4, 2)], ids=moe_id)
@pytest.mark.parametrize("dtype", ref.MOE_DTYPES)
def test_forward_out_of_range_ids_contribute_nothing(dtype, shape, sm80, seed):
    """Ids outside [0, E) among the caller's (negative, E and beyond, the int32 extremes), a
    token with no valid pair (its output: 0): no fault, those pairs add nothing, and nothing is
    written out of bounds (guards after out and after the workspace)."""
    rng = np.random.default_rng(seed)
    tokens, _, _, experts, top_k = shape
    ids, _ = random_ids(rng, tokens, experts, top_k)
    bad = rng.random(ids.shape) < 0.3
    bad[0], bad[1] = True, False
    bad_values = np.array(BAD_IDS + (experts, experts + 3), np.int64)
    ids = np.where(bad, rng.choice(bad_values, size=ids.shape), ids).astype(np.int32)
    call = MoECall(rng, shape, dtype, "asym", 64, "ids", ids=ids)
    call.launch()
    out = call.check(f"seed={seed}")
    assert (ref.to_f32(out[0], dtype) == 0).all(), "a token without a valid pair gets 0"


@pytest.mark.parametrize("shape", [(3, 128, 128, 8, 2), (300, 128, 256, 64, 6),
                                   (128, 256, 128, 1, 1)], ids=moe_id)
def test_forward_all_pairs_on_one_expert(shape, sm80, seed):
    """Every pair names the same expert (a token's k pairs too: duplicate ids are pairs like
    any other); the other experts get nothing."""
    rng = np.random.default_rng(seed)
    tokens, _, _, experts, top_k = shape
    ids = np.full((tokens, top_k), rng.integers(experts), np.int32)
    call = MoECall(rng, shape, "fp16", "sym", 32, "ids", ids=ids)
    call.launch()
    call.check(f"expert {ids[0, 0]}, seed={seed}")


@pytest.mark.parametrize("shape", [(1, 128, 128, 64, 1), (64, 128, 128, 64, 2),
                                   (300, 256, 128, 64, 2)], ids=moe_id)
def test_forward_experts_without_tokens(shape, sm80, seed):
    """All pairs on two experts of 64 (the first and last experts idle or not, at random)."""
    rng = np.random.default_rng(seed)
    tokens, _, _, experts, top_k = shape
    used = rng.choice(experts, size=2, replace=False)
    ids = np.empty((tokens, top_k), np.int32)
    ids[:, 0] = rng.choice(used, size=tokens)
    if top_k > 1:
        ids[:, 1] = np.where(ids[:, 0] == used[0], used[1], used[0])
    call = MoECall(rng, shape, "bf16", "asym", 128, "ids", ids=ids)
    call.launch()
    call.check(f"experts {used}, seed={seed}")


def test_forward_refuses_a_workspace_below_the_query(sm80, seed):
    """workspace_bytes one short of ck_moe_workspace_size: CK_STATUS_INVALID_VALUE on the host,
    nothing written."""
    rng = np.random.default_rng(seed)
    call = MoECall(rng, (7, 128, 128, 8, 2), "fp16", "sym", 128, "fp32")
    assert call.workspace_bytes > 0
    with pytest.raises(ck.CKError) as info:
        call.launch(workspace_bytes=call.workspace_bytes - 1)
    assert info.value.status == ck.Status.INVALID_VALUE, info.value.message
    assert "workspace_bytes" in info.value.message
    synchronize()
    call.assert_outputs_untouched("a refused call")


@pytest.mark.parametrize("routing", ["ids", "fp16", "fp32"])
@pytest.mark.parametrize("dtype", ref.MOE_DTYPES)
def test_forward_element_aligned_pointers(dtype, routing, sm80, seed):
    """x, out and the prepacked weights 16-byte aligned (not 256), the logits, ids and weights
    aligned to their element only: the least the header asks."""
    rng = np.random.default_rng(seed)
    call = MoECall(rng, (17, 128, 256, 8, 2), dtype, "asym", 32, routing, misalign=True)
    call.launch()
    call.check(f"seed={seed}")


def test_forward_on_a_non_blocking_stream(sm80, seed):
    rng = np.random.default_rng(seed)
    call = MoECall(rng, (33, 128, 128, 8, 2), "bf16", "sym", 64, "fp32")
    stream = ck.cuda.stream_create(non_blocking=True)
    try:
        call.launch(stream)
        ck.cuda.stream_synchronize(stream)
        call.check(f"seed={seed}")
    finally:
        ck.cuda.stream_destroy(stream)


# ---------------------------------------------------------------------------------------------
# The wrapper: NumPy in -> NumPy out, CUDA arrays in -> DeviceArray out; the raw calls' bits
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ref.MOE_ROUTER_DTYPES)
def test_wrapper_moe_route(dtype, seed):
    rng = np.random.default_rng(seed)
    logits = grid_logits(rng, 11, 64, dtype)
    call = RouteCall(logits, 6, True, dtype)
    call.launch()
    want_ids, want_weights = call.check(f"raw, seed={seed}")
    ids, weights = ck.moe_route(logits, 6, renormalize=True, dtype=dtype_arg(dtype))
    assert isinstance(ids, np.ndarray) and ids.shape == (11, 6)
    assert_bitwise_equal(ids, want_ids, f"numpy ids, seed={seed}")
    assert_bitwise_equal(weights, want_weights, f"numpy weights, seed={seed}")
    ld = ck.DeviceArray.from_numpy(logits, ck_dtype=CK_DTYPE[dtype])
    ids_d, weights_d = ck.moe_route(ld, 6, renormalize=True)
    assert isinstance(ids_d, ck.DeviceArray) and isinstance(weights_d, ck.DeviceArray)
    assert_bitwise_equal(ids_d.to_numpy(), want_ids, f"device ids, seed={seed}")
    assert_bitwise_equal(weights_d.to_numpy(), want_weights, f"device weights, seed={seed}")
    row_ids, row_weights = ck.moe_route(logits[3], 6, renormalize=True, dtype=dtype_arg(dtype))
    assert row_ids.shape == row_weights.shape == (6,)
    assert_route(row_ids[None], row_weights[None], logits[3:4], 6, True, dtype,
                 f"1-D logits, seed={seed}")


@pytest.mark.parametrize("mode", ref.INT4_MODES)
@pytest.mark.parametrize("dtype", ref.MOE_DTYPES)
def test_wrapper_moe_prepack(dtype, mode, seed):
    rng = np.random.default_rng(seed)
    host = random_experts(rng, 3, 64, 160, dtype, mode, 64, "codes")
    for gate_up in (False, True):
        want = ref.moe_prepack(*host, 160, 64, gate_up)
        got = ck.moe_prepack(*host, group_size=64, gate_up=gate_up, dtype=dtype_arg(dtype))
        assert (got[2] is None) == (mode == "sym")
        for name, a, b in zip(("w", "scales", "zeros"), got, want):
            if b is not None:
                assert_bitwise_equal(a, b, f"numpy {name}, gate_up={gate_up}, seed={seed}")
        device = [None if a is None else ck.DeviceArray.from_numpy(
            a, ck_dtype=CK_DTYPE[dtype] if a.dtype == ref.NUMPY_DTYPE[dtype] else None)
            for a in host]
        got_d = ck.moe_prepack(*device, group_size=64, gate_up=gate_up)
        assert isinstance(got_d[0], ck.DeviceArray)
        for name, a, b in zip(("w", "scales", "zeros"), got_d, want):
            if b is not None:
                assert_bitwise_equal(a.to_numpy(), b, f"device {name}, seed={seed}")


def wrapper_weights(call):
    """The call's prepacked weights as the wrapper's triples (NumPy copies)."""
    return [tuple(None if b is None else b.read(name) for b, name in
                  zip((w.w, w.scales, w.zeros), ("w", "scales", "zeros")))
            for w in (call.w13, call.w2)]


@pytest.mark.parametrize("routing", ["ids", "fp32", "bf16"])
@pytest.mark.parametrize("dtype", ref.MOE_DTYPES)
def test_wrapper_moe_forward(dtype, routing, sm80, seed):
    """ck.moe_forward on NumPy arrays, on DeviceArrays and with a given workspace: the raw
    call's bits."""
    rng = np.random.default_rng(seed)
    shape = (21, 128, 256, 8, 2)
    tokens, hidden, inter, experts, top_k = shape
    call = MoECall(rng, shape, dtype, "asym", 64, routing, renormalize=True)
    call.launch()
    want = call.check(f"raw, seed={seed}")
    w13, w2 = wrapper_weights(call)
    if routing == "ids":
        route = dict(topk_ids=call.route_host[0], topk_weights=call.route_host[1])
    else:
        route = dict(router_logits=call.route_host, top_k=top_k, renormalize=True,
                     router_dtype=dtype_arg(routing))
    got = ck.moe_forward(call.x_host, w13, w2, experts, inter, group_size=64,
                         dtype=dtype_arg(dtype), **route)
    assert isinstance(got, np.ndarray) and got.shape == (tokens, hidden)
    assert_bitwise_equal(got, want, f"numpy, seed={seed}")

    ck_dtype = CK_DTYPE[dtype]
    xd = ck.DeviceArray.from_numpy(call.x_host, ck_dtype=ck_dtype)
    w13d, w2d = ([None if a is None else ck.DeviceArray.from_numpy(
        a, ck_dtype=ck_dtype if i == 1 else None) for i, a in enumerate(w)] for w in (w13, w2))
    route_d = {key: ck.DeviceArray.from_numpy(value, ck_dtype=CK_DTYPE.get(
        routing) if key == "router_logits" else None) if isinstance(value, np.ndarray) else value
        for key, value in route.items() if key != "router_dtype"}
    got_d = ck.moe_forward(xd, w13d, w2d, experts, inter, group_size=64, **route_d)
    assert isinstance(got_d, ck.DeviceArray) and got_d.ck_dtype == ck_dtype
    assert_bitwise_equal(got_d.to_numpy(), want, f"device, seed={seed}")
    workspace = ck.DeviceArray.empty((ck.moe_workspace_size(tokens, hidden, inter, experts,
                                                            top_k, dtype, 64),), np.uint8)
    out = ck.DeviceArray.empty((tokens, hidden), call.x_host.dtype, ck_dtype).fill_byte(POISON)
    assert ck.moe_forward(xd, w13d, w2d, experts, inter, group_size=64, workspace=workspace,
                          out=out, **route_d) is out
    assert_bitwise_equal(out.to_numpy(), want, f"device, given workspace, seed={seed}")
    with pytest.raises(ValueError):   # one routing only
        ck.moe_forward(xd, w13d, w2d, experts, inter, group_size=64,
                       router_logits=np.zeros((tokens, experts), np.float32), top_k=top_k,
                       topk_ids=np.zeros((tokens, top_k), np.int32),
                       topk_weights=np.zeros((tokens, top_k), np.float32))


@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("dtype", ref.MOE_DTYPES)
def test_quantized_moe_from_float(dtype, symmetric, sm80, seed):
    """QuantizedMoE.from_float quantizes each expert on the device (bit for bit
    ref.moe_quantize) and its call is the raw layer's on those weights, routed by logits or by
    the caller's ids, on NumPy and on device arrays."""
    rng = np.random.default_rng(seed)
    tokens, hidden, inter, experts, top_k = 13, 256, 128, 8, 2
    mode = "sym" if symmetric else "asym"
    w13 = random_normal(rng, (experts, 2 * inter, hidden), dtype, scale=hidden**-0.5)
    w2 = random_normal(rng, (experts, hidden, inter), dtype, scale=inter**-0.5)
    layer = ck.QuantizedMoE.from_float(w13, w2, group_size=64, symmetric=symmetric,
                                       dtype=dtype_arg(dtype), top_k=top_k, renormalize=True)
    assert (layer.experts, layer.hidden, layer.intermediate) == (experts, hidden, inter)
    for got, want in ((layer.w13, ref.moe_quantize(w13, dtype, 64, mode)),
                      (layer.w2, ref.moe_quantize(w2, dtype, 64, mode))):
        for name, a, b in zip(("packed", "scales", "zeros"), got, want):
            assert (a is None) == (b is None), name
            if b is not None:
                assert_bitwise_equal(a.to_numpy(), b, f"quantized {name}, seed={seed}")

    call = MoECall(rng, (tokens, hidden, inter, experts, top_k), dtype, mode, 64, "fp32",
                   renormalize=True)
    call.use_weights(*(tuple(None if a is None else a.to_numpy() for a in w)
                       for w in (layer.w13, layer.w2)))
    call.launch()
    want = call.check(f"raw, seed={seed}")
    got = layer(call.x_host, router_logits=call.route_host)
    assert isinstance(got, np.ndarray) and got.shape == (tokens, hidden)
    assert_bitwise_equal(got, want, f"QuantizedMoE, seed={seed}")
    xd = ck.DeviceArray.from_numpy(call.x_host, ck_dtype=CK_DTYPE[dtype])
    got_d = layer(xd, router_logits=ck.DeviceArray.from_numpy(call.route_host))
    assert isinstance(got_d, ck.DeviceArray)
    assert_bitwise_equal(got_d.to_numpy(), want, f"QuantizedMoE on device, seed={seed}")
    ids, weights = ck.moe_route(call.route_host, top_k, renormalize=True)
    got_ids = layer(call.x_host, topk_ids=ids, topk_weights=weights)
    assert_bitwise_equal(got_ids, want, f"QuantizedMoE with ck.moe_route's ids, seed={seed}")
    row = layer(call.x_host[4], router_logits=call.route_host[4])   # one token: [hidden]
    assert row.shape == (hidden,)
    value, error = call.expected()
    assert_meets_reference(ref.to_f32(row, dtype).astype(np.float64), value[4], error[4], dtype,
                           f"1-D x, seed={seed}")


# ---------------------------------------------------------------------------------------------
# QuantizedMoE from GPTQ / AWQ checkpoints
# ---------------------------------------------------------------------------------------------
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
MIXTRAL_NAMES = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


def projection_kn(hidden, inter):
    """(K, N) of each projection of an expert: nn.Linear(K -> N)."""
    return {"gate_proj": (hidden, inter), "up_proj": (hidden, inter),
            "down_proj": (inter, hidden)}


def random_projection(rng, fmt, k, n, group_size, dtype, variant="none"):
    """One projection's checkpoint tensors {qweight, qzeros, scales[, g_idx]} (NumPy), built by
    checkpoint_formats. GPTQ variants: 'none', 'trivial', 'act_order' (the g_idx kinds of
    cf.random_gptq_checkpoint; random zero points 1 .. 16) and 'sym' (zero point 8 everywhere,
    stored as 7: what GPTQ writes for a symmetric checkpoint). AWQ: random zero points."""
    if fmt == "awq":
        qweight, qzeros, scales = cf.random_awq_checkpoint(rng, k, n, group_size, dtype)
        return dict(qweight=qweight, qzeros=qzeros, scales=scales)
    if variant == "sym":
        groups = ref.int4_groups_per_row(k, group_size)
        qweight, qzeros, scales, _ = cf.gptq_pack(
            cf.random_nibbles(rng, (k, n)), np.full((groups, n), 8),
            cf.random_scales(rng, groups, n, k, dtype), group_size=group_size)
        assert (qzeros.view(np.uint32) == 0x77777777).all()
        g_idx = None
    else:
        qweight, qzeros, scales, g_idx = cf.random_gptq_checkpoint(rng, k, n, group_size, dtype,
                                                                   variant)
    tensors = dict(qweight=qweight, qzeros=qzeros, scales=scales)
    if g_idx is not None:
        tensors["g_idx"] = g_idx
    return tensors


def random_moe_checkpoint(rng, fmt, experts, hidden, inter, group_size, dtype, variant="none"):
    """E experts' checkpoint tensors in from_gptq / from_awq's convention: a list of
    {projection: tensors}, gate_proj and up_proj [I, H] weights, down_proj [H, I]. The scales
    (cf.random_scales) keep each projection's outputs ~ N(0, 1) for N(0, 1) inputs."""
    kn = projection_kn(hidden, inter)
    return [{name: random_projection(rng, fmt, *kn[name], group_size, dtype, variant)
             for name in PROJECTIONS} for _ in range(experts)]


def projection_interchange(fmt, tensors, group_size):
    """(w_packed [N, K / 2], scales [N, groups], zeros [N, groups]) the importer writes."""
    if fmt == "gptq":
        return cf.library_from_gptq(tensors["qweight"], tensors["qzeros"], tensors["scales"],
                                    tensors.get("g_idx"), group_size)[:3]
    return cf.library_from_awq(tensors["qweight"], tensors["qzeros"], tensors["scales"],
                               group_size)


def moe_interchange(fmt, checkpoint, group_size):
    """The (w13, w2) interchange triples of the layer: each projection imported, w13 [E, 2I, ..]
    with each expert's gate rows, then its up rows; w2 [E, H, ..]."""
    per_expert = [[projection_interchange(fmt, expert[name], group_size) for name in PROJECTIONS]
                  for expert in checkpoint]
    w13 = tuple(np.stack([np.concatenate([gate[i], up[i]]) for gate, up, _ in per_expert])
                for i in range(3))
    w2 = tuple(np.stack([down[i] for _, _, down in per_expert]) for i in range(3))
    return w13, w2


def moe_checkpoint_weights(fmt, checkpoint, group_size, dtype):
    """The checkpoint's own dequantization (cf.gptq_unpack / cf.awq_unpack of each projection,
    [K, N], transposed to nn.Linear's [N, K]) in the layer's layout: w13 [E, 2I, H], w2
    [E, H, I], in dtype's representation."""
    def weight(tensors):
        if fmt == "gptq":
            k = 8 * tensors["qweight"].shape[0]
            g_idx = tensors.get("g_idx")
            g_idx = cf.gptq_groups_g_idx(k, group_size) if g_idx is None else g_idx
            w = cf.gptq_unpack(tensors["qweight"], tensors["qzeros"], tensors["scales"], g_idx,
                               dtype)
        else:
            w = cf.awq_unpack(tensors["qweight"], tensors["qzeros"], tensors["scales"],
                              group_size, dtype)
        return w.T
    w13 = np.stack([np.concatenate([weight(e["gate_proj"]), weight(e["up_proj"])])
                    for e in checkpoint])
    w2 = np.stack([weight(e["down_proj"]) for e in checkpoint])
    return w13, w2


def checkpoint_argument(checkpoint, convention, dtype):
    """(experts, dtype=) of the checkpoint in one of from_gptq / from_awq's conventions:
    'dicts' (NumPy, Hugging Face's projection names), 'mixtral' (NumPy, w1 / w3 / w2),
    'tuples' ((gate, up, down) of (qweight, qzeros, scales[, g_idx])), 'device' (dicts of
    DeviceArrays: the scales carry their dtype, g_idx is read back from the device)."""
    host_dtype = dtype_arg(dtype)
    if convention == "dicts":
        return checkpoint, host_dtype
    if convention == "mixtral":
        return [{MIXTRAL_NAMES[name]: tensors for name, tensors in expert.items()}
                for expert in checkpoint], host_dtype
    if convention == "tuples":
        order = ("qweight", "qzeros", "scales", "g_idx")
        return [tuple(tuple(expert[name][key] for key in order if key in expert[name])
                      for name in PROJECTIONS) for expert in checkpoint], host_dtype
    assert convention == "device"
    return [{name: {key: to_device(a, dtype if key == "scales" else None)
                    for key, a in tensors.items()} for name, tensors in expert.items()}
            for expert in checkpoint], None


def from_checkpoint(fmt):
    return ck.QuantizedMoE.from_gptq if fmt == "gptq" else ck.QuantizedMoE.from_awq


# (format, variant, group size, calling convention): every variant, group size and convention
# once, GPTQ's zero points 1 .. 16 (16: one past ck_quantize_int4's range) and 8 (symmetric).
CHECKPOINT_CASES = [
    ("gptq", "none", 128, "dicts"), ("gptq", "trivial", 32, "device"),
    ("gptq", "sym", 64, "tuples"), ("gptq", "trivial", ref.GROUP_ROW, "mixtral"),
    ("awq", "none", 128, "device"), ("awq", "none", 64, "mixtral"),
    ("awq", "none", 32, "tuples"),
]


@pytest.mark.parametrize("fmt, variant, group_size, convention", [
    pytest.param(*case, id=f"{case[0]}-{case[1]}-{GROUP_IDS[case[2]]}-{case[3]}")
    for case in CHECKPOINT_CASES])
@pytest.mark.parametrize("dtype", ref.MOE_DTYPES)
def test_quantized_moe_from_checkpoint(dtype, fmt, variant, group_size, convention, sm80, seed):
    """QuantizedMoE.from_gptq / from_awq hold, bit for bit, each expert's import
    (cf.library_from_gptq / _awq) stacked with the gate rows before the up rows, which
    dequantizes to the checkpoint's own weights; the layer (asymmetric, in the scales' dtype)
    gives the bits of the raw layer on those weights, itself within the float64 reference's
    bound, and of a QuantizedMoE built from the same interchange tensors."""
    rng = np.random.default_rng(seed)
    tokens, hidden, inter, experts, top_k = 13, 256, 128, 8, 2
    ctx = f"{fmt}-{variant}-{GROUP_IDS[group_size]}-{convention}, seed={seed}"
    checkpoint = random_moe_checkpoint(rng, fmt, experts, hidden, inter, group_size, dtype,
                                       variant)
    w13, w2 = moe_interchange(fmt, checkpoint, group_size)
    want13, want2 = moe_checkpoint_weights(fmt, checkpoint, group_size, dtype)
    assert_bitwise_equal(ref.moe_dequantize(*w13, hidden, group_size, dtype), want13,
                         f"w13 vs the checkpoint's weights, {ctx}")
    assert_bitwise_equal(ref.moe_dequantize(*w2, inter, group_size, dtype), want2,
                         f"w2 vs the checkpoint's weights, {ctx}")
    if variant == "sym":
        assert (w13[2] == 8).all() and (w2[2] == 8).all()

    arg, dtype_kw = checkpoint_argument(checkpoint, convention, dtype)
    layer = from_checkpoint(fmt)(arg, group_size=group_size, dtype=dtype_kw, top_k=top_k,
                                 renormalize=True)
    assert (layer.experts, layer.hidden, layer.intermediate) == (experts, hidden, inter)
    assert layer.dtype == CK_DTYPE[dtype] and layer.group_size == group_size
    assert "asymmetric" in repr(layer), repr(layer)
    for name, got, want in (("w13", layer.w13, w13), ("w2", layer.w2, w2)):
        for part, a, b in zip(("packed", "scales", "zeros"), got, want):
            assert isinstance(a, ck.DeviceArray), f"{name} {part}"
            assert_bitwise_equal(a.to_numpy(), b, f"{name} {part}, {ctx}")

    call = MoECall(rng, (tokens, hidden, inter, experts, top_k), dtype, "asym", group_size,
                   "fp32", renormalize=True)
    call.use_weights(w13, w2)
    call.launch()
    want = call.check(f"raw, {ctx}")
    assert_bitwise_equal(layer(call.x_host, router_logits=call.route_host), want,
                         f"from_{fmt}, {ctx}")
    device = [[to_device(a, dtype if i == 1 else None) for i, a in enumerate(w)]
              for w in (w13, w2)]
    twin = ck.QuantizedMoE(*device[0], *device[1], group_size, CK_DTYPE[dtype], top_k=top_k,
                           renormalize=True)
    assert_bitwise_equal(twin(call.x_host, router_logits=call.route_host), want,
                         f"QuantizedMoE of the interchange tensors, {ctx}")


@pytest.mark.parametrize("on_device", [False, True], ids=["numpy", "device"])
@pytest.mark.parametrize("projection", PROJECTIONS)
def test_quantized_moe_from_gptq_refuses_act_order(projection, on_device, seed):
    """An act-order g_idx on one projection of one expert: ValueError naming it (the fused
    layer cannot permute one expert's input), whether g_idx is NumPy or on the device; the
    trivial g_idx of the other experts is accepted (the check passes them)."""
    rng = np.random.default_rng(seed)
    hidden, inter, experts, group_size = 128, 96, 4, 32
    checkpoint = random_moe_checkpoint(rng, "gptq", experts, hidden, inter, group_size, "fp16",
                                       "trivial")
    e = int(rng.integers(experts))
    k, n = projection_kn(hidden, inter)[projection]
    checkpoint[e][projection] = random_projection(rng, "gptq", k, n, group_size, "fp16",
                                                  "act_order")
    assert not np.array_equal(checkpoint[e][projection]["g_idx"],
                              cf.gptq_groups_g_idx(k, group_size))
    if on_device:
        checkpoint, _ = checkpoint_argument(checkpoint, "device", "fp16")
    with pytest.raises(ValueError, match="act-order") as info:
        ck.QuantizedMoE.from_gptq(checkpoint, group_size=group_size)
    assert f"expert {e} {projection}" in str(info.value), f"{info.value}, seed={seed}"


def test_quantized_moe_from_gptq_refuses_a_g_idx_of_another_group_size(seed):
    """A g_idx of consecutive groups of 64 rows with group_size=32: ValueError (not taken for
    act-order, and not imported with the wrong groups)."""
    rng = np.random.default_rng(seed)
    checkpoint = random_moe_checkpoint(rng, "gptq", 2, 128, 64, 64, "fp16", "trivial")
    with pytest.raises(ValueError, match="group_size"):
        ck.QuantizedMoE.from_gptq(checkpoint, group_size=32)


# How an expert is made to disagree with expert 0 (H = 128, I = 96): another I in its up_proj,
# another H out of (or I into) its down_proj, all of its projections of another H, its up_proj
# and down_proj swapped.
MISMATCHES = ("up_proj_i", "down_proj_h", "down_proj_i", "expert_h", "swapped")


@pytest.mark.parametrize("mismatch", MISMATCHES)
@pytest.mark.parametrize("fmt", ["gptq", "awq"])
def test_quantized_moe_from_checkpoint_refuses_mismatched_experts(fmt, mismatch, seed):
    """Experts whose shapes disagree: ValueError naming the expert and projection."""
    rng = np.random.default_rng(seed)
    hidden, inter, experts, group_size = 128, 96, 4, 32
    checkpoint = random_moe_checkpoint(rng, fmt, experts, hidden, inter, group_size, "fp16")
    e = int(rng.integers(1, experts))
    expert = checkpoint[e]
    if mismatch == "up_proj_i":
        expert["up_proj"] = random_projection(rng, fmt, hidden, inter + 32, group_size, "fp16")
    elif mismatch == "down_proj_h":
        expert["down_proj"] = random_projection(rng, fmt, inter, hidden + 32, group_size, "fp16")
    elif mismatch == "down_proj_i":
        expert["down_proj"] = random_projection(rng, fmt, inter + 32, hidden, group_size, "fp16")
    elif mismatch == "expert_h":
        kn = projection_kn(hidden + 32, inter)
        checkpoint[e] = {name: random_projection(rng, fmt, *kn[name], group_size, "fp16")
                         for name in PROJECTIONS}
    else:
        expert["up_proj"], expert["down_proj"] = expert["down_proj"], expert["up_proj"]
    with pytest.raises(ValueError) as info:
        from_checkpoint(fmt)(checkpoint, group_size=group_size)
    assert f"expert {e} " in str(info.value), f"{info.value}, seed={seed}"


@pytest.mark.parametrize("fmt", ["gptq", "awq"])
def test_quantized_moe_from_checkpoint_refuses_malformed_experts(fmt, seed):
    """No experts, a missing projection or tensor, a tensor the layer would leave out (a bias;
    a g_idx in AWQ), scales of two dtypes: ValueError or TypeError, naming the expert."""
    rng = np.random.default_rng(seed)
    checkpoint = random_moe_checkpoint(rng, fmt, 3, 128, 64, 32, "fp16")
    build = from_checkpoint(fmt)
    with pytest.raises(ValueError, match="empty"):
        build([], group_size=32)

    def changed(e, edit):
        copy = [{name: dict(tensors) for name, tensors in expert.items()}
                for expert in checkpoint]
        edit(copy[e])
        return copy

    e = int(rng.integers(3))
    cases = [
        (ValueError, lambda x: x.pop("down_proj")),
        (ValueError, lambda x: x["gate_proj"].pop("qzeros")),
        (ValueError, lambda x: x["up_proj"].__setitem__("bias", np.ones(64, np.float16))),
        (ValueError, lambda x: x.__setitem__("w1", x["gate_proj"])),   # gate_proj twice
        (TypeError, lambda x: x["down_proj"].__setitem__(
            "scales", x["down_proj"]["scales"].astype(np.float32))),
    ]
    if fmt == "awq":
        cases.append((ValueError, lambda x: x["gate_proj"].__setitem__(
            "g_idx", cf.gptq_groups_g_idx(128, 32))))
    for error, edit in cases:
        with pytest.raises(error) as info:
            build(changed(e, edit), group_size=32)
        assert f"expert {e}" in str(info.value), f"{info.value}, seed={seed}"
