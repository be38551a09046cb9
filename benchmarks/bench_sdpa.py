#!/usr/bin/env python3
"""What a PyTorch user would call instead of ck_attention_forward / ck_attention_decode: torch's
scaled_dot_product_attention (SDPA) with its FlashAttention-2 ("flash") and cuDNN backends, on
the shapes of ck_bench's attention family, timed on the same GPU (run it beside ck_bench).

    python3 benchmarks/bench_sdpa.py [--out DIR] [--reps 50] [--only prefill|decode]

Prefill: (B, Hq/Hkv, S, D, mask) as benchmarks/bench_attention.cuh's kShapes, bf16 and fp16,
q [B, Hq, S, D] and k, v [B, Hkv, S, D] (SDPA's layout; enable_gqa where Hq != Hkv), causal
bottom-right as ck's (equal lengths: the same mask). TFLOP/s counts 4 D Hq x the pairs the mask
allows, as ck_bench does. Decode: fp16, Hq/Hkv 32/8, D 128, one new token attending to the
whole cache of (B, KV) as ck_bench's decode rows, non-causal (one query sees every key).

Timing: a CUDA graph of one call per input copy, replayed for about --reps calls after a
warm-up, CUDA events around the replays, the median of 5 loops (torch's host time per call
stays out, as ck_bench's graph replays keep the library's out); the inputs are rotated over
enough copies that each call reads them from DRAM (2 x 50 MB of L2 traffic between two uses).
A backend that refuses a shape prints why. The table goes to stdout
and, as markdown with the GPU's name, the date and the command, to
DIR/sdpa-<gpu>-<date>.md. torch is this script's dependency only: the library never imports it.
Exit status: 0, 2 without torch or a CUDA device.
"""
import argparse
import datetime
import re
import statistics
import sys
from pathlib import Path

EXIT_NO_DEVICE = 2
L2_BYTES = 50 * 2**20
PREFILL = [  # B, Hq, Hkv, S, D, causal
    (1, 32, 32, 2048, 128, True), (4, 32, 32, 2048, 128, False), (1, 32, 8, 8192, 128, True),
    (8, 32, 8, 1024, 128, True), (2, 16, 16, 4096, 64, True), (16, 32, 8, 512, 128, True),
]
DECODE = [(1, 4096), (16, 4096), (64, 2048), (1, 32768)]  # B, KV; Hq 32, Hkv 8, D 128, fp16


