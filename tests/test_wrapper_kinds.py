"""The wrapper's plumbing that needs no GPU: the DeviceArray pool's bookkeeping (on a fake
runtime that counts what it is asked), the array kinds (a fake CuPy module stands in for the
framework: the convenience functions must allocate their results through it, run on its current
stream, or on stream= made current for the call), and, where torch is installed, the torch
pieces that run on the CPU (CPU tensors' bf16 bits, the custom operators' fake implementations,
and torch.compile tracing a layer into its operator). tests/test_frameworks_gpu.py runs the same
paths on a GPU with the real frameworks.
"""
import contextlib
import ctypes
import os
import subprocess
import sys
import types

import numpy as np
import pytest

import cuda_wrapper as ck
from cuda_wrapper import DType
from gpu_support import FakeCudaArray

# ------------------------------------------------------------------------------------------------
# The pool, on a fake runtime
# ------------------------------------------------------------------------------------------------
OUT_OF_MEMORY = 2   # cudaErrorMemoryAllocation


class FakeRuntime:
    """What _BlockPool calls, with counters. Device pointers are made up; an event is done
    once the test says so (done_events); the next `fail_mallocs` cudaMallocs run out of
    memory."""

    def __init__(self):
        self.device = 0
        self.next_ptr = 0x7F0000000000
        self.live = {}           # ptr -> size
        self.events = set()
        self.recorded = []       # (event, stream)
        self.done_events = set()
        self.queries = 0
        self.fail_mallocs = 0

    def current_device(self):
        return self.device

    def malloc(self, size):
        if self.fail_mallocs:
            self.fail_mallocs -= 1
            raise ck.CUDAError(OUT_OF_MEMORY, "cudaMalloc", "out of memory")
        ptr, self.next_ptr = self.next_ptr, self.next_ptr + size
        self.live[ptr] = size
        return ptr

    def free(self, ptr):
        del self.live[ptr]

    def event_create(self):
        event = 0xE000 + len(self.events) + len(self.recorded) * 0x100
        self.events.add(event)
        return event

    def event_destroy(self, event):
        self.events.remove(event)

    def event_record(self, event, stream):
        self.done_events.discard(event)
        self.recorded.append((event, stream))

    def event_done(self, event):
        self.queries += 1
        return event in self.done_events


@pytest.fixture
def pool():
    runtime = FakeRuntime()
    capture = [False]
    pool = ck._BlockPool(runtime, lambda: capture[0])
    pool.runtime, pool.capture = runtime, capture
    return pool


@pytest.mark.parametrize("nbytes, size", [
    (1, 512), (512, 512), (513, 1024), (4096, 4096), (4097, 8192), (1 << 20, 1 << 20),
    ((1 << 20) + 1, 2 << 20), ((2 << 20) + 1, 4 << 20), ((5 << 20) + 7, 6 << 20),
])
def test_size_classes(nbytes, size):
    assert ck._size_class(nbytes) == size
    assert size % 256 == 0, "every block keeps cudaMalloc's alignment"


def test_pool_reuses_a_block_on_its_stream_without_asking(pool):
    rt = pool.runtime
    block = pool.allocate(1000, stream=7)
    assert block.size == 1024 and rt.live == {block.ptr: 1024}
    pool.record(block, 7)
    pool.release(block)
    assert rt.recorded == [(block.event, 7)], "an event is recorded where the work was"
    again = pool.allocate(600, stream=7)
    assert again is block and rt.queries == 0, "stream order makes the reuse safe"
    stats = pool.stats()
    assert (stats["mallocs"], stats["reuses"], stats["in_use"], stats["cached"]) == (1, 1, 1, 0)


def test_pool_waits_for_the_event_before_another_stream_takes_a_block(pool):
    rt = pool.runtime
    block = pool.allocate(4096, stream=7)
    pool.record(block, 7)
    pool.release(block)
    other = pool.allocate(4096, stream=9)           # the event has not completed
    assert other is not block and rt.queries == 1 and len(rt.live) == 2
    rt.done_events.add(block.event)
    third = pool.allocate(4096, stream=9)
    assert third is block, "once the event is done any stream may take it"
    pool.record(third, 9)
    pool.release(third)
    assert pool.allocate(4096, stream=9) is block


def test_pool_idle_blocks_go_to_any_stream(pool):
    block = pool.allocate(100, stream=7)
    pool.release(block, idle=True)
    assert pool.runtime.recorded == [], "no event for work known to be done"
    assert pool.allocate(100, stream=3) is block and pool.runtime.queries == 0


def test_pool_treats_none_and_legacy_as_one_stream(pool):
    block = pool.allocate(100)
    pool.record(block, 0)                        # stream not known: the legacy stream
    pool.release(block)
    assert pool.runtime.recorded[-1] == (block.event, 0)
    assert pool.allocate(100, stream=1) is block     # cudaStreamLegacy is that stream too


def test_pool_gives_an_allocation_for_unknown_streams_only_finished_blocks(pool):
    rt = pool.runtime
    block = pool.allocate(100, stream=0)
    pool.record(block, 0)
    pool.release(block)
    other = pool.allocate(100)        # e.g. DeviceArray.empty: used on any stream after
    assert other is not block and rt.queries == 1
    rt.done_events.add(block.event)
    assert pool.allocate(100) is block


