"""What the test files share: the library's enums for the reference's names, poison bytes, random
data, guarded device buffers, bitwise and toleranced comparisons, and the checks that every entry
point gets (graph capture and replay, the kernel override).

A GPU test file says `pytestmark = pytest.mark.gpu`; conftest.py skips its tests, saying why,
where no CUDA device is visible. Nothing here touches the GPU on import.
"""
import functools
import os

import numpy as np
import pytest

import cuda_wrapper as ck
import reference as ref

# ---------------------------------------------------------------------------------------------
# The library's enums for the names tests/reference.py uses
# ---------------------------------------------------------------------------------------------
CK_DTYPE = {"fp32": ck.DType.FP32, "fp16": ck.DType.FP16, "bf16": ck.DType.BF16}
DTYPE_NAME = {ck_dtype: name for name, ck_dtype in CK_DTYPE.items()}
FLOAT_DTYPES = [CK_DTYPE[name] for name in ref.DTYPES]
CK_GRANULARITY = {"tensor": ck.PER_TENSOR, "row": ck.PER_ROW}
CK_LAYOUT = {"nk": ck.LAYOUT_NK, "kn": ck.LAYOUT_KN}
CK_ACTIVATION = {"none": ck.ACTIVATION_NONE, "relu": ck.ACTIVATION_RELU}
CK_INT4_MODE = {"sym": ck.INT4_SYMMETRIC, "asym": ck.INT4_ASYMMETRIC}
GROUP_IDS = {32: "g32", 64: "g64", 128: "g128", ref.GROUP_ROW: "grow"}



# An output that cannot be stored in pairs, so that the kernels take their scalar store path: odd
# N (the last column of each row has no partner), or out one element past the 16-byte (and
# 8-byte) alignment with N even (the same, from the address). Each: (N, elements before out).
SCALAR_STORE_CASES = {"odd-n": (137, 0), "out+1-element": (136, 1)}


def scalar_store_params(variants):
    """pytest params (variant, out_dtype, case) of the GEMMs' scalar store path: int32 (the
    plain product) or a float output (the scaled one)."""
    return [pytest.param(variant, out_dtype, case, id=f"{variant}-{out_dtype}-{case}")
            for case in SCALAR_STORE_CASES for out_dtype in ("int32",) + ref.DTYPES
            for variant in variants]


def scalar_store_layout(case, out_dtype):
    """(N, bytes before out and bias) of a SCALAR_STORE_CASES case."""
    n, elements = SCALAR_STORE_CASES[case]
    return n, elements * np.dtype(np.int32 if out_dtype == "int32" else
                                  ref.NUMPY_DTYPE[out_dtype]).itemsize


def dtype_arg(dtype):
    """The dtype= a wrapper function needs for host data of `dtype`: "bf16" (uint16 bit patterns
    do not say it), else None (the NumPy dtype says it)."""
    return "bf16" if dtype == "bf16" else None


def shape_id(shape):
    return "x".join(map(str, shape))


def epilogue_cases(shapes):
    """pytest params (shape, out_dtype, granularities, bias, activation) of the fused epilogue of
    ck_gemm_int8_scaled and ck_gemm_int4_scaled: each shape, output dtype, scale granularity of
    both operands, bias or not, and activation."""
    return [pytest.param(shape, out_dtype, (ga, gb), bias, act,
                         id=f"{shape_id(shape)}-{out_dtype}-a_{ga}-b_{gb}-"
                            f"{'bias' if bias else 'nobias'}-{act}")
            for shape in shapes for out_dtype in ref.DTYPES for ga in ref.GRANULARITIES
            for gb in ref.GRANULARITIES for bias in (False, True) for act in ref.ACTIVATIONS]


