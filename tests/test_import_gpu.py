"""GPU tests of the checkpoint importers ck_import_gptq and ck_import_awq and of
ck_permute_columns, against tests/checkpoint_formats.py (the NumPy spec of the formats).

- Random checkpoints are built bit-exactly in the published formats from integer codes (every
  nibble value, words with the sign bit set, GPTQ zero points 1 .. 16): the importers' outputs
  (w_packed, scales, zeros and perm) must equal library_from_gptq / library_from_awq bit for
  bit, for fp16 and bf16 scales, group 32/64/128/row, GPTQ without g_idx, with the trivial
  g_idx (k // group_size) and with an act-order g_idx, N in {8, 200, 264, 1000} and K in
  {32, 96, 256, 4096}, plus one 4096 x 4096 layer; pointers that are only element aligned
  (w_packed at an odd address takes the byte-store path).
- End to end: ck_gemm_w4a16 on the imported weight (x gathered by ck_permute_columns for
  act-order) against the float64 product with the checkpoint's own dequantization
  (gptq_unpack / awq_unpack), within test_w4a16_gpu.py's float32 tolerance.
- ck_permute_columns: bit-exact for fp32/fp16/bf16 (random bit patterns, NaNs included),
  permutations and arbitrary gathers, on both paths (few rows: gathered from global memory;
  many rows: staged in shared memory), element-aligned pointers.
- CUDA graph capture and replay of the importers and of the gather; the wrapper functions
  (NumPy and DeviceArray in and out); a g_idx that breaks the header's rule writes nothing
  outside the outputs (the values are unspecified); rejected shapes launch nothing.

Every output is poisoned and sits between guard regions (GuardedBuffer). The tests skip without
a CUDA device. CK_SANITIZE=1 drops the largest shapes. Each test draws a seed from os.urandom,
prints it and names it in its messages; CK_TEST_SEED=<seed> replays it.
"""

import numpy as np
import pytest

import cuda_wrapper as ck
import checkpoint_formats as cf
import reference as ref
from gpu_support import (
    CK_DTYPE, GROUP_IDS, POISON, SANITIZE, UINT_OF_SIZE, GuardedBuffer, KernelCall,
    assert_bitwise_equal, assert_graph_replays, assert_within, dtype_arg, output_tolerance,
    ptr_or_null, random_normal, shape_id, synchronize, to_device,
)
# Helpers only (no test_* names, no fixtures): the W4A16 tolerance and its check.
from test_w4a16_gpu import assert_meets_reference, w4a16_float32_error

pytestmark = pytest.mark.gpu

G_IDX_KINDS = ("none", "trivial", "act_order")

# (K, N): K = 32 (one partial group of 64 / 128), 96 (a partial last group of 64; 12 words: a
# partial word tile), 256, 4096 (many tiles along K); N = 8 (the smallest), 200 (not a power of
# two, partial 32-column tiles), 264 (AWQ: a second 256-column tile of one packed column), 1000.
SHAPES = [(32, 8), (96, 200), (256, 1000), (4096, 264)]
LARGE_SHAPE = (4096, 4096)


def _id(k, n):
    return f"k{k}-n{n}"


# ---------------------------------------------------------------------------------------------
# One importer call on guarded buffers
# ---------------------------------------------------------------------------------------------
def random_checkpoint(rng, fmt, k, n, group_size, dtype, g_idx_kind):
    """(qweight, qzeros, scales, g_idx or None) of a random checkpoint."""
    if fmt == "gptq":
        return cf.random_gptq_checkpoint(rng, k, n, group_size, dtype, g_idx_kind)
    return cf.random_awq_checkpoint(rng, k, n, group_size, dtype) + (None,)


