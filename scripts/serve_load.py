"""Load test of ``xmesh serve``: starts the server, then sends requests at several concurrencies and prints,
per run, requests/s, p50/p95/p99 latency and the mean batch size the server reports (its
X-Xmesh-Batch-Size header), for the server at --max-batch 64 and again at --max-batch 1.

    python3 scripts/serve_load.py                                  # cupy fp16 on GPU 0
    python3 scripts/serve_load.py --devices all                    # one worker per GPU
    python3 scripts/serve_load.py --backend numpy --concurrency 1 4 --seconds 20 --max-batches 4   # CPU

Each concurrency runs for --seconds (after --warmup-seconds whose answers are not counted) with that
many connections, each sending its next request when the last one is answered (HTTP/1.1 keep-alive,
spread over --client-processes processes). Every request is the same three PNG-encoded demo views
(``xmesh.benchmarking.default_inputs``) and their cameras; the answer format is --format (GLB by
default: what a web viewer loads, and the smallest). Targets for one H100 in fp16: concurrency 1 p50 <= 8 ms;
concurrency 256 >= 800 requests/s with p99 <= 400 ms. Each row also gives the medians of the server's
X-Xmesh-Server-Ms and X-Xmesh-Compute-Ms headers and, from them, what the median request spent most of
its time on (see ``bound``), how busy the host's CPUs were over the measured seconds (the client's
processes included: they share the machine) and how busy the devices were with batches (``device_busy``:
near 100%, the devices bound the requests/s; well below, the server's intake of requests does). A
second table gives, per run, the median milliseconds of each step of the server's Server-Timing header
(``xmesh.serve.routes.PHASES``) and "outside", the client's latency less the server's total (uvicorn's
HTTP handling, the transfer, the client). For a lone request's breakdown on a CPU:

    python3 scripts/serve_load.py --backend numpy --concurrency 1 --max-batches 64 --seconds 40
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from xmesh.benchmarking import default_inputs  # noqa: E402
from xmesh.serve.client import multipart_body  # noqa: E402
from xmesh.serve.routes import PHASES, parse_server_timing  # noqa: E402


def request_bytes(port: int, fmt: str) -> bytes:
    images, cameras, _ = default_inputs()
    files = [
        (f"view{i}.png", cv2.imencode(".png", (np.asarray(v) * 255.0).round().astype(np.uint8))[1].tobytes())
        for i, v in enumerate(images)
    ]
    body, kind = multipart_body(files, {"cameras": json.dumps(np.asarray(cameras, np.float64).tolist())})
    head = (
        f"POST /v1/reconstruct?format={fmt} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: {kind}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


async def _connection(port: int, payload: bytes, warm_until: float, stop_at: float, out: list) -> None:
    reader = writer = None
    while time.perf_counter() < stop_at:
        if writer is None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        started = time.perf_counter()
        writer.write(payload)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)}
        await reader.readexactly(int(headers.get("content-length", 0)))
        finished = time.perf_counter()
        if started >= warm_until and finished <= stop_at:  # the measured window holds whole requests only
            out.append(
                (
                    finished - started,
                    status,
                    int(headers.get("x-xmesh-batch-size", 0)),
                    float(headers.get("x-xmesh-server-ms", "nan")),
                    float(headers.get("x-xmesh-compute-ms", "nan")),
                    parse_server_timing(headers.get("server-timing", "")),
                )
            )
        if headers.get("connection", "").lower() == "close":
            writer.close()
            writer = None
    if writer is not None:
        writer.close()


def _client(job: tuple) -> list:
    port, payload, connections, warm_until, stop_at = job
    out: list = []

    async def main():
        await asyncio.gather(*[_connection(port, payload, warm_until, stop_at, out) for _ in range(connections)])

    asyncio.run(main())
    return out


def cpu_times() -> tuple[int, int] | None:
    """(busy, all) jiffies of the host's CPUs since boot (/proc/stat's first line), None where unreadable."""
    try:
        fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
    return sum(fields) - idle, sum(fields)


def host_cpu_busy(start: float, stop: float, out: dict) -> None:
    """Put in ``out["host_cpu_pct"]`` how busy the host's CPUs were (per cent of all of them, the client's
    processes included) between ``time.perf_counter()`` times ``start`` and ``stop``."""
    time.sleep(max(0.0, start - time.perf_counter()))
    first = cpu_times()
    time.sleep(max(0.0, stop - time.perf_counter()))
    last = cpu_times()
    if first is not None and last is not None and last[1] > first[1]:
        out["host_cpu_pct"] = 100.0 * (last[0] - first[0]) / (last[1] - first[1])


def run_level(
    pool,
    port: int,
    payload: bytes,
    concurrency: int,
    processes: int,
    warmup: float,
    seconds: float,
    max_batch: int,
    devices: int,
) -> dict:
    now = time.perf_counter()
    warm_until, stop_at = now + warmup, now + warmup + seconds
    used = max(1, min(processes, concurrency))
    shares = [concurrency // used + (1 if i < concurrency % used else 0) for i in range(used)]
    cpu = {"host_cpu_pct": float("nan")}
    watcher = threading.Thread(target=host_cpu_busy, args=(warm_until, stop_at, cpu), daemon=True)
    watcher.start()
    results = [r for part in pool.map(_client, [(port, payload, n, warm_until, stop_at) for n in shares]) for r in part]
    watcher.join()
    latencies = np.array([r[0] for r in results if r[1] == 200]) * 1000.0
    batches = np.array([r[2] for r in results if r[1] == 200])
    server_ms = np.array([r[3] for r in results if r[1] == 200])
    compute_ms = np.array([r[4] for r in results if r[1] == 200])
    ok = len(latencies)
    median = (lambda a: float(np.median(a))) if ok else (lambda a: float("nan"))
    timings = [{**r[5], "outside": r[0] * 1000.0 - r[5]["total"]} for r in results if r[1] == 200 and "total" in r[5]]
    steps = [name for name, *_ in PHASES] + ["outside"]
    busy = device_busy(batches, compute_ms, seconds, devices)
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "ok": ok,
        "errors": len(results) - ok,
        "per_s": ok / seconds,
        "p50_ms": float(np.percentile(latencies, 50)) if ok else float("nan"),
        "p95_ms": float(np.percentile(latencies, 95)) if ok else float("nan"),
        "p99_ms": float(np.percentile(latencies, 99)) if ok else float("nan"),
        "mean_batch": float(batches.mean()) if ok else float("nan"),
        **cpu,
        "device_busy_pct": busy,
        "server_p50_ms": median(server_ms),
        "compute_p50_ms": median(compute_ms),
        "phases_p50_ms": {
            name: float(np.median([t[name] for t in timings])) if timings else float("nan") for name in steps
        },
        "bound": bound(
            median(latencies), median(server_ms), median(compute_ms), float(batches.mean()) if ok else 0.0, max_batch
        ),
    }


def device_busy(batches: np.ndarray, compute_ms: np.ndarray, seconds: float, devices: int) -> float:
    """How busy the server's devices were with batches over the measured ``seconds`` (per cent of
    ``devices`` x ``seconds``), from the answered requests' batch sizes and their batch's compute
    milliseconds: a batch of b requests counts 1/b of its time for each of them. Near 100: the
    devices bound the throughput; well below: the server's intake or the client does."""
    if len(batches) == 0 or seconds <= 0 or devices < 1:
        return float("nan")
    device_ms = float(np.sum(compute_ms / np.maximum(batches, 1)))
    return 100.0 * device_ms / (seconds * 1000.0 * devices)