# Poison bytes: an output is filled with one before the launch, so that an element the kernel
# does not write cannot pass. Each makes a value no correct result holds.
POISON = 0x7F  # fp32 and bf16 ~3.4e38, fp16 NaN, int32 0x7F7F7F7F (above any |sum| tested but
#                the INT8 wrap test's, which never lands on it)
POISON_CODES = 0x80  # int8 codes: -128, outside [-127, 127]
POISON_QUANTIZED = 0xAB  # the quantizers' scales: negative (scales are > 0); zeros: 171 (> 15);
#                          packed int4, where every byte is valid: a missed byte goes unnoticed
#                          with probability 1/256

# ---------------------------------------------------------------------------------------------
# The GPU and the session
# ---------------------------------------------------------------------------------------------
# Under compute-sanitizer (make sanitize) kernels run ~100x slower: the files shrink their shapes,
# and leave out the products of more than SANITIZE_MAX_MACS multiply-adds.
SANITIZE = os.environ.get("CK_SANITIZE") == "1"
SANITIZE_MAX_MACS = 2**26


def small_enough(m, n, k):
    return not SANITIZE or m * n * k <= SANITIZE_MAX_MACS


@functools.lru_cache(maxsize=None)
def compute_capability():
    """(major, minor) of the current device, asked once."""
    return ck.cuda.compute_capability()


def force_variant(monkeypatch, env, variant):
    """Forces a kernel variant through the override `env` (read by the library on every call),
    skipping the test where this GPU has no such kernel: mma, small_m and tc run mma.sync (compute
    capability 8.0+), wgmma runs on 9.0 only. The shape rules of a variant are the callers'."""
    cc = compute_capability()
    if variant in ("mma", "small_m", "tc") and cc < (8, 0):
        pytest.skip(f"the {variant} kernel needs compute capability 8.0+ (this GPU: {cc})")
    if variant == "wgmma" and cc != (9, 0):
        pytest.skip(f"the wgmma kernel needs a compute capability 9.0 GPU (this GPU: {cc})")
    monkeypatch.setenv(env, variant)


def synchronize():
    ck.cuda.device_synchronize()


# ---------------------------------------------------------------------------------------------
# Random data
# ---------------------------------------------------------------------------------------------
def random_normal(rng, shape, dtype, scale=1.0):
    """N(0, scale^2) values in `dtype` (float32 draws, rounded by ref.to_dtype)."""
    return ref.to_dtype(rng.standard_normal(shape, dtype=np.float32) * np.float32(scale), dtype)


def scale_count(granularity, count):
    return 1 if granularity == "tensor" else count


def random_scales(rng, count, k, rms_code):
    """Positive float32 scales spread over a factor of 30, sized so that the product of two of
    them times a typical |acc| (~ rms_code^2 sqrt(K) for uniform codes of that rms) is ~0.1 to
    ~10."""
    per_operand = 1.0 / (rms_code * k**0.25)
    return (per_operand * 10.0 ** rng.uniform(-1, 0.5, count)).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Tolerances of float outputs (each file derives the bound of its kernels from these)
# ---------------------------------------------------------------------------------------------
# u: the unit roundoff of float32 (round to nearest).
U32 = 2.0**-24
# (1 + u)^4 - 1 = 4u + 6u^2 + ...: 0.1% covers the second-order terms many times over.
SECOND_ORDER_SLACK = 1.001


def dot_float32_error(x_f64, w_f64, pre_activation, u=U32):
    """The bound on |v32 - v| of a float32 linear layer v = act(x w^T + bias): float32
    accumulation of K products in any order (blocked, split, fused) is within
    gamma_{K+1} * sum_k |x_k w_k| of the exact sum, gamma_n = n u / (1 - n u) (Higham, Accuracy
    and Stability of Numerical Algorithms, Thm. 3.1; the +1 covers unfused products, exact for
    fp16/bf16 inputs anyway), u the unit roundoff of the accumulation; then the bias add
    (U32 |pre-activation|). ReLU is exact and 1-Lipschitz. A worst-case bound: real errors are
    ~sqrt(K) times smaller."""
    k = x_f64.shape[1]
    gamma = (k + 1) * u / (1 - (k + 1) * u)
    abs_dot = np.abs(x_f64) @ np.abs(w_f64).T
    return (gamma * abs_dot + U32 * np.abs(pre_activation)) * SECOND_ORDER_SLACK


