"""What the GPU test files share: the skip marks, guarded device buffers, bitwise comparison,
and the checks that every entry point gets (graph capture and replay, the kernel override)."""
import functools
import os

import numpy as np
import pytest

import cuda_wrapper as ck


def _device_count():
    try:
        return ck.device_count()
    except (OSError, RuntimeError):  # the library, libcudart or the driver is missing
        return 0


@functools.lru_cache(maxsize=None)
def compute_capability():
    """(major, minor) of the current device, asked once."""
    return ck.cuda.compute_capability()


# `pytestmark = GPU_MARKS` in a test file: marked gpu, skipped (with the reason) without a device.
GPU_MARKS = [
    pytest.mark.gpu,
    pytest.mark.skipif(_device_count() == 0, reason="no CUDA device: GPU tests need one"),
]

# Under compute-sanitizer (make sanitize) kernels run ~100x slower: the files shrink their shapes.
SANITIZE = os.environ.get("CK_SANITIZE") == "1"

INPUT_GUARD = 0xCD
GUARD_BYTES = 256  # before and after every buffer; keeps cudaMalloc's 256-byte alignment

_UINT_OF_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def shape_id(shape):
    return "x".join(map(str, shape))


def synchronize():
    ck.cuda.device_synchronize()


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


def assert_bitwise_equal(actual, expected, what):
    """Same shape, same dtype and the same bit pattern in every element."""
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    as_uint = _UINT_OF_SIZE[actual.dtype.itemsize]
    got, want = actual.view(as_uint), expected.view(as_uint)
    if np.array_equal(got, want):
        return
    bad = np.argwhere(got != want)
    at = tuple(int(i) for i in bad[0])
    raise AssertionError(
        f"{what}: {len(bad)} of {got.size} elements differ; first at {at}: "
        f"got {actual[at].item()!r} (bits {int(got[at]):#x}), "
        f"expected {expected[at].item()!r} (bits {int(want[at]):#x})")


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