def test_pool_bins_by_size_and_device(pool):
    rt = pool.runtime
    small = pool.allocate(100, stream=5)
    pool.release(small, idle=True)
    big = pool.allocate(5000, stream=5)
    assert big is not small
    rt.device = 1
    on_one = pool.allocate(100, stream=5)
    assert on_one is not small and on_one.device == 1
    rt.device = 0
    assert pool.allocate(100, stream=5) is small


def test_pool_defers_releases_during_a_capture(pool):
    rt = pool.runtime
    block = pool.allocate(100, stream=7)
    idle = pool.allocate(100, stream=7)
    pool.release(idle, idle=True)
    pool.record(block, 7)                          # its call, before the capture
    pool.capture[0] = True
    pool.release(block)
    assert rt.recorded == [(block.event, 7)] and pool.stats()["deferred"] == 1
    # During the capture only idle blocks are handed out: no query, no pending block.
    assert pool.allocate(100, stream=7) is idle
    fresh = pool.allocate(100, stream=7)
    assert fresh is not block and rt.queries == 0
    pool.capture[0] = False
    pool.flush()
    assert rt.recorded == [(block.event, 7)], "release records nothing"
    assert pool.allocate(100, stream=7) is block


def test_pool_out_of_memory_frees_the_cache_and_retries(pool):
    rt = pool.runtime
    blocks = [pool.allocate(4096, stream=7) for _ in range(3)]
    for block in blocks:
        pool.record(block, 7)
        pool.release(block)
    rt.fail_mallocs = 1
    big = pool.allocate(8 << 20, stream=7)
    assert rt.live == {big.ptr: 8 << 20}, "the cached blocks were given back first"
    assert rt.events == {big.event}
    stats = pool.stats()
    assert stats["frees"] == 3 and stats["cached"] == 0 and stats["in_use"] == 1
    rt.fail_mallocs = 2
    with pytest.raises(ck.CUDAError):
        pool.allocate(8 << 20, stream=7)


def test_pool_trim_frees_every_cached_block(pool):
    rt = pool.runtime
    kept = pool.allocate(100, stream=7)
    cached = pool.allocate(100, stream=7)
    pool.record(cached, 7)
    pool.release(cached)
    assert pool.stats()["cached_bytes"] == 512
    assert pool.trim() == 1
    assert rt.live == {kept.ptr: 512} and rt.events == {kept.event}
    assert pool.stats()["cached"] == 0 and pool.stats()["in_use_bytes"] == 512


def test_pool_waits_for_every_stream_that_used_a_block(pool):
    rt = pool.runtime
    block = pool.allocate(100, stream=7)
    pool.record(block, 7)
    pool.record(block, 9)                          # a call on another stream used it too
    pool.record(block, 7)                          # its own stream again: the same event
    pool.release(block)
    (main, on_7), (extra, on_9), again_7 = rt.recorded
    assert (main, on_7, on_9) == (block.event, 7, 9) and extra != main
    assert again_7 == (main, 7)
    others = [pool.allocate(100, stream=3)]
    assert others[0] is not block, "stream 3 waits for 7 and 9"
    rt.done_events.add(main)
    others.append(pool.allocate(100, stream=3))
    assert others[1] is not block
    rt.done_events.add(extra)
    assert pool.allocate(100, stream=3) is block
    assert block.extra is None and block.stream is None, "its events are done: idle"
    pool.record(block, 3)
    pool.release(block)
    again = pool.allocate(100, stream=5)           # block is pending on 3: a new one
    pool.record(again, 5)
    pool.record(again, 4)
    assert rt.recorded[-1] == (extra, 4), "spare events are recorded again"
    pool.release(again)
    for other in others:
        pool.release(other, idle=True)
    assert pool.trim() == 4 and rt.events == set() and rt.live == {}


def test_a_failed_event_record_makes_the_block_untracked(pool):
    rt = pool.runtime
    block = pool.allocate(100, stream=7)

    def fail(event, stream):
        raise ck.CUDAError(400, "cudaEventRecord", "invalid resource handle")

    rt.event_record = fail
    pool.record(block, 7)
    assert block.untracked
    pool.release(block)                 # cudaFree'd (waits for the device), not cached
    assert block.ptr not in rt.live and pool.stats()["cached"] == 0


@pytest.fixture
def fake_pool(monkeypatch):
    """The module's pool on a fake runtime (DeviceArray.empty and free use it)."""
    runtime = FakeRuntime()
    pool = ck._BlockPool(runtime, lambda: False)
    monkeypatch.setattr(ck, "_pool", pool)
    pool.runtime = runtime
    return pool


def test_device_array_memory_comes_from_the_pool(fake_pool):
    a = ck.DeviceArray.empty((16, 16), np.float32, stream=5)
    assert a.stream == 5 and a._owner and fake_pool.stats()["in_use"] == 1
    ptr = a.ptr
    a.free()
    a.free()
    assert fake_pool.runtime.recorded == [], "free records nothing"
    b = ck.DeviceArray.empty((1000,), np.uint8, stream=5)
    assert b.ptr == ptr and fake_pool.stats()["reuses"] == 1
    b.record_stream()
    assert fake_pool.runtime.recorded == [(b._block.event, 5)]
    del b
    assert fake_pool.stats()["in_use"] == 0, "collected arrays go back too"
    empty = ck.DeviceArray.empty((0, 4), np.float32)
    assert empty.ptr == 0 and fake_pool.stats()["mallocs"] == 1