def qkv_tolerances(x, w, b, hq, hkv, positions, cos_sin, style, dtype, u=U32):
    """(exact q, k, v; their element-wise tolerances) of the fused projection
    (ref.qkv_projection_f64): dot_float32_error of y (accumulation roundoff u) split by head,
    carried through the rotation of q and k (ref.rope_float32_error), then the rounding to
    dtype. positions None: no rotation."""
    d = w.shape[0] // (hq + 2 * hkv)
    y = ref.linear_f64(x, w, b, "none", dtype)
    as_f64 = lambda a: ref.to_f32(a, dtype).astype(np.float64)  # noqa: E731
    error = dot_float32_error(as_f64(x), as_f64(w), y, u)
    exact = ref.qkv_projection_f64(x, w, hq, hkv, dtype, b, positions, cos_sin, style)
    bounds = []
    for idx, (e, m) in enumerate(zip(ref.qkv_split(error, hq, hkv, d),
                                     ref.qkv_split(np.abs(y), hq, hkv, d))):
        if idx < 2 and positions is not None:
            e = ref.rope_float32_error(e, m, positions, cos_sin, style)
        bounds.append(e)
    return exact, [output_tolerance(v, e, dtype) for v, e in zip(exact, bounds)]


def output_tolerance(value, float32_error, out_dtype):
    """float32 error plus, for fp16/bf16, half an ulp of out_dtype at |v| + that error (ulp grows
    with the magnitude, and |v32| <= |v| + error). The smallest fp32 subnormal is added so that
    exact zeros compare with a non-zero tolerance."""
    tol = float32_error + 2.0**-149
    if out_dtype != "fp32":
        tol = tol + 0.5 * ref.ulp(np.abs(value) + float32_error, out_dtype)
    return tol


# A sanity bound on the norm-wise error ||got - ref|| / ||ref||: the element-wise tolerance is the
# check; the relative error is reported and must stay within a few ulps of the output dtype
# (its rounding alone gives ~2^-p / sqrt(3) for p significand bits).
MAX_REL_ULPS = 4
SIGNIFICAND_BITS = {"fp16": 11, "bf16": 8}
# Below this many outputs a norm is dominated by one or two values, which cancellation can make
# tiny (their absolute error is still bounded by the element-wise tolerance).
MIN_ELEMENTS_FOR_NORM = 64


def assert_meets_reference(got, value, error32, dtype, ctx):
    """got (float64 values of an output) within the element-wise tolerance of the exact value
    (float32 error error32, then the rounding to dtype), and within MAX_REL_ULPS in norm; prints
    ||err|| / ||ref|| and the largest |err|."""
    err = np.abs(got - value)
    norm = np.linalg.norm(value)
    rel = np.linalg.norm(got - value) / norm if norm > 0 else 0.0
    print(f"{ctx}: ||err||/||ref|| = {rel:.3g}, max |err| = {err.max():.3g}")
    assert_within(got, value, output_tolerance(value, error32, dtype), f"out ({dtype}), {ctx}")
    if value.size >= MIN_ELEMENTS_FOR_NORM and norm > 0:
        assert rel <= MAX_REL_ULPS * 2.0**-SIGNIFICAND_BITS[dtype], \
            f"{ctx}: ||err||/||ref|| = {rel:.3g}"


def write_buffers(buffers, hosts):
    """Writes each host array into its device buffer; a None buffer (an optional input left
    out) is skipped."""
    for buffer, host in zip(buffers, hosts):
        if buffer is not None:
            buffer.write(host)