class ImportCall(KernelCall):
    """One ck_import_gptq / ck_import_awq call: guarded inputs, poisoned guarded outputs, the
    launch and the bitwise check against checkpoint_formats.library_from_*. refill() writes a
    fresh checkpoint (a new act-order g_idx included) into the same buffers."""

    INPUTS = ("qweight", "qzeros", "scales", "g_idx")
    OUTPUTS = ("w_packed", "scales_out", "zeros_out", "perm")

    def __init__(self, rng, fmt, k, n, group_size, dtype, g_idx_kind="none", misalign=None):
        """misalign: extra bytes before a named buffer (INPUTS and OUTPUTS)."""
        assert fmt == "gptq" or g_idx_kind == "none"
        self.fmt, self.k, self.n, self.group_size = fmt, k, n, group_size
        self.dtype, self.g_idx_kind = dtype, g_idx_kind
        misalign = misalign or {}
        self.checkpoint = random_checkpoint(rng, fmt, k, n, group_size, dtype, g_idx_kind)
        self.inputs = {name: None if host is None else
                       GuardedBuffer.input(host, misalign.get(name, 0))
                       for name, host in zip(self.INPUTS, self.checkpoint)}
        groups = ref.int4_groups_per_row(k, group_size)
        shapes = {"w_packed": ((n, k // 2), np.uint8),
                  "scales_out": ((n, groups), ref.NUMPY_DTYPE[dtype]),
                  "zeros_out": ((n, groups), np.uint8),
                  "perm": ((k,), np.int32)}
        self.outputs = {name: GuardedBuffer.output(*shapes[name], POISON, misalign.get(name, 0))
                        for name in self.OUTPUTS
                        if name != "perm" or self.inputs["g_idx"] is not None}

    def launch(self, stream=0):
        i, o = self.inputs, self.outputs
        if self.fmt == "gptq":
            ck.raw.import_gptq(i["qweight"].ptr, i["qzeros"].ptr, i["scales"].ptr,
                               ptr_or_null(i["g_idx"]), CK_DTYPE[self.dtype], self.n, self.k,
                               self.group_size, o["w_packed"].ptr, o["scales_out"].ptr,
                               o["zeros_out"].ptr, ptr_or_null(o.get("perm")), stream)
        else:
            ck.raw.import_awq(i["qweight"].ptr, i["qzeros"].ptr, i["scales"].ptr,
                              CK_DTYPE[self.dtype], self.n, self.k, self.group_size,
                              o["w_packed"].ptr, o["scales_out"].ptr, o["zeros_out"].ptr, stream)

    def refill(self, rng):
        self.checkpoint = random_checkpoint(rng, self.fmt, self.k, self.n, self.group_size,
                                            self.dtype, self.g_idx_kind)
        for name, host in zip(self.INPUTS, self.checkpoint):
            if host is not None:
                self.inputs[name].write(host)

    def expected(self):
        qweight, qzeros, scales, g_idx = self.checkpoint
        if self.fmt == "gptq":
            return dict(zip(self.OUTPUTS, cf.library_from_gptq(qweight, qzeros, scales, g_idx,
                                                               self.group_size)))
        return dict(zip(self.OUTPUTS, cf.library_from_awq(qweight, qzeros, scales,
                                                          self.group_size)))

    def read(self, ctx):
        synchronize()
        return {name: buffer.read(f"{name}, {ctx}") for name, buffer in self.outputs.items()}

    def check(self, ctx):
        """Every output equals the spec bit for bit (and nothing around it was written)."""
        got, want = self.read(ctx), self.expected()
        assert (want.get("perm") is None) == ("perm" not in got)
        for name in got:
            assert_bitwise_equal(got[name], want[name], f"{name}, {ctx}")
        return got


# ---------------------------------------------------------------------------------------------
# Bit-exact imports
# ---------------------------------------------------------------------------------------------
def gptq_cases():
    for k, n in SHAPES:
        for group in ref.INT4_GROUP_SIZES:
            for dtype in ref.W4A16_DTYPES:
                for kind in G_IDX_KINDS:
                    yield pytest.param(kind, dtype, group, k, n,
                                       id=f"{kind}-{dtype}-{GROUP_IDS[group]}-{_id(k, n)}")


@pytest.mark.parametrize("g_idx_kind, dtype, group_size, k, n", list(gptq_cases()))
def test_import_gptq(g_idx_kind, dtype, group_size, k, n, seed):
    call = ImportCall(np.random.default_rng(seed), "gptq", k, n, group_size, dtype, g_idx_kind)
    call.launch()
    got = call.check(f"seed={seed}")
    if g_idx_kind == "trivial":
        np.testing.assert_array_equal(got["perm"], np.arange(k))


def awq_cases():
    for k, n in SHAPES:
        for group in ref.INT4_GROUP_SIZES:
            for dtype in ref.W4A16_DTYPES:
                yield pytest.param(dtype, group, k, n, id=f"{dtype}-{GROUP_IDS[group]}-{_id(k, n)}")


@pytest.mark.parametrize("dtype, group_size, k, n", list(awq_cases()))
def test_import_awq(dtype, group_size, k, n, seed):
    call = ImportCall(np.random.default_rng(seed), "awq", k, n, group_size, dtype)
    call.launch()
    call.check(f"seed={seed}")


@pytest.mark.skipif(SANITIZE, reason="a full-size layer is too slow under compute-sanitizer")
@pytest.mark.parametrize("fmt, g_idx_kind", [("gptq", "none"), ("gptq", "act_order"),
                                             ("awq", "none")])
def test_import_large(fmt, g_idx_kind, seed):
    k, n = LARGE_SHAPE
    call = ImportCall(np.random.default_rng(seed), fmt, k, n, 128, "fp16", g_idx_kind)
    call.launch()
    call.check(f"{fmt} {g_idx_kind} {shape_id(LARGE_SHAPE)}, seed={seed}")


@pytest.mark.parametrize("fmt, g_idx_kind", [("gptq", "none"), ("gptq", "act_order"),
                                             ("awq", "none")])
def test_import_element_aligned_pointers(fmt, g_idx_kind, seed):
    """Each pointer only as aligned as its element (the header's rule): int32 inputs and perm
    4-byte, scales 2-byte, w_packed and zeros at odd addresses (byte stores of the codes)."""
    misalign = {"qweight": 4, "qzeros": 12, "scales": 2, "g_idx": 4, "w_packed": 1,
                "scales_out": 6, "zeros_out": 3, "perm": 4}
    call = ImportCall(np.random.default_rng(seed), fmt, 96, 200, 64, "bf16", g_idx_kind,
                      misalign)
    call.launch()
    call.check(f"misaligned, seed={seed}")


def test_import_gptq_act_order_perm_sorts_by_group(seed):
    """perm as the header defines it: the rows of group g at g * group_size .. in increasing k."""
    k, group_size = 4096, 128
    call = ImportCall(np.random.default_rng(seed), "gptq", k, 64, group_size, "fp16",
                      "act_order")
    call.launch()
    perm = call.read(f"seed={seed}")["perm"]
    g_idx = call.checkpoint[3]
    assert sorted(perm) == list(range(k))
    np.testing.assert_array_equal(g_idx[perm], np.arange(k) // group_size)
    assert (np.diff(perm.reshape(-1, group_size), axis=1) > 0).all()


def test_import_gptq_bad_g_idx_stays_in_bounds(seed):
    """A g_idx that breaks the header's rule (too many rows in a group, values outside
    [0, groups)) gives unspecified values, but the importer writes only its outputs, every perm
    value it writes is a row index, and it reads nothing outside its inputs (compute-sanitizer
    checks that under make sanitize)."""
    rng = np.random.default_rng(seed)
    k, n, group_size = 256, 64, 32
    call = ImportCall(rng, "gptq", k, n, group_size, "fp16", "act_order")
    bad = np.zeros(k, dtype=np.int32)           # group 0 claims every row
    bad[::7] = 1000                             # some rows in no group at all
    bad[::11] = -3
    call.inputs["g_idx"].write(bad)
    call.launch()
    got = call.read(f"seed={seed}")             # checks the guards
    perm = got["perm"].view(np.uint32)
    written = perm != np.uint32(0x7F7F7F7F)
    assert (perm[written] < k).all()


@pytest.mark.parametrize("fmt", ["gptq", "awq"])
def test_import_rejects_shapes(fmt, seed):
    """N not a multiple of 8 or K not a multiple of 32: CK_STATUS_UNSUPPORTED, nothing written."""
    rng = np.random.default_rng(seed)
    for k, n in ((48, 16), (64, 12)):
        call = ImportCall(rng, fmt, 64, 16, 32, "fp16")
        call.k, call.n = k, n   # the buffers are large enough: only the arguments are wrong
        with pytest.raises(ck.CKError) as info:
            call.launch()
        assert info.value.status == ck.Status.UNSUPPORTED, info.value.message
        synchronize()
        call.assert_outputs_untouched(f"a rejected call (k={k}, n={n})")


# ---------------------------------------------------------------------------------------------
# End to end: the imported weight in ck_gemm_w4a16 computes x times the checkpoint's weight
# ---------------------------------------------------------------------------------------------
# (format, g_idx kind, M, K, N, group size): M 1 and 16 (weight-streaming kernel), 33 (tiles).
E2E_CASES = [
    ("gptq", "none", 1, 4096, 200, 128),
    ("gptq", "act_order", 16, 4096, 264, 128),
    ("gptq", "act_order", 33, 96, 200, 64),
    ("gptq", "act_order", 5, 1024, 72, 32),
    ("gptq", "trivial", 8, 1024, 64, ref.GROUP_ROW),
    ("awq", "none", 1, 4096, 264, 128),
    ("awq", "none", 33, 96, 200, 32),
    ("awq", "none", 16, 1024, 1000, ref.GROUP_ROW),
]


@pytest.mark.parametrize("fmt, g_idx_kind, m, k, n, group_size", [
    pytest.param(*case, id=f"{case[0]}-{case[1]}-m{case[2]}-{_id(case[3], case[4])}-"
                           f"{GROUP_IDS[case[5]]}") for case in E2E_CASES])
@pytest.mark.parametrize("dtype", ref.W4A16_DTYPES)
def test_imported_weight_in_gemm_w4a16(dtype, fmt, g_idx_kind, m, k, n, group_size, seed):
    rng = np.random.default_rng(seed)
    ctx = f"{fmt} {g_idx_kind}, seed={seed}"
    call = ImportCall(rng, fmt, k, n, group_size, dtype, g_idx_kind)
    call.launch()
    imported = call.check(ctx)
    qweight, qzeros, scales, g_idx = call.checkpoint
    if fmt == "gptq":
        stored_g_idx = g_idx if g_idx is not None else cf.gptq_groups_g_idx(k, group_size)
        w_ckpt = cf.gptq_unpack(qweight, qzeros, scales, stored_g_idx, dtype)    # [K, N]
    else:
        w_ckpt = cf.awq_unpack(qweight, qzeros, scales, group_size, dtype)

    x = random_normal(rng, (m, k), dtype)
    x_buf = GuardedBuffer.input(x)
    if "perm" in call.outputs:      # the layer gathers x's columns: x[:, perm]
        gathered = GuardedBuffer.output((m, k), x.dtype, POISON)
        ck.raw.permute_columns(x_buf.ptr, CK_DTYPE[dtype], m, k, call.outputs["perm"].ptr,
                               gathered.ptr, 0)
        synchronize()
        assert_bitwise_equal(gathered.read(f"x[:, perm], {ctx}"), x[:, imported["perm"]],
                             f"x[:, perm], {ctx}")
        x_buf = gathered
    out = GuardedBuffer.output((m, n), x.dtype, POISON)
    o = call.outputs
    ck.raw.gemm_w4a16(x_buf.ptr, CK_DTYPE[dtype], o["w_packed"].ptr, o["scales_out"].ptr,
                      o["zeros_out"].ptr, group_size, ck.INT4_ASYMMETRIC, 0,
                      ck.ACTIVATION_NONE, m, n, k, out.ptr, 0)
    synchronize()

    w_f64 = ref.to_f32(w_ckpt, dtype).astype(np.float64)
    x_f64 = ref.to_f32(x, dtype).astype(np.float64)
    value = x_f64 @ w_f64                       # the checkpoint layer, exactly
    error32 = w4a16_float32_error(x_f64, w_f64.T, value)
    got = ref.to_f32(out.read(f"out, {ctx}"), dtype).astype(np.float64)
    assert_meets_reference(got, value, error32, dtype, ctx)


@pytest.mark.parametrize("fmt, g_idx_kind, m", [("gptq", "act_order", 3), ("gptq", "none", 40),
                                                ("awq", "none", 20)])
@pytest.mark.parametrize("dtype", ref.W4A16_DTYPES)
def test_quantized_linear_from_checkpoint(dtype, fmt, g_idx_kind, m, seed):
    """QuantizedLinear.from_gptq / from_awq (import, prepack, gather x for act-order, GEMM with
    bias and ReLU) computes the checkpoint's own layer: relu(x @ w_ckpt + bias)."""
    rng = np.random.default_rng(seed)
    k, n, group_size = 512, 136, 128
    bias = random_normal(rng, n, dtype)
    if fmt == "gptq":
        qweight, qzeros, scales, g_idx = cf.random_gptq_checkpoint(rng, k, n, group_size, dtype,
                                                                   g_idx_kind)
        layer = ck.QuantizedLinear.from_gptq(qweight, qzeros, scales, g_idx, bias=bias,
                                             group_size=group_size, dtype=dtype_arg(dtype),
                                             activation="relu")
        stored = g_idx if g_idx is not None else cf.gptq_groups_g_idx(k, group_size)
        w_ckpt = cf.gptq_unpack(qweight, qzeros, scales, stored, dtype)
    else:
        qweight, qzeros, scales = cf.random_awq_checkpoint(rng, k, n, group_size, dtype)
        layer = ck.QuantizedLinear.from_awq(qweight, qzeros, scales, bias=bias,
                                            group_size=group_size, dtype=dtype_arg(dtype),
                                            activation="relu")
        w_ckpt = cf.awq_unpack(qweight, qzeros, scales, group_size, dtype)
    assert (layer.in_features, layer.out_features) == (k, n)
    assert (layer.perm is not None) == (g_idx_kind == "act_order")
    x = random_normal(rng, (m, k), dtype)
    got = ref.to_f32(layer(x), dtype).astype(np.float64)
    w_f64 = ref.to_f32(w_ckpt, dtype).astype(np.float64)
    x_f64 = ref.to_f32(x, dtype).astype(np.float64)
    pre = x_f64 @ w_f64 + ref.to_f32(bias, dtype).astype(np.float64)
    value = np.maximum(pre, 0.0)
    error32 = w4a16_float32_error(x_f64, w_f64.T, pre)
    ctx = f"QuantizedLinear.from_{fmt} {g_idx_kind} m={m}, seed={seed}"
    assert_within(got, value, output_tolerance(value, error32, dtype), ctx)
    assert np.count_nonzero(value) > 0 and np.count_nonzero(value == 0) > 0, "ReLU exercised"


# ---------------------------------------------------------------------------------------------
# ck_permute_columns
# ---------------------------------------------------------------------------------------------
def random_bits(rng, shape, dtype):
    """Uniformly random bit patterns of dtype (NaNs and infinities included): a gather must
    copy them unchanged."""
    bits = UINT_OF_SIZE[np.dtype(ref.NUMPY_DTYPE[dtype]).itemsize]
    return rng.integers(0, np.iinfo(bits).max, size=shape, dtype=bits, endpoint=True).view(
        ref.NUMPY_DTYPE[dtype])


def random_perm(rng, cols, kind):
    if kind == "permutation":
        return rng.permutation(cols).astype(np.int32)
    return rng.integers(0, cols, size=cols, dtype=np.int32)   # any gather, repeats included


class PermuteCall(KernelCall):
    def __init__(self, rng, rows, cols, dtype, kind="permutation", misalign=(0, 0, 0)):
        self.rows, self.cols, self.dtype, self.kind = rows, cols, dtype, kind
        self.host = (random_bits(rng, (rows, cols), dtype), random_perm(rng, cols, kind))
        self.x = GuardedBuffer.input(self.host[0], misalign[0])
        self.perm = GuardedBuffer.input(self.host[1], misalign[1])
        self.out = GuardedBuffer.output((rows, cols), ref.NUMPY_DTYPE[dtype], POISON, misalign[2])
        self.outputs = {"out": self.out}

    def launch(self, stream=0):
        ck.raw.permute_columns(self.x.ptr, CK_DTYPE[self.dtype], self.rows, self.cols,
                               self.perm.ptr, self.out.ptr, stream)

    def refill(self, rng):
        self.host = (random_bits(rng, (self.rows, self.cols), self.dtype),
                     random_perm(rng, self.cols, self.kind))
        self.x.write(self.host[0])
        self.perm.write(self.host[1])

    def check(self, ctx):
        synchronize()
        x, perm = self.host
        assert_bitwise_equal(self.out.read(f"out, {ctx}"), x[:, perm], f"out, {ctx}")


# (rows, cols). Few rows take the gather path: one row, odd widths. Many rows (at least twice
# the SM count) stage whole rows in shared memory: 16-byte loads (600 x 1000) or element loads
# (600 x 333, and 262147 x 3: 8-row batches, the last one partial); a full prefill activation
# (1024 x 14336: staged in fp16/bf16, too wide to stage in fp32).
PERMUTE_SHAPES = [(1, 32), (3, 7), (5, 4096), (37, 1000), (600, 1000), (600, 333),
                  (1024, 14336), (262147, 3)]


@pytest.mark.parametrize("shape", [s for s in PERMUTE_SHAPES
                                   if not SANITIZE or s[0] * s[1] <= 2**20], ids=shape_id)
@pytest.mark.parametrize("kind", ["permutation", "gather"])
@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_permute_columns(dtype, kind, shape, seed):
    call = PermuteCall(np.random.default_rng(seed), *shape, dtype, kind)
    call.launch()
    call.check(f"seed={seed}")


@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_permute_columns_element_aligned_pointers(dtype, seed):
    size = np.dtype(ref.NUMPY_DTYPE[dtype]).itemsize
    for rows in (9, 600):   # the gather and the staged path
        call = PermuteCall(np.random.default_rng(seed), rows, 336, dtype, "permutation",
                           misalign=(size, 4, 3 * size))
        call.launch()
        call.check(f"rows={rows}, seed={seed}")


# ---------------------------------------------------------------------------------------------
# CUDA graphs
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt, g_idx_kind", [("gptq", "none"), ("gptq", "act_order"),
                                             ("awq", "none")])
@pytest.mark.parametrize("dtype", ref.W4A16_DTYPES)
def test_import_cuda_graph_replay(dtype, fmt, g_idx_kind, seed):
    """Capture records the launches without running them; each replay reads the new checkpoint
    (a new act-order g_idx included) from the same buffers and writes every output."""
    rng = np.random.default_rng(seed)
    call = ImportCall(rng, fmt, 512, 200, 64, dtype, g_idx_kind)
    assert_graph_replays(call, rng, seed)


@pytest.mark.parametrize("rows", [17, 600])
def test_permute_columns_cuda_graph_replay(rows, seed):
    rng = np.random.default_rng(seed)
    assert_graph_replays(PermuteCall(rng, rows, 1000, "bf16"), rng, seed)


# ---------------------------------------------------------------------------------------------
# The wrapper: NumPy in -> NumPy out, DeviceArray in -> DeviceArray out; bitwise the spec
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("g_idx_kind", G_IDX_KINDS)
@pytest.mark.parametrize("dtype", ref.W4A16_DTYPES)
def test_wrapper_import_gptq(dtype, g_idx_kind, seed):
    rng = np.random.default_rng(seed)
    k, n, group_size = 256, 72, 64
    qweight, qzeros, scales, g_idx = cf.random_gptq_checkpoint(rng, k, n, group_size, dtype,
                                                               g_idx_kind)
    want = cf.library_from_gptq(qweight, qzeros, scales, g_idx, group_size)
    got = ck.import_gptq(qweight, qzeros, scales, g_idx, group_size=group_size,
                         dtype=dtype_arg(dtype))
    assert len(got) == 4 and (got[3] is None) == (g_idx is None)
    for name, a, b in zip(("w_packed", "scales", "zeros", "perm"), got, want):
        if b is not None:
            assert isinstance(a, np.ndarray)
            assert_bitwise_equal(a, b, f"numpy {name}, seed={seed}")
    got_d = ck.import_gptq(to_device(qweight), to_device(qzeros), to_device(scales, dtype),
                           None if g_idx is None else to_device(g_idx), group_size=group_size)
    for name, a, b in zip(("w_packed", "scales", "zeros", "perm"), got_d, want):
        if b is None:
            assert a is None
            continue
        assert isinstance(a, ck.DeviceArray)
        assert_bitwise_equal(a.to_numpy(), b, f"device {name}, seed={seed}")
    assert got_d[1].ck_dtype == CK_DTYPE[dtype]


@pytest.mark.parametrize("dtype", ref.W4A16_DTYPES)
def test_wrapper_import_awq(dtype, seed):
    rng = np.random.default_rng(seed)
    k, n, group_size = 256, 72, 32
    qweight, qzeros, scales = cf.random_awq_checkpoint(rng, k, n, group_size, dtype)
    want = cf.library_from_awq(qweight, qzeros, scales, group_size)
    got = ck.import_awq(qweight, qzeros, scales, group_size=group_size,
                        dtype=dtype_arg(dtype))
    assert len(got) == 3
    for name, a, b in zip(("w_packed", "scales", "zeros"), got, want):
        assert isinstance(a, np.ndarray)
        assert_bitwise_equal(a, b, f"numpy {name}, seed={seed}")
    got_d = ck.import_awq(to_device(qweight), to_device(qzeros), to_device(scales, dtype),
                          group_size=group_size)
    for name, a, b in zip(("w_packed", "scales", "zeros"), got_d, want):
        assert isinstance(a, ck.DeviceArray)
        assert_bitwise_equal(a.to_numpy(), b, f"device {name}, seed={seed}")


def test_wrapper_import_gptq_checks_g_idx(seed):
    """The wrapper enforces the header's rule on a host g_idx before launching anything."""
    rng = np.random.default_rng(seed)
    qweight, qzeros, scales, g_idx = cf.random_gptq_checkpoint(rng, 128, 16, 32, "fp16",
                                                               "act_order")
    bad = g_idx.copy()
    bad[np.flatnonzero(bad == 0)[0]] = 1     # group 0 one short, group 1 one over
    with pytest.raises(ValueError):
        ck.import_gptq(qweight, qzeros, scales, bad, group_size=32)


@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_wrapper_permute_columns(dtype, seed):
    rng = np.random.default_rng(seed)
    x = random_bits(rng, (6, 500), dtype)
    perm = random_perm(rng, 500, "permutation")
    got = ck.permute_columns(x, perm, dtype=dtype_arg(dtype))
    assert isinstance(got, np.ndarray)
    assert_bitwise_equal(got, x[:, perm], f"numpy, seed={seed}")
    got_d = ck.permute_columns(to_device(x, dtype), to_device(perm))
    assert isinstance(got_d, ck.DeviceArray) and got_d.ck_dtype == CK_DTYPE[dtype]
    assert_bitwise_equal(got_d.to_numpy(), x[:, perm], f"device, seed={seed}")
    row = ck.permute_columns(x[1], perm, dtype=dtype_arg(dtype))      # a 1-D x is one row
    assert row.shape == (500,)
    assert_bitwise_equal(row, x[1, perm], f"1-D, seed={seed}")