def bound(latency_ms: float, server_ms: float, compute_ms: float, mean_batch: float, max_batch: int) -> str:
    """What a run's median request spent most of its time on: the network's batch (the worker's compute,
    X-Xmesh-Compute-Ms), the rest of the server's handling (X-Xmesh-Server-Ms less compute: parsing,
    decoding, LitServe's queues, waiting for a batch, formatting), or outside the handler (the client-seen
    latency less X-Xmesh-Server-Ms: the connection backlog, HTTP transfer, the client itself)."""
    if not np.isfinite(latency_ms) or not np.isfinite(server_ms):
        return "-"
    parts = {
        "network": compute_ms,
        "server queue+decode": server_ms - compute_ms,
        "HTTP/backlog": latency_ms - server_ms,
    }
    name = max(parts, key=parts.get)
    share = parts[name] / latency_ms * 100.0
    full = " (batches near full)" if name == "network" and mean_batch >= 0.8 * max_batch else ""
    return f"{name} {share:.0f}%{full}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_info(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/info", timeout=10) as response:
        return json.loads(response.read())


def start_server(args, max_batch: int) -> tuple[subprocess.Popen, int, int]:
    """The server's process, its port and how many devices it serves on, once it is healthy."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "xmesh",
        "serve",
        "--weights",
        args.weights,
        "--backend",
        args.backend,
        "--port",
        str(port),
        "--max-batch",
        str(max_batch),
        "--batch-timeout-ms",
        str(args.batch_timeout_ms),
        "--max-queue",
        str(max(args.concurrency) * 2),
    ]
    if args.backend == "cupy":
        command += ["--precision", args.precision, "--devices", args.devices]
    if args.http_processes:
        command += ["--http-processes", str(args.http_processes)]
    process = subprocess.Popen(command, cwd=ROOT, stdout=sys.stderr, stderr=sys.stderr)
    deadline = time.monotonic() + args.start_timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"xmesh serve exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return process, port, len(server_info(port)["devices"])
        except OSError:
            time.sleep(0.5)
    process.kill()
    raise SystemExit(f"xmesh serve was not healthy within {args.start_timeout_s} s")


def stop_server(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def table(rows: list[dict]) -> str:
    lines = [
        "| max batch | concurrency | requests | errors | requests/s | p50 ms | p95 ms | p99 ms | mean batch | "
        "host CPU % | device busy % | server p50 ms | compute p50 ms | bound (p50) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['max_batch']} | {r['concurrency']} | {r['ok']} | {r['errors']} | {r['per_s']:.0f} | "
            f"{r['p50_ms']:.1f} | {r['p95_ms']:.1f} | {r['p99_ms']:.1f} | {r['mean_batch']:.1f} | "
            f"{r['host_cpu_pct']:.0f} | "
            f"{r['device_busy_pct']:.0f} | {r['server_p50_ms']:.1f} | {r['compute_p50_ms']:.1f} | {r['bound']} |"
        )
    return "\n".join(lines)


def phase_table(rows: list[dict]) -> str:
    names = list(rows[0]["phases_p50_ms"]) if rows else []
    lines = ["| max batch | concurrency | " + " | ".join(names) + " |", "| --- | --- |" + " ---: |" * len(names)]
    for r in rows:
        lines.append(
            f"| {r['max_batch']} | {r['concurrency']} | "
            + " | ".join(f"{r['phases_p50_ms'][n]:.2f}" for n in names)
            + " |"
        )
    legend = "; ".join(f"{name}: {what}" for name, _, _, what in PHASES)
    return (
        "Median ms of each step (Server-Timing; "
        + legend
        + "; outside: the client's latency less total)\n"
        + "\n".join(lines)
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--weights", default="synthetic:1")
    p.add_argument("--backend", default="cupy", choices=("numpy", "cupy"))
    p.add_argument("--precision", default="fp16")
    p.add_argument("--devices", default="0", help="the server's --devices (default 0; 'all' for every GPU)")
    p.add_argument("--max-batches", type=int, nargs="+", default=[64, 1], help="one server per value (default 64 1)")
    p.add_argument("--batch-timeout-ms", type=float, default=2.0)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256, 1024])
    p.add_argument("--seconds", type=float, default=8.0, help="measured seconds per concurrency (default 8)")
    p.add_argument("--warmup-seconds", type=float, default=2.0, help="unmeasured seconds before each (default 2)")
    p.add_argument("--client-processes", type=int, default=4)
    p.add_argument("--http-processes", type=int, default=None, help="the server's --http-processes (default: its own)")
    p.add_argument("--format", default="glb", choices=("obj", "ply", "glb"))
    p.add_argument("--start-timeout-s", type=float, default=240.0)
    p.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON here")
    args = p.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 1024 connections on each side
    rows = []
    started = time.monotonic()
    with multiprocessing.get_context("spawn").Pool(args.client_processes) as pool:
        for max_batch in args.max_batches:
            process, port, devices = start_server(args, max_batch)
            try:
                payload = request_bytes(port, args.format)
                for concurrency in args.concurrency:
                    row = {
                        "max_batch": max_batch,
                        **run_level(
                            pool,
                            port,
                            payload,
                            concurrency,
                            args.client_processes,
                            args.warmup_seconds,
                            args.seconds,
                            max_batch,
                            devices,
                        ),
                    }
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
            finally:
                stop_server(process)
    print(
        f"xmesh serve load test: {args.backend} {args.precision if args.backend == 'cupy' else 'fp32'}, devices "
        f"{args.devices if args.backend == 'cupy' else 'cpu'}, answers as {args.format}, batch timeout "
        f"{args.batch_timeout_ms:g} ms, {args.seconds:g} s per run after {args.warmup_seconds:g} s of warm-up; "
        f"{time.monotonic() - started:.0f} s in all"
    )
    print(table(rows))
    print(phase_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