def refill_scaled_gemm(call, rng, operand, scales):
    """KernelCall.refill of a GEMM with the scaled epilogue (INT8, FP8): fresh operands
    operand(rng, shape) into call.a and call.b, scales(rng, count, k) into call.scale_a and
    call.scale_b, a bias of call.out_dtype where the call has one; call.inputs follows."""
    n, k = call.mnk[1], call.mnk[2]
    a, b = operand(rng, call.a.shape), operand(rng, call.b.shape)
    scale_a = scales(rng, call.scale_a.shape[0], k)
    scale_b = scales(rng, call.scale_b.shape[0], k)
    bias = None if call.bias is None else random_normal(rng, n, call.out_dtype, 2.0)
    write_buffers((call.a, call.b, call.scale_a, call.scale_b, call.bias),
                  (a, b, scale_a, scale_b, bias))
    call.inputs = (a, b, scale_a, scale_b, bias)


def assert_within(got, want, tol, what):
    """|got - want| <= tol element by element (NaN fails); the message locates the worst."""
    err = np.abs(got - want)
    bad = ~(err <= tol)
    if not bad.any():
        return
    ratio = np.where(np.isnan(err), np.inf, err / tol)
    at = np.unravel_index(np.argmax(ratio), ratio.shape)
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    raise AssertionError(
        f"{what}: {int(bad.sum())} of {bad.size} elements beyond tolerance; worst at "
        f"{tuple(int(i) for i in at)}: got {got[at]!r}, expected {want[at]!r}, "
        f"|err| {err[at]:.4g} = {ratio[at]:.3g} x tol {tol[at]:.4g}; first at {first}: "
        f"got {got[first]!r}, expected {want[first]!r}")


def assert_relu_output(got, pre_activation, float32_error, what):
    """ReLU: no negative output, and exactly 0 where the value is certainly negative."""
    assert (got >= 0).all(), f"{what}: ReLU output has negative (or NaN) values"
    certainly_negative = pre_activation < -float32_error
    assert (got[certainly_negative] == 0).all(), f"{what}: ReLU of a negative value is not 0"
    # The data must exercise the clamp: it surely does with many columns (each bias has its own
    # sign); a narrow output whose bias dominates can be all positive (the fuzzer's N = 1).
    if got.size >= 64 and np.shape(got)[-1] >= 32:
        assert certainly_negative.any(), f"{what}: the test data must have negative values"


# ---------------------------------------------------------------------------------------------
# Guarded device buffers and bitwise comparison
# ---------------------------------------------------------------------------------------------
INPUT_GUARD = 0xCD
GUARD_BYTES = 256  # before and after every buffer; keeps cudaMalloc's 256-byte alignment

UINT_OF_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32}   # the bit patterns of an element


class GuardedBuffer:
    """A [shape] array of np_dtype in device memory, between two guard regions.

    An output starts filled with `poison` (guards included); an input holds `host` between
    guards of INPUT_GUARD. `misalign` extra bytes before the array move it off the 256-byte
    alignment of cudaMalloc (16 keeps it 16-byte aligned; an element's size keeps it element
    aligned). read() checks that the guards are intact.
    """

    def __init__(self, shape, np_dtype, *, poison=None, host=None, misalign=0):
        self.shape, self.dtype = tuple(shape), np.dtype(np_dtype)
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
        self.guard_byte = INPUT_GUARD if host is not None else poison
        self._start = GUARD_BYTES + misalign
        raw = np.full(self._start + self.nbytes + GUARD_BYTES, self.guard_byte, np.uint8)
        if host is not None:
            host = np.ascontiguousarray(host, dtype=self.dtype)
            assert host.shape == self.shape
            raw[self._start : self._start + self.nbytes] = host.reshape(-1).view(np.uint8)
        self._device = ck.DeviceArray.from_numpy(raw)

    @classmethod
    def output(cls, shape, np_dtype, poison, misalign=0):
        return cls(shape, np_dtype, poison=poison, misalign=misalign)

    @classmethod
    def input(cls, host, misalign=0):
        host = np.asarray(host)
        return cls(host.shape, host.dtype, host=host, misalign=misalign)

    @property
    def ptr(self):
        return self._device.ptr + self._start

    def poison(self):
        """Fills the array and its guards with the poison byte again (cudaMemset)."""
        self._device.fill_byte(self.guard_byte)

    def write(self, host):
        """Copies `host` into the array, in place (its address stays the same)."""
        assert host.shape == self.shape and host.dtype == self.dtype
        ck.cuda.memcpy_htod(self.ptr, np.ascontiguousarray(host))

    def read(self, what):
        """The array's contents, after checking that nothing was written around it."""
        raw = self._device.to_numpy()
        before, after = raw[: self._start], raw[self._start + self.nbytes :]
        if not ((before == self.guard_byte).all() and (after == self.guard_byte).all()):
            raise AssertionError(f"{what}: bytes outside the array were written (out of bounds)")
        return raw[self._start : self._start + self.nbytes].view(self.dtype).reshape(self.shape)

    def untouched(self):
        """True when neither the array nor its guards were written since the last poison."""
        return (self._device.to_numpy() == self.guard_byte).all()


