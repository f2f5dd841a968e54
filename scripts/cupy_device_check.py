"""Golden check and timings of the CuPy backend, for a GPU machine (one command, short table at the end).

    python3 scripts/cupy_device_check.py GOLDEN_DIR [--quick]

GOLDEN_DIR holds ``demo_seed1.npz`` and ``template.dat`` (a copy of ../shared/golden). Prints, per
precision: the golden errors (stage-1 blocks, stage-2 displacements), per-stage milliseconds at
batch 1 (CUDA events, warm-up, median of repeats), eager and CUDA-Graph whole reconstructions, and
samples/s at batch 16 and 64.
"""
from __future__ import annotations

import sys
import time

import numpy as np


def main() -> int:
    import cupy as cp

    from xmesh import Reconstructor
    from xmesh.io.template import load_template
    from xmesh.io.weights import synthetic_weights
    from xmesh.model import architecture as arch
    from xmesh.model import network
    from xmesh.model.cnn import run_cnn
    from xmesh.model.deformation import deformation_block
    from xmesh.model.projection import DeviceTransforms, pad_maps

    golden_dir = sys.argv[1]
    quick = "--quick" in sys.argv
    g = dict(np.load(f"{golden_dir}/demo_seed1.npz"))
    template = load_template(f"{golden_dir}/template.dat")
    weights = synthetic_weights(1)
    dev = cp.cuda.runtime.getDeviceProperties(0)
    print("device", dev["name"].decode(), "cupy", cp.__version__, "cuda runtime", cp.cuda.runtime.runtimeGetVersion(),
          "cudnn module:", hasattr(cp, "cudnn") or _has("cupy.cudnn"), flush=True)

    def timed(fn, reps=10, warm=2):
        for _ in range(warm):
            fn()
        cp.cuda.Device().synchronize()
        times = []
        for _ in range(reps):
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop))
        return float(np.median(times))

    table = []
    golden_rows = []
    results = {}

    def model_local_proj(be, centers, p2, padded, tf):
        from xmesh.model.projection import local_projection
        pts = centers[:, None, :, :] + p2.sample_coord[None, :, None, :]
        return local_projection(be, pts.reshape(1, -1, 3), padded, tf)
    for precision in ("fp32", "tf32", "fp16"):
        model = Reconstructor(weights, template=template, backend="cupy", precision=precision)
        be = model.backend
        images = g["images"][None]
        cams = g["cameras"][None]
        trace = network.Trace()
        coarse, refined = model.run(images, cams, trace=trace)
        errs = []
        for i, b in enumerate(trace.stage1_blocks):
            d = np.abs(be.to_numpy(b)[0] - g[f"stage1_block{i + 1}"]).max(axis=1)
            errs.append(f"s1b{i + 1} max {d.max():.2e} frac>1e-5 {(d > 1e-5).mean():.4f}")
        prev = g["stage1_block3"]
        for i, b in enumerate(trace.stage2_blocks):
            ref = g[f"stage2_block{i + 1}"]
            ours = be.to_numpy(b)[0]
            start = prev if i == 0 else g["stage2_block1"]
            dref, dours = ref - prev, ours - start
            rel = np.linalg.norm(dours - dref) / np.linalg.norm(dref)
            errs.append(f"drb{i + 1} rel-disp {rel:.2e} abs {np.abs(ours - ref).max():.2e}")
            prev = ref
        golden_rows.append((precision, "; ".join(errs)))
        print(precision, "golden:", golden_rows[-1][1], flush=True)

        # per-stage at batch 1
        flat = cp.asarray(images.reshape(3, 224, 224, 3))
        tf = DeviceTransforms.from_cameras(be, cams)
        p1, p2 = model.stage1, model.stage2
        reps = 5 if quick else 20
        t_cnn1 = timed(lambda: run_cnn(be, p1.cnn, flat, arch.STAGE1_TAPS), reps)
        t_s1 = timed(lambda: network.run_stage1(be, p1, flat, tf), reps)
        t_cnn2 = timed(lambda: pad_maps(be, run_cnn(be, p2.cnn, flat, arch.STAGE2_TAPS)), reps)
        padded = pad_maps(be, run_cnn(be, p2.cnn, flat, arch.STAGE2_TAPS))
        c0 = network.run_stage1(be, p1, flat, tf)[-1]
        t_drb = timed(lambda: deformation_block(be, p2.blocks[0], p2, c0, padded, tf), reps)
        t_all = timed(lambda: network.run_network(be, p1, p2, flat, cams), reps)

        def recon(imgs):
            c = network.run_stage1(be, p1, imgs, tf)[-1]
            return c, network.run_stage2(be, p2, imgs, c, tf)

        try:
            graph = be.capture(recon, flat)
            t_graph = timed(lambda: graph.replay(), reps)
            eager = [a.get() for a in recon(flat)]
            rep = [a.get() for a in graph.replay(synchronize=True)]
            gdiff = max(float(np.abs(a - b).max()) for a, b in zip(eager, rep))
            del graph
        except Exception as exc:  # report, keep measuring
            print("graph capture failed:", type(exc).__name__, str(exc)[:200], flush=True)
            t_graph, gdiff = float("nan"), float("nan")
        results[precision] = (be.to_numpy(coarse)[0], be.to_numpy(refined)[0])
        t_proj2 = timed(lambda: model_local_proj(be, c0, p2, padded, tf), reps)
        row = dict(precision=precision, proj2=t_proj2, cnn1=t_cnn1, stage1=t_s1, graphconv1=t_s1 - t_cnn1, cnn2=t_cnn2,
                   drb=t_drb, total=t_all, graph=t_graph, graph_diff=gdiff)
        # throughput
        for batch in (16, 64):
            try:
                imgs_b = np.broadcast_to(images, (batch,) + images.shape[1:]).copy()
                imgs_b += np.random.default_rng(batch).uniform(0, 1e-3, imgs_b.shape).astype(np.float32)
                cams_b = np.broadcast_to(cams, (batch,) + cams.shape[1:]).copy()
                dflat = cp.asarray(imgs_b.reshape(batch * 3, 224, 224, 3))
                ms = timed(lambda: network.run_network(be, p1, p2, dflat, cams_b), reps=2 if batch == 64 else 3, warm=1)
                row[f"sps{batch}"] = batch / (ms / 1000.0)
                del dflat
            except cp.cuda.memory.OutOfMemoryError:
                row[f"sps{batch}"] = float("nan")
            cp.get_default_memory_pool().free_all_blocks()
        table.append(row)
        print(row, flush=True)
        cp.get_default_memory_pool().free_all_blocks()

    # GEMM ceilings of the deformation-reasoning shape (M = 43*2466, K = 192, N = 192)
    m = 43 * 2466
    from xmesh.backends import get_backend

    for prec in ("fp32", "tf32", "fp16"):
        be = get_backend("cupy", precision=prec)
        dt = cp.float16 if prec == "fp16" else cp.float32
        a = cp.random.standard_normal((m, 192)).astype(dt)
        w = cp.random.standard_normal((192, 192)).astype(dt)
        with be._math():
            ms = timed(lambda: a @ w, 20)
        print(f"GEMM {m}x192x192 {prec}: {ms:.3f} ms = {2 * m * 192 * 192 / ms / 1e9:.1f} TFLOP/s", flush=True)

    cpu = Reconstructor(weights, template=template, backend="numpy")
    c_cpu, r_cpu = (np.asarray(a)[0] for a in cpu.run(g["images"][None], g["cameras"][None]))
    move_cpu = r_cpu - c_cpu
    prec_rows = []
    for precision, (c, r) in results.items():
        dc = np.abs(c - c_cpu).max(axis=1)
        dr = np.abs(r - r_cpu).max(axis=1)
        rel = np.linalg.norm((r - c) - move_cpu) / np.linalg.norm(move_cpu)
        prec_rows.append(f"{precision:5s} vs CPU numpy: coarse max {dc.max():.2e} frac>1e-5 {(dc > 1e-5).mean():.4f}; "
                         f"final max {dr.max():.2e} frac>1e-5 {(dr > 1e-5).mean():.4f}; stage-2 displacement rel err {rel:.2e}")
    print("\n=== CuPy vs NumPy backend on the golden inputs ===")
    print("\n".join(prec_rows))
    print("\n=== golden (demo_seed1, synthetic weights seed 1) ===")
    for precision, text in golden_rows:
        print(f"{precision:5s} {text}")
    print("\n=== timings (ms, batch 1, median; samples/s batched) ===")
    print("prec  cnn1   graphconv1 cnn2   proj2  drb(1 blk) total  graph  replay-diff  sps@16  sps@64")
    for r in table:
        print(f"{r['precision']:5s} {r['cnn1']:6.2f} {r['graphconv1']:6.2f}     {r['cnn2']:6.2f} {r['proj2']:6.2f} {r['drb']:6.2f}     "
              f"{r['total']:6.2f} {r['graph']:6.2f} {r['graph_diff']:.1e}      {r['sps16']:7.1f} {r['sps64']:7.1f}")
    return 0


def _has(module: str) -> bool:
    try:
        __import__(module)
        return True
    except Exception:
        return False


if __name__ == "__main__":
    t0 = time.perf_counter()
    rc = main()
    print(f"wall {time.perf_counter() - t0:.1f} s")
    sys.exit(rc)
