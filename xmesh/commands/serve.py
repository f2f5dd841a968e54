"""xmesh serve --weights W [--backend cupy] [--devices all|0,1] [--max-batch 64] [--batch-timeout-ms 2] ..."""

from __future__ import annotations

import os
import sys

from ..errors import InputError
from ..io.weight_sources import SYNTHETIC_PREFIX, describe_weights
from .common import add_model_options, resolve_weights

# the addresses LitServe's server accepts; "::" is not last, since a listing that ends in "::" reads as
# reST's literal-block marker in the manual's command-line reference
HOSTS = ("127.0.0.1", "::", "0.0.0.0")
EXTRA_HINT = 'pip install "xmesh-p2mpp[serve]" (or pip install ".[serve]" from a checkout)'


def add_parser(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="serve reconstructions over HTTP, batching concurrent requests",
        description="An HTTP server: POST /v1/reconstruct (multipart: images = 3 files, cameras = JSON "
        "rows or poses = the --poses JSON) answers the mesh as OBJ, PLY or GLB; GET / is a "
        "page to try it, GET /v1/info and /health describe the server. One worker per GPU "
        "(or one on the CPU) runs the requests that arrive together as one batch.",
    )
    add_model_options(p)
    p.add_argument(
        "--host",
        default="127.0.0.1",
        choices=HOSTS,
        help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 or :: for every "
        "interface, IPv4 or IPv6)",
    )
    p.add_argument("--port", type=int, default=8000, help="port, 1024-65535 (default 8000)")
    p.add_argument(
        "--devices",
        default=None,
        metavar="all|I,J",
        help="with --backend cupy: the GPUs to serve on, one worker each (default: all)",
    )
    p.add_argument("--max-batch", type=int, default=64, help="most requests one worker runs at once (default 64)")
    p.add_argument(
        "--batch-timeout-ms",
        type=float,
        default=2.0,
        help="when several requests are waiting, how long a worker waits for more to fill the batch "
        "(default 2 ms; a lone request runs at once)",
    )
    p.add_argument("--max-body-mb", type=int, default=64, help="largest request body in MiB (default 64); larger: 413")
    p.add_argument(
        "--max-queue",
        type=int,
        default=2048,
        help="most requests in the server at once; beyond it, 503 with Retry-After (default 2048)",
    )
    p.add_argument(
        "--read-timeout-s",
        type=float,
        default=30.0,
        help="a client that sends no body data for this long gets 408 (default 30 s)",
    )
    p.add_argument(
        "--body-timeout-s",
        type=float,
        default=120.0,
        help="a client whose whole body has not arrived this long after its request began gets 408 (default 120 s)",
    )
    p.add_argument(
        "--http-processes",
        type=int,
        default=None,
        metavar="N",
        help="HTTP server processes, which parse, decode and format (default: half the cores, 1 to 8)",
    )
    p.set_defaults(run=run)


def parse_devices(value: str | None, backend: str) -> tuple[int, ...] | None:
    """GPU indices for the cupy backend (None: the one CPU worker of the numpy backend)."""
    if backend != "cupy":
        if value is not None:
            raise InputError(f"--devices {value}: picks GPUs for --backend cupy; --backend numpy runs one CPU worker")
        return None
    if value in (None, "all"):
        from litserve.connector import check_cuda_with_nvidia_smi

        count = check_cuda_with_nvidia_smi()
        if count < 1:
            raise InputError(
                "--devices all: nvidia-smi lists no GPU; run on a machine with an NVIDIA GPU or use --backend numpy"
            )
        return tuple(range(count))
    try:
        devices = tuple(int(v) for v in value.split(","))
    except ValueError:
        devices = ()
    if not devices or min(devices) < 0 or len(set(devices)) != len(devices):
        raise InputError(f"--devices {value}: expected 'all' or distinct GPU indices such as 0,1")
    return devices


