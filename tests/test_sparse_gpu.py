"""GPU tests of the structured-sparse INT4 weights (2:4, 16:32) against tests/reference.py.

- ck_sparse_prune, ck_sparse_quantize_int4, ck_sparse_dequantize_int4 and ck_sparse_w4a16_prepack
  are bit for bit the reference's (sparse24_* / sparse1632_*), on random weights of every float
  dtype with ties, signed zeros and NaN mixed in; every output buffer is poisoned and guarded.
- The quantizer counts the blocks that break the pattern (violations) exactly, and a weight
  that keeps it reports 0.
- ck_gemm_sparse_w4a16 (reference kernel, either pattern) and ck_gemm_sparse_w4a16_prepacked
  (the mma.sp kernels stream and tiles, Hopper's wgmma.sp kernel with each block size and K
  split forced, and the reference kernel; 2:4) meet the float64
  reference on the dequantized weight under the tolerance of float32 accumulation
  (test_w4a16_gpu.py derives it) plus half an ulp of the output: M on both sides of 8 and 16,
  past one block of 16 rows and of 64, N not a multiple of the 16-row tile nor of 128, K from
  one 128-k chunk to several per warp, group 64 / 128, symmetric and asymmetric, fp16 / bf16,
  bias and ReLU; auto's choice past 16 rows.
- ck_sparse_w4a16_prepack_dense (either pattern as a dense INT4 weight) is bit for bit
  ref.sparse_prepack_dense, and ck_gemm_w4a16_prepacked on it (auto, tc, reference) meets the
  same reference on the sparse weight's w'.
- One-hot rows of x pick single weight columns, which the mma.sp GEMM returns exactly: every
  w' bit for bit equal to ck_sparse_dequantize_int4's output.
- CUDA graph capture and replay of the prepacked GEMM; the override refusing a variant that
  cannot serve a call (the layout, M), writing nothing.

The tests skip without a CUDA device. Each test draws a seed, prints it and names it in its
messages; CK_TEST_SEED=<seed> replays it.
"""

import math

import numpy as np
import pytest

import cuda_wrapper as ck
import reference as ref
from gpu_support import (
    CK_ACTIVATION, CK_DTYPE, CK_INT4_MODE, GuardedBuffer, POISON, POISON_QUANTIZED, U32,
    assert_bitwise_equal, assert_capture_records_then_replay_writes, assert_meets_reference,
    assert_relu_output, dot_float32_error, force_variant, ptr_or_null, synchronize,
)

pytestmark = pytest.mark.gpu

KERNEL_ENV = "CK_GEMM_SPARSE_KERNEL"
SPARSITY = {"2:4": ck.SPARSITY_2_4, "16:32": ck.SPARSITY_16_32}
PRUNE = {"2:4": ref.sparse24_prune, "16:32": ref.sparse1632_prune}
QUANTIZE = {"2:4": ref.sparse24_quantize, "16:32": ref.sparse1632_quantize}
DEQUANTIZE = {"2:4": ref.sparse24_dequantize, "16:32": ref.sparse1632_dequantize}
BLOCK = {"2:4": ref.SPARSE24_BLOCK, "16:32": ref.SPARSE1632_BLOCK}
# x, w' fp16/bf16: every product exact in float32; mma.sp may truncate its sums (2u).
TENSOR_CORE_ROUNDOFF = 2 * U32


def awkward_weight(rng, n, k, dtype):
    """Random weights (ref.random_input) with ties, -0.0, exact zeros and a few NaN."""
    w32 = ref.to_f32(ref.random_input(rng, (n, k), dtype, scale=1.0 / math.sqrt(k)), dtype)
    w32 = w32.copy()
    w32[rng.random((n, k)) < 0.05] = 0.0
    w32[rng.random((n, k)) < 0.02] = -0.0
    ties = rng.random((n, k)) < 0.05
    w32[ties] = np.float32(0.03125)
    w32[rng.random((n, k)) < 0.002] = np.nan
    return ref.to_dtype(w32, dtype)


def sparse_weight(rng, sparsity, n, k, dtype):
    """A weight of the pattern (the reference prune of awkward_weight), without NaN."""
    w = awkward_weight(rng, n, k, dtype)
    w32 = ref.to_f32(w, dtype)
    w = ref.to_dtype(np.where(np.isnan(w32), np.float32(0.25), w32), dtype)
    return PRUNE[sparsity](w, dtype)


