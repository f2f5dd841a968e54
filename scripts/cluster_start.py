"""A local cluster's start and close, and how soon its workers have their model, without a dataset.

    python3 scripts/cluster_start.py [--cluster local-cuda] [--rounds 3]
        [--weights synthetic:1 --backend cupy --precision fp16]

Per round, in this process: ``open_client(SPEC, model=spec)`` (the scheduler, the workers joined;
each worker starts building the model as it joins), then the seconds until every worker has its
model built and its kernels loaded (asked of each worker every 20 ms), then the close (the
client's context left: the workers stopped and their processes gone). ``--no-model`` starts the
cluster alone. Prints one line per round and each worker's build seconds.
"""

from __future__ import annotations

import argparse
import time


def _built(plugin_name: str, dask_worker=None):
    plugin = dask_worker.plugins.get(plugin_name)
    state = getattr(plugin, "state", None)
    return None if state is None or state.model is None else state.build_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cluster", default="local-cuda")
    parser.add_argument("--weights", default="synthetic:1")
    parser.add_argument("--backend", default="cupy")
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-model", action="store_true", help="start and close the cluster alone")
    args = parser.parse_args()

    from xmesh.cluster import ModelSpec, open_client
    from xmesh.cluster.worker import model_plugin

    spec = None if args.no_model else ModelSpec.of(args.weights, backend=args.backend, precision=args.precision)
    for round_ in range(1, args.rounds + 1):
        start = time.perf_counter()
        with open_client(args.cluster, model=spec) as client:
            joined = time.perf_counter()
            workers = len(client.nthreads())
            builds = {}
            if spec is not None:
                name = model_plugin(spec).name
                while True:
                    builds = client.run(_built, name)
                    if all(b is not None for b in builds.values()):
                        break
                    time.sleep(0.02)
            ready = time.perf_counter()
        closed = time.perf_counter()
        line = (
            f"round {round_}: {workers} workers joined "
            f"{joined - start:.2f} s, all models ready {ready - start:.2f} s, close {closed - ready:.2f} s"
        )
        if builds:
            line += "; builds " + ", ".join(f"{b['model_s']:.2f}+{b['kernels_s']:.2f}" for b in builds.values())
        print(line, flush=True)


if __name__ == "__main__":
    main()