def test_device_calls_take_outputs_from_the_pool_and_never_synchronize(fake_pool, monkeypatch):
    """A call on foreign CUDA arrays: the outputs are pool DeviceArrays on the call's stream, a
    Python scale is uploaded asynchronously into a pool block released right after the launch
    (reused only in the stream's order), and nothing synchronizes."""
    launches, copies = [], []
    monkeypatch.setattr(ck.raw, "gemm_int8_scaled", lambda *args: launches.append(args))
    monkeypatch.setattr(ck.cuda, "memcpy_htod", lambda ptr, a, stream=None:
                        copies.append((ptr, a.copy(), stream)))
    monkeypatch.setattr(ck.cuda, "stream_synchronize", lambda *a: pytest.fail("synchronized"))
    stream = 0x5000
    a = FakeCudaArray((4, 32), "|i1", ptr=0x7F0000100000)
    a.__cuda_array_interface__["stream"] = stream
    b = FakeCudaArray((16, 32), "|i1", ptr=0x7F0000200000)
    scale_b = FakeCudaArray((16,), "<f4", ptr=0x7F0000300000)
    for round_ in range(3):
        y = ck.gemm_int8_scaled(a, b, 0.5, scale_b, out_dtype="bf16")
        assert isinstance(y, ck.DeviceArray) and y.shape == (4, 16)
        assert y.ck_dtype == DType.BF16 and y.stream == stream
        args = launches[-1]
        assert args[0] == 0x7F0000100000 and args[12] == y.ptr and args[-1] == stream
        ptr, host, copy_stream = copies[-1]
        assert args[6] == ptr and host.tolist() == [0.5] and copy_stream == stream
        del y
    stats = fake_pool.stats()
    assert stats["mallocs"] == 2 and stats["reuses"] == 4 and stats["in_use"] == 0
    assert all(s == stream for _, s in fake_pool.runtime.recorded)


def test_temporaries_of_a_captured_call_live_as_long_as_its_result(fake_pool, monkeypatch):
    """During a stream capture the graph reads a call's temporaries at every replay: the first
    result keeps them (as the caller keeps the result for the graph)."""
    monkeypatch.setattr(ck.raw, "gemm_int8_scaled", lambda *args: None)
    monkeypatch.setattr(ck.cuda, "memcpy_htod", lambda *args, **kwargs: None)
    monkeypatch.setattr(ck, "_any_capture", lambda: True)
    a = FakeCudaArray((4, 32), "|i1", ptr=0x7F0000100000)
    b = FakeCudaArray((16, 32), "|i1", ptr=0x7F0000200000)
    y = ck.gemm_int8_scaled(a, b, 0.5, 0.25)
    stats = fake_pool.stats()
    assert stats["in_use"] == 3 and stats["releases"] == 0, "the output and two scales"
    del y
    assert fake_pool.stats()["in_use"] == 0


def test_device_arrays_used_on_another_stream_wait_for_it(fake_pool, monkeypatch):
    monkeypatch.setattr(ck.raw, "quantize_int8", lambda *args: None)
    rt = fake_pool.runtime
    x = ck.DeviceArray.empty((4, 64), np.float32)          # its stream: not known (legacy)
    view = x.reshape(256)
    q, s = ck.quantize_int8(view, stream=0x77)
    assert x._block.stream == 0x77 and q.stream == 0x77 and q._block.stream == 0x77
    assert len(rt.recorded) == 3 and {st for _, st in rt.recorded} == {0x77}
    q2 = ck.DeviceArray.empty((256,), np.int8, stream=0x66)
    ck.quantize_int8(x, out=(q2, None), stream=0x77)
    assert q2._block.stream == 0x77
    ck.quantize_int8(x, out=(q2, None), stream=0x66)     # a second stream: an extra event
    assert set(x._block.extra) == {0x66}
    del view
    in_use = fake_pool.stats()["in_use"]
    before = len(rt.recorded)
    x.free()
    assert fake_pool.stats()["in_use"] == in_use - 1 and len(rt.recorded) == before


# ------------------------------------------------------------------------------------------------
# Array kinds, with a fake CuPy
# ------------------------------------------------------------------------------------------------
class FakeCupyArray:
    """The part of cupy.ndarray the wrapper reads. Without ptr (the constructor as CuPy's
    cupy.ndarray(shape, dtype)) it takes new memory from the fake module's pool."""

    module = None   # the fake cupy of the test (make_fake_cupy)

    def __init__(self, shape, dtype, ptr=None, device_id=0, contiguous=True):
        if ptr is None:
            ptr, device_id = FakeCupyArray.module.allocate(shape, dtype)
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.data = types.SimpleNamespace(ptr=ptr, device_id=device_id)
        self.flags = types.SimpleNamespace(c_contiguous=contiguous)
        self.strides = None


