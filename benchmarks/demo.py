#!/usr/bin/env python3
"""Quantize a weight matrix on the GPU with libcuda_kernels; report its error and the memory saved.

    make demo                    (or, from the repository root: python3 benchmarks/demo.py)

A 4096 x 4096 float32 "weight matrix" (normal, std 0.02, like an initialized nn.Linear, with a few
outlier rows 20x larger, as real checkpoints have) goes through INT8 per-row (and per-tensor, for
contrast) and INT4 group-128 (symmetric and asymmetric) quantization and back; for each format we print the relative error
||w - w'|| / ||w|| and how much smaller than fp16 the stored weight is. Speed: see `make bench`.
Exit status: 0 success, 2 no CUDA device.
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # cuda_wrapper.py lives there
import cuda_wrapper as ck  # noqa: E402

ROWS, COLS = 4096, 4096
WEIGHT_STD = 0.02     # a typical initialization scale
OUTLIER_ROWS = 8      # rows with a much larger range: what per-row / per-group scales are for
OUTLIER_GAIN = 20.0
GROUP_SIZE = 128
EXIT_NO_DEVICE = 2


def make_weight(seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((ROWS, COLS), dtype=np.float32) * np.float32(WEIGHT_STD)
    w[rng.choice(ROWS, OUTLIER_ROWS, replace=False)] *= np.float32(OUTLIER_GAIN)
    return w


def relative_error(w, w_hat):
    w = w.astype(np.float64)
    return np.linalg.norm(w - np.asarray(w_hat, dtype=np.float64)) / np.linalg.norm(w)


def stored_bytes(*arrays):
    return sum(np.asarray(a).nbytes for a in arrays if a is not None)


def main():
    if ck.device_count() == 0:  # 0 where the library says CK_STATUS_NO_DEVICE
        print("demo: no CUDA device found; the demo needs an NVIDIA GPU", file=sys.stderr)
        return EXIT_NO_DEVICE

    w = make_weight()
    results = []  # (format, stored bytes, relative error)

    # Per-tensor first, for contrast: one scale for all rows lets the outlier rows set it.
    for granularity in ("tensor", "row"):
        q, scales = ck.quantize_int8(w, granularity=granularity)
        w_hat = ck.dequantize_int8(q, scales, granularity=granularity, out_dtype="fp32")
        results.append((f"int8 per-{granularity}", stored_bytes(q, scales),
                        relative_error(w, w_hat)))

    for symmetric in (True, False):
        packed, scales, zeros = ck.quantize_int4(w, group_size=GROUP_SIZE, symmetric=symmetric)
        w_hat = ck.dequantize_int4(packed, scales, zeros, COLS, group_size=GROUP_SIZE,
                                   out_dtype="fp32")
        name = f"int4 g{GROUP_SIZE} {'sym' if symmetric else 'asym'}"
        results.append((name, stored_bytes(packed, scales, zeros), relative_error(w, w_hat)))

    fp32_bytes = w.nbytes
    fp16_bytes = w.size * 2
    print(f"weight: {ROWS} x {COLS} float32 ({fp32_bytes / 2**20:.0f} MiB, "
          f"{fp16_bytes / 2**20:.0f} MiB as fp16), {OUTLIER_ROWS} outlier rows x{OUTLIER_GAIN:g}")
    print(f"{'format':<16}{'stored MiB':>11}{'bits/weight':>13}{'vs fp16':>10}{'rel. error':>13}")
    for name, nbytes, err in results:
        bits = 8 * nbytes / w.size
        print(f"{name:<16}{nbytes / 2**20:>11.2f}{bits:>13.2f}{fp16_bytes / nbytes:>9.2f}x"
              f"{err:>13.2e}")
    print("stored = codes + scales + zero points (scales are float32 here because w is); "
          "vs fp16 = how many times smaller than w stored as fp16")
    return 0


if __name__ == "__main__":
    sys.exit(main())