# ---------------------------------------------------------------------------------------------
# Prune, quantize, dequantize: bit for bit
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sparsity", list(SPARSITY))
@pytest.mark.parametrize("dtype", ref.DTYPES)
@pytest.mark.parametrize("n, k", [(3, 32), (37, 256)])
def test_prune_matches_reference(sparsity, dtype, n, k, seed):
    rng = np.random.default_rng(seed)
    w = awkward_weight(rng, n, k, dtype)
    w_dev = GuardedBuffer.input(w)
    out = GuardedBuffer.output((n, k), w.dtype, POISON)
    ck.raw.sparse_prune(w_dev.ptr, CK_DTYPE[dtype], SPARSITY[sparsity], n, k, out.ptr, 0)
    synchronize()
    assert_bitwise_equal(out.read("out"), PRUNE[sparsity](w, dtype), f"prune, seed={seed}")


class Quantized:
    """ck_sparse_quantize_int4 of w into poisoned, guarded buffers."""

    def __init__(self, w, sparsity, dtype, group_size, mode):
        n, k = w.shape
        self.w = GuardedBuffer.input(w)
        self.codes = GuardedBuffer.output((n, k // 4), np.uint8, POISON_QUANTIZED)
        self.meta = GuardedBuffer.output((n, k // 32), np.uint32, POISON_QUANTIZED)
        groups = k // group_size
        self.scales = GuardedBuffer.output((n, groups), w.dtype, POISON_QUANTIZED)
        self.zeros = (GuardedBuffer.output((n, groups), np.uint8, POISON_QUANTIZED)
                      if mode == "asym" else None)
        self.violations = GuardedBuffer.output((1,), np.int32, POISON_QUANTIZED)
        ck.raw.sparse_quantize_int4(self.w.ptr, CK_DTYPE[dtype], SPARSITY[sparsity], n, k,
                                    group_size, CK_INT4_MODE[mode], self.codes.ptr,
                                    self.meta.ptr, self.scales.ptr, ptr_or_null(self.zeros),
                                    self.violations.ptr, 0)
        synchronize()

    def read(self):
        zeros = None if self.zeros is None else self.zeros.read("zeros")
        return (self.codes.read("codes"), self.meta.read("meta"), self.scales.read("scales"),
                zeros, int(self.violations.read("violations")[0]))


@pytest.mark.parametrize("sparsity", list(SPARSITY))
@pytest.mark.parametrize("dtype", ref.DTYPES)
@pytest.mark.parametrize("group_size", ref.SPARSE_GROUP_SIZES)
@pytest.mark.parametrize("mode", ["sym", "asym"])
def test_quantize_and_dequantize_match_reference(sparsity, dtype, group_size, mode, seed):
    rng = np.random.default_rng(seed)
    n, k = 21, 384
    w = sparse_weight(rng, sparsity, n, k, dtype)
    codes, meta, scales, zeros, violations = Quantized(w, sparsity, dtype, group_size,
                                                       mode).read()
    ctx = f"{sparsity} {dtype} g{group_size} {mode}, seed={seed}"
    want = QUANTIZE[sparsity](w, dtype, group_size, mode)
    assert violations == 0, ctx
    for got, expected, name in zip((codes, meta, scales, zeros), want,
                                   ("codes", "meta", "scales", "zeros")):
        if expected is None:
            assert got is None
            continue
        assert_bitwise_equal(got, expected, f"{name}, {ctx}")

    inputs = [GuardedBuffer.input(a) for a in (codes, meta, scales)]
    z = None if zeros is None else GuardedBuffer.input(zeros)
    out = GuardedBuffer.output((n, k), w.dtype, POISON)
    ck.raw.sparse_dequantize_int4(inputs[0].ptr, inputs[1].ptr, inputs[2].ptr, ptr_or_null(z),
                                  SPARSITY[sparsity], n, k, group_size, CK_INT4_MODE[mode],
                                  out.ptr, CK_DTYPE[dtype], 0)
    synchronize()
    expected = DEQUANTIZE[sparsity](codes, meta, scales, zeros, k, group_size, mode, dtype)
    assert_bitwise_equal(out.read("out"), expected, f"dequantize, {ctx}")


@pytest.mark.parametrize("sparsity", list(SPARSITY))
def test_quantize_counts_violations(sparsity, seed):
    """A dense weight breaks the pattern in (nearly) every block: the count is the reference's
    number of blocks with more than half non-zeros, and the codes are still a valid weight of
    the pattern (the metadata decodes)."""
    rng = np.random.default_rng(seed)
    dtype, n, k = "fp16", 9, 128
    w = awkward_weight(rng, n, k, dtype)
    block = BLOCK[sparsity]
    nonzero = (ref.to_f32(w, dtype) != 0).reshape(n, k // block, block).sum(axis=2)
    want = int((nonzero > block // 2).sum())
    assert want > 0
    _, meta, _, _, violations = Quantized(w, sparsity, dtype, 64, "sym").read()
    assert violations == want, f"seed={seed}"
    if sparsity == "2:4":
        ref.sparse24_unpack_metadata(meta)
    else:
        ref.sparse1632_positions(meta)


# ---------------------------------------------------------------------------------------------
# GEMMs
# ---------------------------------------------------------------------------------------------
class SparseGemm:
    """One sparse GEMM on a weight quantized by the reference (interchange layout), or prepacked
    on the device from it: prepacked True, the 2:4 layout of the sparse tensor cores; "dense",
    either pattern as a dense INT4 weight (ck_sparse_w4a16_prepack_dense) multiplied by
    ck_gemm_w4a16_prepacked."""

    def __init__(self, rng, sparsity, dtype, group_size, mode, m, n, k, bias, activation,
                 prepacked, onehot=False):
        self.ctx = dict(sparsity=sparsity, dtype=dtype, g=group_size, mode=mode, mnk=(m, n, k),
                        bias=bias, act=activation, prepacked=prepacked)
        w = sparse_weight(rng, sparsity, n, k, dtype)
        self.weight = QUANTIZE[sparsity](w, dtype, group_size, mode)
        codes, meta, scales, zeros = self.weight
        self.w_deq = DEQUANTIZE[sparsity](codes, meta, scales, zeros, k, group_size, mode, dtype)
        if onehot:
            x32 = np.zeros((m, k), np.float32)
            x32[np.arange(m), rng.choice(k, m, replace=False)] = 1.0
        else:
            x32 = ref.to_f32(ref.random_input(rng, (m, k), dtype, scale=1.0 / 16), dtype)
        self.x = ref.to_dtype(x32, dtype)
        self.b = (ref.to_dtype(rng.standard_normal(n).astype(np.float32), dtype)
                  if bias else None)
        self.sparsity, self.dtype, self.group_size, self.mode = sparsity, dtype, group_size, mode
        self.activation, self.prepacked, self.mnk = activation, prepacked, (m, n, k)
        self.x_dev = GuardedBuffer.input(self.x)
        self.b_dev = None if self.b is None else GuardedBuffer.input(self.b)
        self.out = GuardedBuffer.output((m, n), self.x.dtype, POISON)
        self.inputs = [GuardedBuffer.input(a) for a in (codes, meta, scales)]
        self.z = None if zeros is None else GuardedBuffer.input(zeros)
        if prepacked:
            dense = prepacked == "dense"
            w_bytes = (ck.raw.w4a16_prepacked_bytes(n, k) if dense
                       else ck.raw.sparse_w4a16_prepacked_bytes(n, k))
            groups = (ck.raw.w4a16_prepacked_groups(n, k, group_size) if dense
                      else ck.raw.sparse_w4a16_prepacked_groups(n, k, group_size))
            assert w_bytes > 0 and groups > 0
            self.w_pre = GuardedBuffer.output((w_bytes,), np.uint8, POISON)
            self.s_pre = GuardedBuffer.output((groups,), self.x.dtype, POISON)
            self.z_pre = (None if zeros is None
                          else GuardedBuffer.output((groups,), np.uint8, POISON))
            weight = (self.inputs[0].ptr, self.inputs[1].ptr, self.inputs[2].ptr,
                      ptr_or_null(self.z))
            outputs = (self.w_pre.ptr, self.s_pre.ptr, ptr_or_null(self.z_pre), 0)
            if dense:
                ck.raw.sparse_w4a16_prepack_dense(*weight, SPARSITY[sparsity], CK_DTYPE[dtype],
                                                  n, k, group_size, CK_INT4_MODE[mode], *outputs)
            else:
                ck.raw.sparse_w4a16_prepack(*weight, CK_DTYPE[dtype], n, k, group_size,
                                            CK_INT4_MODE[mode], *outputs)

    def launch(self, stream=0):
        m, n, k = self.mnk
        common = dict(bias_ptr=ptr_or_null(self.b_dev), activation=CK_ACTIVATION[self.activation],
                      m=m, n=n, k=k, out_ptr=self.out.ptr, stream=stream)
        if self.prepacked == "dense":
            ck.raw.gemm_w4a16_prepacked(
                x_ptr=self.x_dev.ptr, dtype=CK_DTYPE[self.dtype], w_ptr=self.w_pre.ptr,
                scales_ptr=self.s_pre.ptr, zeros_ptr=ptr_or_null(self.z_pre),
                group_size=self.group_size, mode=CK_INT4_MODE[self.mode], **common)
        elif self.prepacked:
            ck.raw.gemm_sparse_w4a16_prepacked(
                x_ptr=self.x_dev.ptr, dtype=CK_DTYPE[self.dtype], w_ptr=self.w_pre.ptr,
                scales_ptr=self.s_pre.ptr, zeros_ptr=ptr_or_null(self.z_pre),
                group_size=self.group_size, mode=CK_INT4_MODE[self.mode], **common)
        else:
            ck.raw.gemm_sparse_w4a16(
                x_ptr=self.x_dev.ptr, dtype=CK_DTYPE[self.dtype],
                sparsity=SPARSITY[self.sparsity], codes_ptr=self.inputs[0].ptr,
                meta_ptr=self.inputs[1].ptr, scales_ptr=self.inputs[2].ptr,
                zeros_ptr=ptr_or_null(self.z), group_size=self.group_size,
                mode=CK_INT4_MODE[self.mode], **common)

    def got(self):
        synchronize()
        return ref.to_f32(self.out.read(f"out, {self.ctx}"), self.dtype).astype(np.float64)

    def check(self, ctx):
        got = self.got()
        value = ref.linear_f64(self.x, self.w_deq, self.b, self.activation, self.dtype)
        pre = ref.linear_f64(self.x, self.w_deq, self.b, "none", self.dtype)
        as64 = lambda a: ref.to_f32(a, self.dtype).astype(np.float64)  # noqa: E731
        error = dot_float32_error(as64(self.x), as64(self.w_deq), pre, TENSOR_CORE_ROUNDOFF)
        assert_meets_reference(got, value, error, self.dtype, f"{self.ctx}, {ctx}")
        if self.activation == "relu":
            assert_relu_output(got, pre, error, f"{self.ctx}, {ctx}")


GEMM_SHAPES = [(1, 16, 128), (5, 40, 256), (8, 136, 512), (16, 48, 1024), (33, 24, 384),
               (70, 272, 256)]


# (variant, prepacked): the mma.sp kernels (stream: M <= 16 and small grids, as every shape
# here; tiles: M > 16), Hopper's wgmma.sp kernel (M > 16), and the reference kernel on both
# layouts.
GEMM_VARIANTS = [("stream", True), ("tiles", True), ("wgmma", True), ("reference", False),
                 ("reference", True)]
TILES_MIN_M = 17   # tiles and wgmma


def gemm_params():
    def name(variant, prepacked):
        return variant + ("-prepacked" if prepacked and variant == "reference" else "")
    return [pytest.param(variant, prepacked, m, n, k, id=f"{name(variant, prepacked)}-{m}x{n}x{k}")
            for variant, prepacked in GEMM_VARIANTS for m, n, k in GEMM_SHAPES + [(200, 136, 256)]
            if variant not in ("tiles", "wgmma") or m >= TILES_MIN_M]


@pytest.mark.parametrize("variant, prepacked, m, n, k", gemm_params())
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("group_size", ref.SPARSE_GROUP_SIZES)
@pytest.mark.parametrize("mode", ["sym", "asym"])
def test_gemm_meets_reference(variant, prepacked, dtype, group_size, mode, m, n, k, seed,
                              monkeypatch):
    rng = np.random.default_rng(seed)
    sparsities = ["2:4"] if prepacked else ["2:4", "16:32"]
    for i, sparsity in enumerate(sparsities):
        bias, act = (i + m) % 2 == 0, "relu" if (i + n) % 3 == 0 else "none"
        force_variant(monkeypatch, KERNEL_ENV, variant)
        call = SparseGemm(rng, sparsity, dtype, group_size, mode, m, n, k, bias, act, prepacked)
        call.launch()
        call.check(f"{variant}, seed={seed}")


@pytest.mark.parametrize("rows", [64, 128, 256])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("mode", ["sym", "asym"])
def test_wgmma_block_rows(rows, dtype, mode, seed, monkeypatch):
    """The wgmma kernel's three block shapes (CK_GEMM_SPARSE_WGMMA_ROWS) on M past one block and
    not a multiple of it, N not a multiple of the 128-row block, K of several chunks."""
    rng = np.random.default_rng(seed)
    force_variant(monkeypatch, KERNEL_ENV, "wgmma")
    monkeypatch.setenv("CK_GEMM_SPARSE_WGMMA_ROWS", str(rows))
    for m, n, k, g in ((rows + 37, 200, 640, 128), (17, 24, 128, 64)):
        call = SparseGemm(rng, "2:4", dtype, g, mode, m, n, k, m % 2 == 1, "relu", True)
        call.launch()
        call.check(f"wgmma rows={rows}, seed={seed}")


# K split over a cluster of 1, 2, 4 or 8 blocks (CK_GEMM_SPARSE_WGMMA_SPLIT), forced, on the
# block rows the call picks (64 up to M = 64) and on 128 and 256: K of 1 chunk (most blocks of
# a split have no chunk at all) to 24, M from 17 to 300 (8-row blocks with no rows of the call
# are skipped), N partial, both modes and dtypes, group 64 / 128. Two launches on the same
# inputs give the same bits (the sum's order is fixed).
WGMMA_SPLIT_SHAPES = [(17, 136, 128), (40, 200, 1024), (64, 128, 3072), (100, 264, 384),
                      (300, 128, 640)]


@pytest.mark.parametrize("shape", WGMMA_SPLIT_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("split", [1, 2, 4, 8])
def test_wgmma_split_k(split, shape, seed, monkeypatch):
    rng = np.random.default_rng(seed)
    force_variant(monkeypatch, KERNEL_ENV, "wgmma")
    monkeypatch.setenv("CK_GEMM_SPARSE_WGMMA_SPLIT", str(split))
    i = WGMMA_SPLIT_SHAPES.index(shape) + split
    if shape[0] > 64:
        monkeypatch.setenv("CK_GEMM_SPARSE_WGMMA_ROWS", str(128 << (i % 2)))
    m, n, k = shape
    dtype, mode, g = ("fp16", "bf16")[i % 2], ("sym", "asym")[i // 2 % 2], (64, 128)[i // 4 % 2]
    call = SparseGemm(rng, "2:4", dtype, g, mode, m, n, k, i % 2 == 0,
                      ("relu", "none")[i // 2 % 2], True)
    call.launch()
    call.check(f"wgmma split {split}, seed={seed}")
    first = call.out.read("out")
    call.out.poison()
    call.launch()
    call.check(f"wgmma split {split}, second launch, seed={seed}")
    assert_bitwise_equal(call.out.read("out"), first,
                         f"wgmma split {split}: two launches, seed={seed}")


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("mode", ["sym", "asym"])
def test_stream_weights_bit_for_bit(dtype, mode, seed):
    """x = one-hot rows: out[i] is w'[:, j_i] exactly (one non-zero product per output)."""
    rng = np.random.default_rng(seed)
    m, n, k = 16, 64, 512
    call = SparseGemm(rng, "2:4", dtype, 128, mode, m, n, k, False, "none", True, onehot=True)
    call.launch()
    got = call.out.read("out")
    cols = np.argmax(ref.to_f32(call.x, dtype), axis=1)
    want = call.w_deq[:, cols].T
    # +0 and -0 products both sum to +0 from the accumulator's +0.
    want32 = ref.to_f32(want, dtype)
    want = ref.to_dtype(np.where(want32 == 0, np.float32(0), want32), dtype)
    assert_bitwise_equal(got, want, f"one-hot rows, seed={seed}")


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("mode", ["sym", "asym"])
@pytest.mark.parametrize("group_size", ref.SPARSE_GROUP_SIZES)
def test_prepack_matches_reference(dtype, mode, group_size, seed):
    """Every byte ck_sparse_w4a16_prepack writes (padding rows included) is
    ref.sparse24_prepack's; N not a multiple of the 16-row tile."""
    rng = np.random.default_rng(seed)
    call = SparseGemm(rng, "2:4", dtype, group_size, mode, 1, 37, 384, False, "none", True)
    synchronize()
    codes, meta, scales, zeros = call.weight
    want = ref.sparse24_prepack(codes, meta, scales, zeros, 384, group_size)
    got = (call.w_pre.read("w_prepacked"), call.s_pre.read("scales_prepacked"),
           None if call.z_pre is None else call.z_pre.read("zeros_prepacked"))
    for g, w, name in zip(got, want, ("w_prepacked", "scales_prepacked", "zeros_prepacked")):
        if w is None:
            assert g is None
            continue
        assert_bitwise_equal(g, w, f"{name}, {dtype} {mode} g{group_size}, seed={seed}")


@pytest.mark.parametrize("sparsity", list(SPARSITY))
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("mode", ["sym", "asym"])
@pytest.mark.parametrize("group_size", ref.SPARSE_GROUP_SIZES)
def test_prepack_dense_matches_reference(sparsity, dtype, mode, group_size, seed):
    """Every byte ck_sparse_w4a16_prepack_dense writes (padding rows and k included) is
    ref.sparse_prepack_dense's; N not a multiple of the 8-row tile, K (320 with group 64) not
    of the 128-k tile."""
    rng = np.random.default_rng(seed)
    k = 320 if group_size == 64 else 384
    call = SparseGemm(rng, sparsity, dtype, group_size, mode, 1, 37, k, False, "none", "dense")
    synchronize()
    codes, meta, scales, zeros = call.weight
    want = ref.sparse_prepack_dense(codes, meta, scales, zeros, sparsity, k, group_size)
    got = (call.w_pre.read("w_prepacked"), call.s_pre.read("scales_prepacked"),
           None if call.z_pre is None else call.z_pre.read("zeros_prepacked"))
    ctx = f"{sparsity} {dtype} {mode} g{group_size}, seed={seed}"
    for g, w, name in zip(got, want, ("w_prepacked", "scales_prepacked", "zeros_prepacked")):
        if w is None:
            assert g is None
            continue
        assert_bitwise_equal(g, w, f"{name}, {ctx}")


W4A16_KERNEL_ENV = "CK_GEMM_W4A16_KERNEL"


@pytest.mark.parametrize("sparsity", list(SPARSITY))
@pytest.mark.parametrize("variant", ["auto", "tc", "reference"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("mode", ["sym", "asym"])
def test_dense_prepacked_gemm_meets_reference(sparsity, variant, dtype, mode, seed,
                                              monkeypatch):
    """ck_gemm_w4a16_prepacked on a sparse weight prepacked dense meets the float64 reference
    on the sparse weight's w': auto (the weight stream at M <= 16, the tensor-core tiles past
    it), the mma.sync tiles and the reference kernel forced; bias and ReLU."""
    rng = np.random.default_rng(seed)
    monkeypatch.setenv(W4A16_KERNEL_ENV, variant)
    for m, n, k in ((1, 40, 256), (16, 136, 512), (70, 72, 384), (200, 24, 1024)):
        if variant == "tc" and m <= 16:
            continue
        for group_size in ref.SPARSE_GROUP_SIZES:
            call = SparseGemm(rng, sparsity, dtype, group_size, mode, m, n, k, True, "relu",
                              "dense")
            call.launch()
            call.check(f"{variant}, seed={seed}")


def test_stream_in_a_cuda_graph(seed):
    rng = np.random.default_rng(seed)
    call = SparseGemm(rng, "2:4", "fp16", 128, "sym", 4, 96, 512, True, "none", True)
    synchronize()
    call.out.poison()
    assert_capture_records_then_replay_writes(call.launch, call.out, f"seed={seed}")
    call.check(f"graph replay, seed={seed}")


@pytest.mark.parametrize("variant, m, prepacked", [("stream", 2, False), ("tiles", 20, False),
                                                    ("tiles", 16, True)])
def test_forced_variant_refuses_what_it_cannot_serve(variant, m, prepacked, seed, monkeypatch):
    """stream and tiles need a prepacked weight; tiles, more than 16 rows of x."""
    rng = np.random.default_rng(seed)
    call = SparseGemm(rng, "2:4", "fp16", 64, "sym", m, 16, 128, False, "none", prepacked)
    monkeypatch.setenv(KERNEL_ENV, variant)
    with pytest.raises(ck.CKError) as info:
        call.launch()
    assert info.value.status == ck.Status.UNSUPPORTED, info.value.message
    assert KERNEL_ENV in info.value.message and variant in info.value.message
    synchronize()
    assert call.out.untouched(), "a rejected call wrote its output"


def test_auto_past_16_rows(seed):
    """auto on both sides of 16 rows of x (stream, then stream or tiles by the grid) meets the
    reference."""
    rng = np.random.default_rng(seed)
    for m in (16, 17, 130):
        call = SparseGemm(rng, "2:4", "bf16", 128, "asym", m, 80, 384, True, "relu", True)
        call.launch()
        call.check(f"auto, m={m}, seed={seed}")


# ---------------------------------------------------------------------------------------------
# The Python layer
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sparsity", list(SPARSITY))
@pytest.mark.parametrize("mode", ["sym", "asym"])
@pytest.mark.parametrize("k, g", [(256, 128), (320, 64)])
def test_quantized_linear_from_float(sparsity, mode, k, g, seed):
    """QuantizedLinear.from_float(..., sparsity=) on NumPy: the reference's prune, quantize and
    dequantize, then the layer (bias, ReLU) within the GEMM's tolerance; the layer's weight
    arrays are the reference's bit for bit. 2:4 of in_features 256 runs on the sparse tensor
    cores, the rest (16:32, 2:4 of 320) prepacked dense."""
    rng = np.random.default_rng(seed)
    dtype, m, n = "fp16", 5, 72
    w = ref.to_dtype(rng.standard_normal((n, k)).astype(np.float32) / 16, dtype)
    b = ref.to_dtype(rng.standard_normal(n).astype(np.float32), dtype)
    x = ref.random_input(rng, (m, k), dtype, scale=1.0 / 16)
    layer = ck.QuantizedLinear.from_float(w, bias=b, group_size=g, symmetric=mode == "sym",
                                          activation="relu", sparsity=sparsity)
    assert isinstance(layer, ck.SparseQuantizedLinear)
    assert layer.dense == (sparsity == "16:32" or k % 128 != 0), repr(layer)
    want = QUANTIZE[sparsity](PRUNE[sparsity](w, dtype), dtype, g, mode)
    for got, expected, name in zip(layer.weight, want, ("codes", "meta", "scales", "zeros")):
        if expected is None:
            assert got is None
            continue
        host = got.to_numpy()
        assert_bitwise_equal(host.view(expected.dtype) if name == "meta" else host, expected,
                             f"{name}, {sparsity} {mode}, seed={seed}")
    y = ref.to_f32(layer(x), dtype).astype(np.float64)
    codes, meta, scales, zeros = want
    w_deq = DEQUANTIZE[sparsity](codes, meta, scales, zeros, k, g, mode, dtype)
    pre = ref.linear_f64(x, w_deq, b, "none", dtype)
    as64 = lambda a: ref.to_f32(a, dtype).astype(np.float64)  # noqa: E731
    error = dot_float32_error(as64(x), as64(w_deq), pre, TENSOR_CORE_ROUNDOFF)
    value = ref.linear_f64(x, w_deq, b, "relu", dtype)
    assert_meets_reference(y, value, error, dtype, f"layer {sparsity} {mode}, seed={seed}")


def test_quantized_linear_refuses_a_dense_weight_without_pruning(seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((16, 128)).astype(np.float16)
    with pytest.raises(ValueError, match="prune"):
        ck.QuantizedLinear.from_float(w, sparsity="2:4", prune=False)
    pruned = ck.sparse_prune(w, "2:4")
    assert_bitwise_equal(pruned, ref.sparse24_prune(w, "fp16"), f"sparse_prune, seed={seed}")
    layer = ck.QuantizedLinear.from_float(pruned, sparsity="2:4", prune=False)
    assert layer.out_features == 16 and layer.in_features == 128


def test_quantized_linear_on_torch_tensors(seed):
    """A torch weight makes torch arrays; a torch input gives a torch output, the NumPy path's
    bits."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((48, 256)).astype(np.float16) / 16
    x = ref.random_input(rng, (3, 256), "fp16", scale=1.0 / 16)
    want = ck.QuantizedLinear.from_float(w, sparsity="2:4")(x)
    layer = ck.QuantizedLinear.from_float(torch.from_numpy(w).cuda(), sparsity="2:4")
    y = layer(torch.from_numpy(x).cuda())
    assert isinstance(y, torch.Tensor) and y.is_cuda and y.dtype == torch.float16
    assert_bitwise_equal(y.cpu().numpy(), want, f"torch layer, seed={seed}")


def test_1632_to_24_matches_reference(seed):
    """ck_sparse_1632_to_24 on a 16:32 weight whose every block of 4 keeps 2 positions: the
    reference's 2:4 metadata bit for bit, no violation, and with the 16:32 codes that is the
    2:4 quantization of the same weight; on pruned random weights (blocks of 4 keeping 0 ... 4
    positions) the count of the other blocks, exactly. The wrapper's sparse_1632_to_24 says the
    same (and raises on the second)."""
    rng = np.random.default_rng(seed)
    n, k = 24, 256
    w32 = rng.standard_normal((n, k)).astype(np.float32) / 16 + np.float32(1e-3)
    keep = np.argsort(rng.random((n, k // 4, 4)), axis=2)[:, :, :2]
    mask = np.zeros((n, k // 4, 4), bool)
    np.put_along_axis(mask, keep, True, axis=2)
    w = ref.to_dtype(np.where(mask.reshape(n, k), w32, np.float32(0)), "fp16")
    codes, masks, scales, zeros = ref.sparse1632_quantize(w, "fp16", 128, "sym")
    for masks_host, want_bad in ((masks, 0), (None, None)):
        if masks_host is None:   # pruned random weights: blocks of 4 keep 0 .. 4 positions
            masks_host = ref.sparse1632_quantize(sparse_weight(rng, "16:32", n, k, "fp16"),
                                                 "fp16", 128, "sym")[1]
            per_block = (masks_host[:, :, None] >> (4 * np.arange(8, dtype=np.uint32)) & 0xF)
            want_bad = int((np.vectorize(lambda v: bin(int(v)).count("1"))(per_block) != 2).sum())
            assert want_bad > 0
        m = GuardedBuffer.input(masks_host)
        out = GuardedBuffer.output((n, k // 32), np.uint32, POISON_QUANTIZED)
        bad = GuardedBuffer.output((1,), np.int32, POISON_QUANTIZED)
        ck.raw.sparse_1632_to_24(m.ptr, n, k, out.ptr, bad.ptr, 0)
        synchronize()
        assert int(bad.read("violations")[0]) == want_bad, f"seed={seed}"
        got = out.read("meta_24")
        ref.sparse24_unpack_metadata(got)   # valid 2:4 metadata either way
        if want_bad == 0:
            _, want = ref.sparse1632_to_24(codes, masks_host)
            assert_bitwise_equal(got, want, f"meta_24, seed={seed}")
            codes24, meta24, _, _ = ref.sparse24_quantize(w, "fp16", 128, "sym")
            assert_bitwise_equal(codes, codes24, f"codes, seed={seed}")
            assert_bitwise_equal(got, meta24, f"2:4 metadata, seed={seed}")
            assert_bitwise_equal(ck.sparse_1632_to_24(masks_host), want, f"wrapper, seed={seed}")
        else:
            with pytest.raises(ValueError, match="blocks of 4"):
                ck.sparse_1632_to_24(masks_host)