class Recorder(contextlib.AbstractContextManager):
    def __init__(self, log, what):
        self.log, self.what = log, what

    def __enter__(self):
        self.log.append(("enter", self.what))

    def __exit__(self, *exc):
        self.log.append(("exit", self.what))


def make_fake_cupy():
    cupy = types.ModuleType("cupy")
    cupy.ndarray = FakeCupyArray
    cupy.log = []
    cupy.current = [0xC0DE]
    cupy.device = [0]
    cupy.next_ptr = [0x7E0000000000]

    def allocate(shape, dtype):
        """(ptr, device) of a new allocation, logged as ("empty", shape, dtype)."""
        cupy.log.append(("empty", tuple(shape), np.dtype(dtype).name))
        ptr = cupy.next_ptr[0]
        cupy.next_ptr[0] += 4096
        return ptr, cupy.device[0]

    def empty(shape, dtype):
        return FakeCupyArray(shape, dtype)

    def full(shape, value, dtype):
        cupy.log.append(("full", value, np.dtype(dtype).name))
        ptr = cupy.next_ptr[0]
        cupy.next_ptr[0] += 4096
        return FakeCupyArray(shape, dtype, ptr, device_id=cupy.device[0])

    cupy.allocate, cupy.empty, cupy.full = allocate, empty, full
    cupy.cuda = types.SimpleNamespace(
        get_current_stream=lambda: types.SimpleNamespace(ptr=cupy.current[0]),
        runtime=types.SimpleNamespace(getDevice=lambda: cupy.device[0]),
        Device=lambda index: Recorder(cupy.log, ("device", index)),
        ExternalStream=lambda ptr: Recorder(cupy.log, ("stream", ptr)),
        Stream=types.SimpleNamespace(null=Recorder(cupy.log, ("stream", 0))))
    return cupy


@pytest.fixture
def cupy(monkeypatch):
    """A fake cupy in sys.modules, with the wrapper's kind caches fresh (and restored after)."""
    fake = make_fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(FakeCupyArray, "module", fake)
    monkeypatch.setattr(ck, "_KIND_OF_TYPE", {})
    monkeypatch.setattr(ck, "_KINDS", {})
    return fake


def record_launches(monkeypatch, names, calls):
    """Every launch of the entry points ck_<name> (the raw level's, through ck._entries, and
    the fast paths', through ck._fast_entries), recorded in calls as (name, args) instead of
    made; each returns CK_STATUS_SUCCESS."""
    for name in names:
        def launch(*args, _name=name):
            calls.append((_name, args))
            return 0

        monkeypatch.setattr(ck._entries, "ck_" + name, launch)
        monkeypatch.setattr(ck._fast_entries, "ck_" + name, launch)


@pytest.fixture
def launches(monkeypatch):
    """Every quantize_int8 / gemm_int8_scaled / gemm_(sparse_)w4a16_prepacked / moe_forward
    launch, recorded instead of made."""
    calls = []
    record_launches(monkeypatch, ("quantize_int8", "gemm_int8_scaled", "gemm_w4a16_prepacked",
                                  "gemm_sparse_w4a16_prepacked", "moe_forward"), calls)
    monkeypatch.setattr(ck.raw, "moe_workspace_size", lambda params: 4096)
    return calls


def test_kinds_come_from_the_type(cupy):
    x = FakeCupyArray((2, 4), np.float32, 0x1000)
    kind = ck._kind(x)
    assert kind is not None and kind.name == "cupy" and ck._kind(x) is kind
    assert ck._kind(np.zeros(2)) is None and ck._kind(FakeCudaArray((2,))) is None
    assert ck._kind(ck.DeviceArray(0x1000, (2,), np.float32)) is None
    assert ck._is_device(x) and not ck._is_device(np.zeros(2))
    assert ck._cai(x, "x") == (0x1000, (2, 4), np.dtype(np.float32), False, None)


def test_importing_the_module_imports_no_framework():
    code = ("import sys, cuda_wrapper\n"
            "print(sorted(m for m in ('torch', 'cupy') if m in sys.modules))")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_cupy_in_cupy_out_on_the_current_stream(cupy, launches):
    x = FakeCupyArray((3, 64), np.float16, 0x1000)
    q, s = ck.quantize_int8(x, granularity="row")
    assert isinstance(q, FakeCupyArray) and isinstance(s, FakeCupyArray)
    assert (q.shape, q.dtype, s.shape, s.dtype) == ((3, 64), np.int8, (3,), np.float32)
    assert cupy.log == [("empty", (3, 64), "int8"), ("empty", (3,), "float32")]
    name, args = launches[-1]
    assert args[0] == 0x1000 and args[1] == DType.FP16 and args[6] == s.data.ptr
    assert args[7] == q.data.ptr and args[-1] == 0xC0DE


def test_cupy_scalar_scales_are_filled_on_the_device(cupy, launches, monkeypatch):
    monkeypatch.setattr(ck.cuda, "memcpy_htod", lambda *a, **k: pytest.fail("host copy"))
    x = FakeCupyArray((2, 64), np.float32, 0x1000)
    q, s = ck.quantize_int8(x, scales=0.25)
    assert ("full", 0.25, "float32") in cupy.log and isinstance(s, FakeCupyArray)
    assert launches[-1][1][6] == s.data.ptr