def ptr_or_null(buffer):
    return 0 if buffer is None else buffer.ptr


def to_host(result):
    """A wrapper function's result as a NumPy array (a DeviceArray is copied back)."""
    return result.to_numpy() if isinstance(result, ck.DeviceArray) else np.asarray(result)


def to_device(host, dtype=None):
    """A DeviceArray copy of `host`; dtype: its reference name where the NumPy dtype does not say
    it (bf16)."""
    return ck.DeviceArray.from_numpy(host, ck_dtype=None if dtype is None else CK_DTYPE[dtype])


def assert_bitwise_equal(actual, expected, what):
    """Same shape, same dtype and the same bit pattern in every element."""
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    as_uint = UINT_OF_SIZE[actual.dtype.itemsize]
    got, want = actual.view(as_uint), expected.view(as_uint)
    if np.array_equal(got, want):
        return
    bad = np.argwhere(got != want)
    at = tuple(int(i) for i in bad[0])
    raise AssertionError(
        f"{what}: {len(bad)} of {got.size} elements differ; first at {at}: "
        f"got {actual[at].item()!r} (bits {int(got[at]):#x}), "
        f"expected {expected[at].item()!r} (bits {int(want[at]):#x})")


def nan_mask(a):
    """Where a holds NaN: float arrays directly, bfloat16 bit patterns (uint16) by their bits."""
    if a.dtype == np.uint16:
        return (a & 0x7FFF) > 0x7F80
    return np.isnan(a)


def assert_same_values(actual, expected, what):
    """Bitwise equal, except that a NaN matches a NaN of any sign and payload."""
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    got_nan, want_nan = nan_mask(actual), nan_mask(expected)
    assert np.array_equal(got_nan, want_nan), \
        f"{what}: NaN at {np.argwhere(got_nan != want_nan)[0]} in one and not the other"
    as_uint = UINT_OF_SIZE[actual.dtype.itemsize]
    got, want = actual.view(as_uint).copy(), expected.view(as_uint).copy()
    got[got_nan] = want[want_nan] = 0
    assert_bitwise_equal(got.view(actual.dtype), want.view(expected.dtype), what)


class FakeCudaArray:
    """Just a __cuda_array_interface__: enough for the wrapper's host-side checks, or for a
    foreign view of device memory (never dereferenced here). The default address is a fake one,
    256-byte aligned."""

    def __init__(self, shape, typestr="<f4", strides=None, ptr=0x7F0000100000, version=3):
        self.__cuda_array_interface__ = dict(shape=shape, typestr=typestr, data=(ptr, False),
                                             strides=strides, version=version)


