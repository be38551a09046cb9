"""Shared pytest setup: the repo root on sys.path (pytest puts tests/ there itself), the markers,
a seed per test, the CK_TEST_SHARD split of a run, and the one skip of GPU tests: a test marked
`gpu` (a GPU test file says `pytestmark = pytest.mark.gpu`) is skipped, with the reason, where
has_gpu() is false."""
import functools
import os
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)


@functools.lru_cache(maxsize=None)
def has_gpu():
    """True when the library loads and sees at least one CUDA device."""
    try:
        import cuda_wrapper
        return cuda_wrapper.device_count() > 0
    except (OSError, RuntimeError):   # no library, no cudart, no driver
        return False


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped where there is none)")
    config.addinivalue_line("markers", "cuda_api_error: makes a CUDA call fail on purpose "
                                       "(compute-sanitizer reports it; make sanitize leaves it out)")
    config.addinivalue_line("markers", "cublas: runs cuBLAS/cuBLASLt kernels (make sanitize checks "
                                       "them with memcheck only)")
    config.addinivalue_line("markers", "slow: takes tens of seconds (torch.compile with Inductor); "
                                       "-m 'not slow' leaves it out")


def pytest_collection_modifyitems(config, items):
    shard = os.environ.get("CK_TEST_SHARD")
    if shard:
        # CK_TEST_SHARD=i/n keeps every n-th collected test from the i-th (0 <= i < n): n
        # processes split a long run (make sanitize's racecheck) evenly, every case in one.
        try:
            index, count = (int(part) for part in shard.split("/"))
        except ValueError:
            index, count = -1, 0
        if not 0 <= index < count:
            raise pytest.UsageError(f"CK_TEST_SHARD={shard}: want i/n with 0 <= i < n")
        items[:] = items[index::count]
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_items and not has_gpu():
        skip = pytest.mark.skip(reason="needs a CUDA device (none visible, or the library "
                                       "is not built)")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture
def seed(request):
    """A fresh random seed per test, printed so that a failure can be replayed with
    CK_TEST_SEED=<seed>."""
    seed = int(os.environ.get("CK_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    print(f"{request.node.nodeid}: seed {seed} (replay with CK_TEST_SEED={seed})")
    return seed


# The library reads these on every call to force a kernel variant (cuda_kernels.h).
KERNEL_OVERRIDES = ("CK_GEMM_INT8_KERNEL", "CK_GEMM_INT4_KERNEL", "CK_GEMM_FP8_KERNEL",
                    "CK_GEMM_W4A8_KERNEL", "CK_GEMM_W4A16_KERNEL",
                    "CK_GEMM_W4A16_WGMMA_ROWS", "CK_GEMM_W4A16_WGMMA_SPLIT",
                    "CK_GEMM_W4A16_STREAM_TILES", "CK_GEMM_W4A16_STREAM_WARPS",
                    "CK_GEMM_BLOCK4_KERNEL", "CK_GEMM_SPARSE_KERNEL",
                    "CK_GEMM_SPARSE_WGMMA_ROWS", "CK_GEMM_SPARSE_WGMMA_SPLIT", "CK_MOE_KERNEL",
                    "CK_ATTENTION_KERNEL")


@pytest.fixture(autouse=True)
def _kernel_overrides_unset(monkeypatch):
    """Every test starts with the kernel overrides unset, whatever the caller's shell says;
    a test that forces a variant sets one itself."""
    for name in KERNEL_OVERRIDES:
        monkeypatch.delenv(name, raising=False)