def test_cupy_stream_argument_is_made_current_for_the_call(cupy, launches):
    x = FakeCupyArray((2, 64), np.float32, 0x1000)
    ck.quantize_int8(x, stream=0xBEEF)
    assert cupy.log[0] == ("enter", ("stream", 0xBEEF)) and cupy.log[-1] == ("exit",
                                                                            ("stream", 0xBEEF))
    assert [entry[0] for entry in cupy.log[1:-1]] == ["empty", "empty"], "allocated inside"
    assert launches[-1][1][-1] == 0xBEEF
    cupy.log.clear()
    ck.quantize_int8(x, stream=0xC0DE)           # the current stream already: no context
    assert [entry[0] for entry in cupy.log] == ["empty", "empty"]


def test_stream_objects_are_taken_for_their_handle(cupy, launches):
    x = FakeCupyArray((2, 64), np.float32, 0x1000)
    ck.quantize_int8(x, stream=types.SimpleNamespace(ptr=0xBEEF))        # a CuPy stream
    assert launches[-1][1][-1] == 0xBEEF
    ck.quantize_int8(x, stream=types.SimpleNamespace(cuda_stream=0xFEED))  # a torch stream
    assert launches[-1][1][-1] == 0xFEED
    with pytest.raises(TypeError, match="stream"):
        ck.quantize_int8(x, stream="default")


def test_cupy_call_runs_on_the_array_device(cupy, launches):
    x = FakeCupyArray((2, 64), np.float32, 0x1000, device_id=1)
    ck.quantize_int8(x)
    assert cupy.log[0] == ("enter", ("device", 1)) and cupy.log[-1] == ("exit", ("device", 1))


def test_cupy_arrays_of_another_device_are_refused(cupy, launches):
    a = FakeCupyArray((4, 32), np.int8, 0x1000)
    b = FakeCupyArray((16, 32), np.int8, 0x2000, device_id=1)
    with pytest.raises(ValueError, match="device 1"):
        ck.gemm_int8_scaled(a, b, 1.0, 1.0)
    assert not launches


@pytest.mark.parametrize("make, error", [
    (lambda: FakeCupyArray((4, 8), np.float32, 0x1000, contiguous=False), ValueError),
    (lambda: FakeCupyArray((4, 8), np.float64, 0x1000), TypeError),
    (lambda: FakeCupyArray((2, 2, 2), np.float32, 0x1000), ValueError),
], ids=["strided", "float64", "3d"])
def test_cupy_bad_inputs_are_refused_before_anything_is_allocated(cupy, launches, make, error):
    with pytest.raises(error):
        ck.quantize_int8(make())
    assert cupy.log == [] and not launches


# The common calls that take the framework fast path (no _Call): one C-contiguous array per
# argument, of one kind, on the current device, no out= or stream=.
def fast_path_calls():
    x16 = FakeCupyArray((3, 64), np.float16, 0x1000)
    x32 = FakeCupyArray((64,), np.float32, 0x1800)
    a = FakeCupyArray((3, 32), np.int8, 0x2000)
    b = FakeCupyArray((16, 32), np.int8, 0x3000)
    b_kn = FakeCupyArray((32, 16), np.int8, 0x3800)
    sa = FakeCupyArray((3,), np.float32, 0x4000)
    sb = FakeCupyArray((16,), np.float32, 0x5000)
    s1 = FakeCupyArray((1,), np.float32, 0x6000)
    bias = FakeCupyArray((16,), np.uint16, 0x7000)
    # Prepacked INT4 weights of N = 16, K = 256 (their sizes from the library), dense and 2:4.
    n, k = 16, 256
    w = FakeCupyArray((ck.raw.w4a16_prepacked_bytes(n, k),), np.uint8, 0x8000)
    ws = FakeCupyArray((ck.raw.w4a16_prepacked_groups(n, k, 64),), np.float16, 0x9000)
    wz = FakeCupyArray((ck.raw.w4a16_prepacked_groups(n, k, 64),), np.uint8, 0xA000)
    sp = FakeCupyArray((ck.raw.sparse_w4a16_prepacked_bytes(n, k),), np.uint8, 0xB000)
    sps = FakeCupyArray((ck.raw.sparse_w4a16_prepacked_groups(n, k, 128),), np.uint16, 0xC000)
    xk = FakeCupyArray((3, k), np.float16, 0xD000)
    xk_1d = FakeCupyArray((k,), np.float16, 0xD800)
    xk_bf16 = FakeCupyArray((k,), np.uint16, 0xE000)
    bias16 = FakeCupyArray((n,), np.float16, 0xF000)
    return {
        "w4a16 prepacked, zeros, bias, relu": lambda: ck.gemm_w4a16_prepacked(
            xk, w, ws, wz, n=n, group_size=64, bias=bias16, activation="relu"),
        "w4a16 prepacked, 1-D": lambda: ck.gemm_w4a16_prepacked(xk_1d, w, ws, n=n,
                                                                group_size=64),
        "sparse prepacked, bf16": lambda: ck.gemm_sparse_w4a16_prepacked(
            xk_bf16, sp, sps, n=n, dtype="bf16"),
        "quantize per row": lambda: ck.quantize_int8(x16, granularity="row"),
        "quantize per tensor, 1-D": lambda: ck.quantize_int8(x32),
        "quantize static": lambda: ck.quantize_int8(x16, scales=s1),
        "gemm per row": lambda: ck.gemm_int8_scaled(a, b, sa, sb, out_dtype="fp16"),
        "gemm per tensor, kn, bf16 bias, relu": lambda: ck.gemm_int8_scaled(
            a, b_kn, s1, s1, bias=bias, activation="relu", out_dtype="bf16", layout="kn"),
        "gemm 1-D a": lambda: ck.gemm_int8_scaled(FakeCupyArray((32,), np.int8, 0x2000), b, s1,
                                                  sb),
    }