# ---------------------------------------------------------------------------------------------
# One call of an entry point, and the checks every entry point gets
# ---------------------------------------------------------------------------------------------
class KernelCall:
    """One call of an entry point on guarded device buffers. A call holds the host copy of its
    inputs, uploads them once and compares its outputs with the reference of those inputs:

    launch(stream=0) makes the call; check(ctx) compares (after synchronizing); refill(rng)
    writes fresh random inputs into the same device buffers, as a CUDA graph replay needs (the
    graph holds their addresses). `outputs` ({name: GuardedBuffer}) is what the kernel writes.
    """

    outputs = {}

    def poison_outputs(self):
        for buffer in self.outputs.values():
            buffer.poison()

    def assert_outputs_untouched(self, ctx):
        for name, buffer in self.outputs.items():
            assert buffer.untouched(), f"{ctx}: {name} was written"


def launch_on_streams(calls, rounds=3):
    """Launches each call on a non-blocking stream of its own, `rounds` times over so that the
    streams' kernels overlap, and waits for them all (the caller checks the results)."""
    streams = [ck.cuda.stream_create(non_blocking=True) for _ in calls]
    try:
        for _ in range(rounds):
            for call, stream in zip(calls, streams):
                call.launch(stream)
        for stream in streams:
            ck.cuda.stream_synchronize(stream)
    finally:
        for stream in streams:
            ck.cuda.stream_destroy(stream)


def assert_graph_replays(call, rng, seed, replays=2):
    """Captures call.launch in a CUDA graph: the capture must record the launch without running
    it, and every replay must read the new contents of the same input buffers (refilled with
    fresh data) and write the whole (poisoned) output."""
    stream = ck.cuda.stream_create()
    try:
        with ck.cuda.graph_capture(stream) as graph:
            call.launch(stream)
        try:
            synchronize()
            call.assert_outputs_untouched("capture must record the launch, not run it")
            for replay in range(replays):
                call.refill(rng)
                call.poison_outputs()
                synchronize()
                graph.launch(stream)
                ck.cuda.stream_synchronize(stream)
                call.check(f"graph replay {replay}, seed={seed}")
        finally:
            graph.close()
    finally:
        ck.cuda.stream_destroy(stream)


def assert_capture_records_then_replay_writes(record, written, ctx):
    """Captures record(stream) in a CUDA graph: the capture must record it without running it
    (`written`, a GuardedBuffer the caller poisoned, stays untouched), then one replay runs it;
    the caller checks what the replay wrote."""
    stream = ck.cuda.stream_create()
    try:
        with ck.cuda.graph_capture(stream) as graph:
            record(stream)
        synchronize()
        assert written.untouched(), f"{ctx}: capture must record the call, not run it"
        graph.launch(stream)
        ck.cuda.stream_synchronize(stream)
        graph.close()
    finally:
        ck.cuda.stream_destroy(stream)


def assert_override_read_on_every_call(call, monkeypatch, env, seed):
    """`env` (a kernel override) is read on every call: forcing small_m on a call it cannot serve
    is rejected (CK_STATUS_UNSUPPORTED), and unsetting, emptying or resetting it serves the same
    call again, without rebuilding anything."""
    for value, ok in (("small_m", False), (None, True), ("auto", True), ("", True),
                      ("small_m", False), ("reference", True)):
        if value is None:
            monkeypatch.delenv(env, raising=False)
        else:
            monkeypatch.setenv(env, value)
        call.poison_outputs()
        if ok:
            call.launch()
            call.check(f"{env}={value!r}, seed={seed}")
        else:
            with pytest.raises(ck.CKError) as info:
                call.launch()
            assert info.value.status == ck.Status.UNSUPPORTED, (value, info.value.message)


def assert_forced_variant_unsupported(call, env, variant, must_say=None):
    """The call, with `env` forcing `variant`, is refused with CK_STATUS_UNSUPPORTED, names the
    override and the variant (and `must_say`), and writes nothing."""
    with pytest.raises(ck.CKError) as info:
        call.launch()
    message = info.value.message
    assert info.value.status == ck.Status.UNSUPPORTED, message
    assert env in message and variant in message, message
    if must_say:
        assert must_say in message, message
    synchronize()
    call.assert_outputs_untouched("a rejected call")