def check_options(args) -> None:
    """InputError naming the first option out of range, before anything starts."""
    if not 1024 <= args.port <= 65535:
        raise InputError(f"--port {args.port}: expected a port from 1024 to 65535")
    for name in ("max_batch", "max_body_mb", "max_queue"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} {getattr(args, name)}: expected a whole number of at least 1")
    if args.batch_timeout_ms < 0 or args.read_timeout_s <= 0 or args.body_timeout_s <= 0:
        raise InputError("--batch-timeout-ms must be >= 0, --read-timeout-s and --body-timeout-s > 0")
    if args.http_processes is not None and args.http_processes < 1:
        raise InputError(f"--http-processes {args.http_processes}: expected at least 1")


def check_port_free(host: str, port: int) -> None:
    """InputError when another program listens on ``host``:``port`` (found by binding it as uvicorn will,
    address reuse on), before the weights are loaded and any process starts."""
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            in_use = exc.errno == errno.EADDRINUSE
            reason = "is in use by another program" if in_use else f"cannot be bound ({exc.strerror})"
            raise InputError(
                f"--port {port}: {host}:{port} {reason}; choose another --port, or stop what listens there"
            ) from None


def server_info(args, fingerprint: str, devices: tuple[int, ...] | None, http_processes: int) -> dict:
    """What ``GET /v1/info`` answers (less the requests in the server, which the route adds)."""
    from .. import __version__

    return {
        "xmesh": __version__,
        "weights": {
            "sha256": fingerprint,
            "synthetic": args.weights[0].startswith(SYNTHETIC_PREFIX),
            "description": describe_weights(args.weights),
        },
        "backend": args.backend,
        "precision": args.precision if args.backend == "cupy" else "fp32",
        "devices": ["cpu"] if devices is None else [f"cuda:{d}" for d in devices],
        "max_batch": args.max_batch,
        "batch_timeout_ms": args.batch_timeout_ms,
        "max_queue": args.max_queue,
        "max_body_mb": args.max_body_mb,
        "http_processes": http_processes,
    }


def run(args) -> int:
    import importlib.util

    if importlib.util.find_spec("litserve") is None or importlib.util.find_spec("python_multipart") is None:
        raise InputError(f"xmesh serve needs LitServe and python-multipart: {EXTRA_HINT}")
    import numpy as np

    from ..io.template import load_template
    from ..io.weights import load_weights, weights_fingerprint
    from ..serve.server import ServeOptions, serve
    from ..serve.worker import ModelSettings
    from ..template_gen import generate_template

    check_options(args)
    check_port_free(args.host, args.port)
    devices = parse_devices(args.devices, args.backend)
    weights = resolve_weights(args.weights)
    fingerprint = weights_fingerprint(load_weights(weights))  # also checks the weights before any worker starts
    template = load_template(args.template) if args.template else generate_template()
    faces = np.asarray(template.faces_triangle[-1], dtype=np.int64)
    http = args.http_processes or max(1, min(8, (os.cpu_count() or 2) // 2))
    options = ServeOptions(
        args.host,
        args.port,
        devices,
        args.max_batch,
        args.batch_timeout_ms,
        args.max_body_mb,
        args.max_queue,
        args.read_timeout_s,
        http,
        args.body_timeout_s,
    )
    info = server_info(args, fingerprint, devices, http)
    settings = ModelSettings(weights, template, args.backend, args.precision, not args.no_view_quirk)
    url_host = f"[{args.host}]" if ":" in args.host else args.host
    where = "the CPU" if devices is None else f"GPU(s) {', '.join(map(str, devices))}"
    print(
        f"xmesh serve: {describe_weights(args.weights)}; {args.backend} ({info['precision']}) on {where}, "
        f"batches of up to {args.max_batch} within {args.batch_timeout_ms:g} ms; http://{url_host}:{args.port}/",
        file=sys.stderr,
    )
    serve(settings, options, faces, info)
    return 0