@pytest.mark.parametrize("name", list(fast_path_calls()))
def test_cupy_common_calls_take_the_fast_path(cupy, launches, monkeypatch, name):
    """Without a _Call, the same allocations, launch arguments and results as the general
    path."""
    def run():
        cupy.log.clear()
        cupy.next_ptr[0] = 0x7E0000000000
        launches.clear()
        result = fast_path_calls()[name]()
        results = result if isinstance(result, tuple) else (result,)
        return (list(cupy.log), launches[-1],
                [(r.shape, r.dtype, r.data.ptr) for r in results])

    with monkeypatch.context() as m:
        m.setattr(ck, "_fast_kind", lambda *args: None)
        general = run()

    class NoCall:
        def __init__(self, *args):
            raise AssertionError("the common call must not build a _Call")

    monkeypatch.setattr(ck, "_Call", NoCall)
    assert run() == general


def test_cupy_first_call_takes_the_fast_path(cupy, launches, monkeypatch):
    """The first call on an array type not seen yet takes the fast path too (the kind is
    found and kept on the way)."""
    class NoCall:
        def __init__(self, *args):
            raise AssertionError("the common call must not build a _Call")

    monkeypatch.setattr(ck, "_Call", NoCall)
    assert type(FakeCupyArray((1,), np.float32, 0x10)) not in ck._KIND_OF_TYPE
    q, s = ck.quantize_int8(FakeCupyArray((3, 64), np.float16, 0x1000), granularity="row")
    assert isinstance(q, FakeCupyArray) and isinstance(s, FakeCupyArray) and launches


@pytest.mark.parametrize("call, error, match", [
    (lambda a, b, s: ck.gemm_int8_scaled(a, FakeCupyArray((16, 48), np.int8, 0x3000), s, s),
     ValueError, "K=32"),
    (lambda a, b, s: ck.gemm_int8_scaled(a, b, FakeCupyArray((2,), np.float32, 0x4000), s),
     ValueError, "scale_a has 2 values"),
    (lambda a, b, s: ck.gemm_int8_scaled(a, b, FakeCupyArray((1,), np.float64, 0x4000), s),
     TypeError, "scale_a has dtype float64"),
    (lambda a, b, s: ck.gemm_int8_scaled(a, b, s, s, bias=FakeCupyArray((16,), np.float32,
                                                                        0x7000),
                                         out_dtype="fp16"),
     TypeError, "bias has dtype float32"),
    (lambda a, b, s: ck.gemm_int8_scaled(FakeCupyArray((3, 32), np.uint8, 0x2000), b, s, s),
     TypeError, "a has dtype uint8"),
    (lambda a, b, s: ck.quantize_int8(FakeCupyArray((3, 32), np.float32, 0x1000), scales=s,
                                      granularity="row"),
     ValueError, "scales has 1 values"),
    (lambda a, b, s: ck.gemm_w4a16_prepacked(
        FakeCupyArray((3, 256), np.float16, 0x1000),
        FakeCupyArray((ck.raw.w4a16_prepacked_bytes(16, 256),), np.uint8, 0x2000),
        FakeCupyArray((3,), np.float16, 0x3000), n=16),
     ValueError, "scales_prepacked has 3 values"),
    (lambda a, b, s: ck.gemm_w4a16_prepacked(
        FakeCupyArray((3, 256), np.float16, 0x1000),
        FakeCupyArray((ck.raw.w4a16_prepacked_bytes(16, 256),), np.int8, 0x2000),
        FakeCupyArray((ck.raw.w4a16_prepacked_groups(16, 256, 128),), np.float16, 0x3000),
        n=16),
     TypeError, "w_prepacked has dtype int8"),
], ids=["k-mismatch", "scale-count", "scale-dtype", "bias-dtype", "a-dtype", "static-count",
        "prepacked-scale-count", "prepacked-w-dtype"])
def test_cupy_fast_path_leaves_bad_calls_to_the_general_path(cupy, launches, call, error,
                                                              match):
    """What the fast path does not take gets the general path's exception, and no launch."""
    a = FakeCupyArray((3, 32), np.int8, 0x2000)
    b = FakeCupyArray((16, 32), np.int8, 0x3000)
    s = FakeCupyArray((1,), np.float32, 0x4000)
    with pytest.raises(error, match=match):
        call(a, b, s)
    assert not launches


