"""How many requests a second a serve worker's receiving thread takes in through a pipe queue, with the
default pipe and with ``xmesh.serve.server.pipe_queue``'s 1 MB pipe.

    python3 scripts/pipe_intake.py [--requests 3000] [--writers 2] [--busy] [--switch-interval S]

Writer processes put requests shaped as the server's (three 224 x 224 x 3 uint8 views and their camera
rows, 450 KB) into one queue; a reader process takes them, with ``--busy`` beside a thread that runs
Python the whole time (as a worker's batch loop and answer threads do). Each read the reader's thread
makes lets go of the interpreter lock; a thread running Python gives it back only after the
interpreter's switch interval (5 ms unless ``--switch-interval`` sets the reader's). Prints
requests/s per pipe.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from xmesh.serve.server import pipe_bytes, pipe_queue  # noqa: E402


def _write(queue, count: int) -> None:
    views = np.random.default_rng(0).integers(0, 256, (3, 224, 224, 3), dtype=np.uint8)
    for i in range(count):
        queue.put((0, i, time.monotonic(), {"images": views.copy(), "rows": np.zeros((3, 5))}))


def _spin(stop: threading.Event) -> None:
    total = 0
    while not stop.is_set():
        for i in range(1000):
            total += i * i


def _read(queue, count: int, busy: bool, result, switch_interval: float | None = None) -> None:
    if switch_interval:
        sys.setswitchinterval(switch_interval)
    stop = threading.Event()
    if busy:
        threading.Thread(target=_spin, args=(stop,), daemon=True).start()
    start = time.perf_counter()
    for _ in range(count):
        queue.get()
    result.put(count / (time.perf_counter() - start))
    stop.set()


def intake(queue, context, requests: int, writers: int, busy: bool, switch_interval: float | None = None) -> float:
    result = context.Queue()
    reader = context.Process(target=_read, args=(queue, requests, busy, result, switch_interval))
    reader.start()
    share = [requests // writers + (i < requests % writers) for i in range(writers)]
    procs = [context.Process(target=_write, args=(queue, n)) for n in share]
    for p in procs:
        p.start()
    rate = result.get()
    for p in [*procs, reader]:
        p.join()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--busy", action="store_true", help="a thread running Python beside the receiving one")
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        metavar="S",
        help="the reader's sys.setswitchinterval (default: the interpreter's, 0.005 s)",
    )
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    for name, queue in (("default pipe", context.Queue()), ("pipe_queue", pipe_queue(context))):
        rate = intake(queue, context, args.requests, args.writers, args.busy, args.switch_interval)
        print(f"{name} ({pipe_bytes(queue) // 1024} KB): {rate:.0f} requests/s", flush=True)


if __name__ == "__main__":
    main()