def copies_for(bytes_per_call):
    return max(2, int(2 * L2_BYTES // max(bytes_per_call, 1)) + 1)


def result_path(out, name, gpu):
    """(out/<name>-<gpu>-<date>.md, the date): where a script's markdown table goes, its
    directory made."""
    date = datetime.date.today().isoformat()
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    path = Path(out) / f"{name}-{slug}-{date}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path, date


def time_calls(torch, call, copies, reps):
    """Device time per call (us): one CUDA graph of `copies` calls (one per input copy) replayed
    after warm-up, CUDA events around the replays, the median of 5 loops; so that torch's host
    time per call (tens of us) stays out of it. Where a backend cannot be captured, the calls
    are timed directly ("eager" in the note). Returns (us, note)."""
    for i in range(copies):
        call(i)
    torch.cuda.synchronize()
    graph, note = None, ""
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(copies):
                call(i)
    except RuntimeError as e:
        graph, note = None, "eager: " + str(e).splitlines()[0][:60]
        torch.cuda.synchronize()
    replays = max(1, reps // copies)
    times = []
    for _ in range(5):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for r in range(replays):
            if graph is not None:
                graph.replay()
            else:
                for i in range(copies):
                    call(i)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3 / (replays * copies))
    return statistics.median(times), note


def backends(torch):
    from torch.nn.attention import SDPBackend
    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def run_case(torch, backend, make, flops, reps):
    """One backend on one shape: (us, TFLOP/s or None, note); us None where it refuses."""
    from torch.nn.attention import sdpa_kernel
    import torch.nn.functional as F
    try:
        tensors, kwargs, bytes_per_call = make()
        copies = copies_for(bytes_per_call)
        sets = [tensors] + [tuple(t.clone() for t in tensors) for _ in range(copies - 1)]
        with sdpa_kernel([backend]):
            def call(i):
                q, k, v = sets[i]
                F.scaled_dot_product_attention(q, k, v, **kwargs)
            us, note = time_calls(torch, call, copies, reps)
        return us, flops / us / 1e6 if flops else None, note
    except (RuntimeError, ValueError) as e:  # the backend refuses the shape
        return None, None, str(e).splitlines()[0][:80]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write sdpa-<gpu>-<date>.md there")
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--only", choices=("prefill", "decode"), default=None,
                        help="run that kind of row alone")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("bench_sdpa: torch is not installed", file=sys.stderr)
        return EXIT_NO_DEVICE
    if not torch.cuda.is_available():
        print("bench_sdpa: no CUDA device", file=sys.stderr)
        return EXIT_NO_DEVICE
    gpu = torch.cuda.get_device_name()
    rows = []
    prefill = PREFILL if args.only != "decode" else []
    decode = DECODE if args.only != "prefill" else []
    for dtype_name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        for b, hq, hkv, s, d, causal in prefill:
            shape = f"B={b} H={hq}/{hkv} S={s} D={d}" + (" causal" if causal else "")
            pairs = b * (s * (s + 1) // 2 if causal else s * s)
            flops = 4.0 * d * hq * pairs

            def make(b=b, hq=hq, hkv=hkv, s=s, d=d, causal=causal, dtype=dtype):
                q = torch.randn(b, hq, s, d, device="cuda", dtype=dtype)
                k = torch.randn(b, hkv, s, d, device="cuda", dtype=dtype)
                v = torch.randn(b, hkv, s, d, device="cuda", dtype=dtype)
                kwargs = {"is_causal": causal, "enable_gqa": hq != hkv}
                return (q, k, v), kwargs, 2 * (q.nbytes + k.nbytes + v.nbytes)

            for backend_name, backend in backends(torch).items():
                us, tflops, note = run_case(torch, backend, make, flops, args.reps)
                rows.append(("prefill", dtype_name, shape, backend_name, us, tflops, note))
    for b, kv in decode:
        shape = f"B={b} H=32/8 KV={kv} D=128"

        def make(b=b, kv=kv):
            q = torch.randn(b, 32, 1, 128, device="cuda", dtype=torch.float16)
            k = torch.randn(b, 8, kv, 128, device="cuda", dtype=torch.float16)
            v = torch.randn(b, 8, kv, 128, device="cuda", dtype=torch.float16)
            return (q, k, v), {"enable_gqa": True}, q.nbytes * 2 + k.nbytes + v.nbytes

        for backend_name, backend in backends(torch).items():
            us, _, note = run_case(torch, backend, make, None, args.reps)
            rows.append(("decode", "fp16", shape, backend_name, us, None, note))

    header = f"{'kind':8} {'dtype':5} {'shape':34} {'backend':7} {'us':>9} {'TFLOP/s':>8}  note"
    lines = [header, "-" * len(header)]
    for kind, dt, shape, backend, us, tflops, note in rows:
        us_s = f"{us:9.1f}" if us is not None else f"{'-':>9}"
        tf_s = f"{tflops:8.0f}" if tflops is not None else f"{'':>8}"
        lines.append(f"{kind:8} {dt:5} {shape:34} {backend:7} {us_s} {tf_s}  {note}")
    table = "\n".join(lines)
    print(f"{gpu}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    print(table)
    if args.out:
        path, date = result_path(args.out, "sdpa", gpu)
        path.write_text(
            f"# PyTorch SDPA (flash, cuDNN) on the attention shapes, {gpu}, {date}\n\n"
            f"Command: `python3 benchmarks/bench_sdpa.py --out {args.out} --reps {args.reps}"
            f"{' --only ' + args.only if args.only else ''}`; "
            f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}.\n\n"
            f"```\n{table}\n```\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