def test_cupy_fast_path_asks_for_the_stream_and_device_on_every_call(cupy, launches):
    """Nothing about the current stream or device is kept from one call to the next: a stream
    made current between calls is the next call's, and a call after another device was made
    current takes the general path (which enters the array's device)."""
    x = FakeCupyArray((2, 64), np.float16, 0x1000)
    a = FakeCupyArray((2, 32), np.int8, 0x2000)
    b = FakeCupyArray((16, 32), np.int8, 0x3000)
    s = FakeCupyArray((1,), np.float32, 0x4000)
    for current in (0xC0DE, 0xBEEF, 0xC0DE):
        cupy.current[0] = current
        ck.quantize_int8(x)
        ck.gemm_int8_scaled(a, b, s, s)
    assert [args[-1] for _, args in launches] == [0xC0DE] * 2 + [0xBEEF] * 2 + [0xC0DE] * 2
    assert not any(entry[0] == "enter" for entry in cupy.log), "the fast path entered nothing"
    cupy.device[0] = 1
    ck.quantize_int8(x)
    assert ("enter", ("device", 0)) in cupy.log and launches[-1][1][-1] == 0xC0DE


def test_fast_path_raises_what_the_library_refuses(cupy, monkeypatch):
    """The fast path checks the status of its launch itself: a refusal raises CKError naming
    the entry point, as on the raw level."""
    def refuse(*args):
        return int(ck.Status.INVALID_VALUE)

    refuse.__name__ = "ck_quantize_int8"
    monkeypatch.setattr(ck._entries, "ck_quantize_int8", refuse)
    monkeypatch.setattr(ck._fast_entries, "ck_quantize_int8", refuse)
    with pytest.raises(ck.CKError) as info:
        ck.quantize_int8(FakeCupyArray((2, 64), np.float16, 0x1000))
    assert info.value.status == ck.Status.INVALID_VALUE
    assert info.value.function == "ck_quantize_int8"
    with pytest.raises(ck.CKError):
        ck.raw.quantize_int8(0x1000, DType.FP16, 2, 64, ck.PER_TENSOR, ck.DYNAMIC, 0x2000,
                             0x3000)


def test_raw_entries_return_the_status_and_keep_the_declarations():
    """The raw level and the fast paths call functions of their own (no errcheck: the status
    comes back as an int); the library's functions keep theirs (a failure raises)."""
    declared = ck.load_library().ck_quantize_int8
    entry = ck._entries.ck_quantize_int8
    assert entry is not declared and entry is ck._entries.ck_quantize_int8
    assert entry.argtypes == declared.argtypes and entry.restype is ctypes.c_int
    assert entry.__name__ == "ck_quantize_int8" and declared.errcheck is not None
    status = entry(0, DType.FP16, 2, 64, ck.PER_TENSOR, ck.DYNAMIC, 0, 0, 0)   # NULL x
    assert status == ck.Status.INVALID_VALUE
    assert ck.last_error_message().startswith("ck_quantize_int8: ")
    with pytest.raises(AttributeError):
        ck._entries.not_an_entry_point


def test_fast_entries_pass_integers_as_words():
    """The fast paths' functions take every integer argument as c_void_p (one 64-bit word):
    the library still reads each parameter's value, negative and 64-bit sizes and 32-bit enums
    included (its refusals name them, as for the declared functions), and struct pointers keep
    their type."""
    fast = ck._fast_entries.ck_quantize_int8
    declared = ck._entries.ck_quantize_int8
    assert fast is not declared and fast.restype is ctypes.c_int
    if not ck._WORD_ARGUMENTS:
        assert fast.argtypes == declared.argtypes
        pytest.skip("this platform's calling convention takes the declared argument types")
    assert set(fast.argtypes) == {ctypes.c_void_p}
    x, s, q = 0x1000, 0x2000, 0x3000
    big = 1 << 62   # its low 32 bits are 0: a truncated value would read as cols=0
    cases = [
        ((x, DType.FP16, -3, 64, ck.PER_TENSOR, ck.DYNAMIC, s, q, 0), "rows=-3 "),
        ((x, DType.FP16, 2, big, ck.PER_TENSOR, ck.DYNAMIC, s, q, 0), "cols=%d " % big),
        ((x, 77, 2, 64, ck.PER_TENSOR, ck.DYNAMIC, s, q, 0), "x_dtype=77 "),
        ((x, DType.FP16, 2, 64, -2, ck.DYNAMIC, s, q, 0), "granularity=-2"),
        ((x, DType.FP16, 2, 64, ck.PER_TENSOR, 5, s, q, 0), "scale_mode=5 "),
        ((x + 1, DType.FP16, 2, 64, ck.PER_TENSOR, ck.DYNAMIC, s, q, 0), "x="),
    ]
    for args, named in cases:
        status = fast(*args)
        message = ck.last_error_message()
        assert status != ck.Status.SUCCESS and named in message, (args, message)
        assert declared(*args) == status and ck.last_error_message() == message
    moe = ck._fast_entries.ck_moe_forward.argtypes
    assert moe[0] is ck._entries.ck_moe_forward.argtypes[0] and moe[1:] == [ctypes.c_void_p] * 3


def test_cupy_out_is_used_in_place(cupy, launches):
    x = FakeCupyArray((2, 64), np.float32, 0x1000)
    q_out = FakeCupyArray((2, 64), np.int8, 0x9000)
    q, s = ck.quantize_int8(x, out=(q_out, None))
    assert q is q_out and launches[-1][1][7] == 0x9000
    with pytest.raises(TypeError):
        ck.quantize_int8(x, out=(FakeCupyArray((2, 64), np.uint8, 0x9000), None))


def test_cupy_workspace_comes_from_cupy(cupy, launches):
    x = FakeCupyArray((4, 64), np.float16, 0x1000)
    # E=8, H=64, I=32: both prepacked weights hold 32768 bytes and 512 scales.
    weight = (FakeCupyArray((32768,), np.uint8, 0x2000),
              FakeCupyArray((512,), np.float16, 0x3000), None)
    ids = FakeCupyArray((4, 2), np.int32, 0x4000)
    weights = FakeCupyArray((4, 2), np.float32, 0x5000)
    y = ck.moe_forward(x, weight, weight, 8, 32, topk_ids=ids, topk_weights=weights)
    assert isinstance(y, FakeCupyArray) and y.shape == (4, 64)
    assert ("empty", (4096,), "uint8") in cupy.log
    params, workspace, nbytes, stream = launches[-1][1]
    assert nbytes == 4096 and workspace % 256 == 0 and stream == 0xC0DE
    assert params.out == y.data.ptr and params.topk_ids == 0x4000


# ------------------------------------------------------------------------------------------------
# torch on the CPU (where torch is installed)
# ------------------------------------------------------------------------------------------------
def test_torch_cpu_tensors_are_host_data():
    torch = pytest.importorskip("torch")
    t = torch.tensor([[1.0, -2.0], [0.5, 3.0]], dtype=torch.bfloat16)
    kind = ck._kind(t)
    assert kind.name == "torch" and not ck._is_device(t)
    bits = kind.host_array(t, "x")
    assert bits.dtype == np.uint16 and bits[0, 0] == 0x3F80
    assert ck._ck_dtype(t, bits.dtype, None, "x") == DType.BF16
    back = kind.from_host(bits, DType.BF16)
    assert back.dtype == torch.bfloat16 and torch.equal(back, t)
    with pytest.raises(TypeError, match="meta"):
        ck.quantize_int8(torch.zeros(2, 4, device="meta"))
    with pytest.raises(TypeError, match="float64"):
        ck.quantize_int8(torch.zeros(2, 4, dtype=torch.float64))


def test_torch_operators_have_fake_implementations():
    torch = pytest.importorskip("torch")
    if not hasattr(torch.library, "register_fake"):
        pytest.skip("torch.library.register_fake needs torch 2.4+")
    ops = ck.torch_ops()
    assert ck.torch_ops() is ops
    x = torch.empty(5, 64, dtype=torch.bfloat16, device="meta")
    w = torch.empty(1024, dtype=torch.uint8, device="meta")
    s = torch.empty(16, dtype=torch.bfloat16, device="meta")
    y = ops.w4a16_linear(x, w, s, None, None, None, 24, 128, ck.ACTIVATION_NONE)
    assert y.shape == (5, 24) and y.dtype == torch.bfloat16
    y1 = ops.w4a16_linear(x[0], w, s, None, None, None, 24, 128, ck.ACTIVATION_NONE)
    assert y1.shape == (24,)
    m = ops.moe_forward(x, w, s, None, w, s, None, 8, 32, 128, None, 2, False, None, None)
    assert m.shape == (5, 64) and m.dtype == torch.bfloat16


def test_torch_compile_traces_a_layer_into_its_operator(monkeypatch):
    """torch.compile(fullgraph=True) of a module around a QuantizedLinear: the layer's call is
    one node, the custom operator, whose implementation (replaced here by a CPU stand-in that
    records its arguments) runs the layer's product when the graph runs."""
    torch = pytest.importorskip("torch")
    if not hasattr(torch.library, "register_fake") or not hasattr(torch, "compile"):
        pytest.skip("needs torch 2.4+")
    ops = ck.torch_ops()
    calls = []

    def product(x, w, s, z, n, group_size, bias, activation):
        calls.append((tuple(x.shape), n, group_size, activation))
        return x[..., :n] * 2

    monkeypatch.setattr(ck, "gemm_w4a16_prepacked",
                        lambda x, w, s, z, n, group_size, bias, activation:
                        product(x, w, s, z, n, group_size, bias, activation))
    layer = object.__new__(ck.QuantizedLinear)
    layer.out_features, layer.in_features, layer.group_size = 16, 64, 128
    layer.activation, layer.dtype = ck.ACTIVATION_RELU, DType.FP16
    w = torch.zeros(512, dtype=torch.uint8)
    layer._torch_tensors = (ops.w4a16_linear, w, torch.ones(16, dtype=torch.float16), None,
                            None, None)

    class Block(torch.nn.Module):
        def forward(self, x):
            return layer(x) + 1

    x = torch.randn(3, 64, dtype=torch.float16)
    compiled = torch.compile(Block(), fullgraph=True, backend="aot_eager")
    y = compiled(x)
    assert torch.equal(y, x[:, :16] * 2 + 1)
    assert calls[-1] == ((3, 64), 16, 128, ck.ACTIVATION_RELU)
    with pytest.raises(ValueError):
        layer._torch_call(x, out=x, stream=None)
