"""Options shared by several subcommands."""

from __future__ import annotations

import contextlib
import os
import sys

from ..errors import InputError, XmeshError
from ..io import weight_sources
from ..io.atomic import os_error_reason
from ..io.weight_sources import SYNTHETIC_PREFIX


def add_model_options(parser, weights_required: bool = True) -> None:
    parser.add_argument(
        "--weights",
        required=weights_required,
        nargs="+",
        metavar="W",
        help="an .npz keyed by the official variable names, or TensorFlow checkpoint prefix(es) "
        "(give both official checkpoints: meshnetmvp2m and meshnet); "
        "'official' the copy stored by 'xmesh weights add'; "
        f"'{SYNTHETIC_PREFIX}SEED' uses the synthetic test recipe (NOT trained weights)",
    )
    parser.add_argument(
        "--template", default=None, help="a template .dat in the official layout (default: the built-in ellipsoid)"
    )
    parser.add_argument("--backend", default="numpy", choices=("numpy", "cupy"), help="array backend (default: numpy)")
    parser.add_argument(
        "--precision",
        default="fp32",
        choices=("fp32", "tf32", "fp16", "bf16"),
        help="GPU precision mode (default: fp32)",
    )
    parser.add_argument(
        "--no-view-quirk",
        action="store_true",
        help="let each view sample its own stage-1 maps (only for weights trained that way)",
    )


def check_weights_values(args) -> None:
    """InputError when a --weights value is an image: --weights takes every value up to the next option,
    so images written after it are taken for weights."""
    from ..errors import first_few
    from ..io.weights import IMAGE_KINDS, describe_file

    images = [w for w in args.weights or () if os.path.isfile(w) and describe_file(w) in IMAGE_KINDS]
    if images:
        raise InputError(
            f"--weights took {len(args.weights)} value(s), {len(images)} of them image(s) "
            f"({first_few(images)}), not weights: --weights takes every value up to the next option; "
            "give the images before --weights"
        )


def check_folder(path: str, option: str, expected: str) -> None:
    """InputError naming ``option`` when ``path`` is not an existing folder (before a deep file in it is missed)."""
    from pathlib import Path

    if not Path(path).is_dir():
        state = "is a file" if Path(path).exists() else "does not exist"
        raise InputError(f"{option} {path}: {state}; expected {expected}")


def resolve_weights(values):
    """The --weights values -> what the model takes; 'synthetic:SEED' draws the test recipe."""
    return weight_sources.resolve_weights(list(values), option="--weights")


def describe_processes(chosen, args, client, writer: str = "writer") -> str:
    """The loader and writer process counts a dataset command prints (on a cluster without
    --workers each worker chooses them from its own cores)."""
    if client is not None and args.workers is None:
        return f"loader and {writer} processes chosen by each worker from its cores"
    return f"{chosen.loaders} loader and {chosen.writers} {writer} process(es)"


def check_batch_size(args) -> None:
    """--batch-size, where given, is a whole number >= 1 (every command refuses 0 the same way)."""
    if args.batch_size is not None and args.batch_size < 1:
        raise InputError(
            f"--batch-size {args.batch_size}: expected a whole number >= 1 (default: 64 on the GPU, 1 on the CPU)"
        )


def add_cluster_option(parser) -> None:
    parser.add_argument(
        "--cluster",
        default=None,
        metavar="SPEC",
        help="run on a Dask cluster: local:N (N worker processes here), local-cuda (one worker per "
        "GPU), tcp://HOST:PORT (a running scheduler), or a scheduler file such as sched.json (written by "
        'dask scheduler --scheduler-file); needs pip install "xmesh-p2mpp[dask]"',
    )
    parser.add_argument(
        "--shard-batches",
        type=int,
        default=None,
        metavar="K",
        help="with --cluster: batches per task sent to a worker (default: 8 on the GPU, 4 on the CPU, fewer "
        "so that every worker gets one)",
    )


def spec_from_args(args):
    """The ModelSpec of the model options, for the workers of --cluster to build."""
    from ..reconstruct import ModelSpec

    weight_sources.synthetic_seed(
        list(args.weights), "--weights"
    )  # a malformed synthetic:SEED fails here, before any cluster starts
    if weight_sources.is_official(list(args.weights)):
        weight_sources.resolve_weights(list(args.weights))  # official weights never added: the same, with the steps
    if args.cluster == "local-cuda" and args.backend != "cupy":
        raise InputError(
            "--cluster local-cuda starts one worker per GPU: use it with --backend cupy "
            "(local:N runs N CPU workers for --backend numpy)"
        )
    return ModelSpec.of(
        list(args.weights),
        template=args.template,
        backend=args.backend,
        precision=args.precision,
        view_quirk=not args.no_view_quirk,
    )


def reconstructor_from_args(args):
    from ..reconstruct import Reconstructor

    return Reconstructor(
        resolve_weights(args.weights),
        template=args.template,
        backend=args.backend,
        precision=args.precision,
        view_quirk=not args.no_view_quirk,
    )


def add_overwrite_option(parser, what: str) -> None:
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help=f"start afresh: delete the {what} of an earlier run in --out instead of resuming it "
        "(a resume with other weights, template or settings than those recorded in "
        "--out/run.json is refused)",
    )


def run_identity(args, model):
    """What a dataset command's results depend on (:mod:`xmesh.results.run_identity`): ``model``'s
    weights fingerprint and template (a ModelSpec for a cluster: the weights are read here for it) and
    the result-changing options, checked against --out's record (another run's folder is refused here,
    unless --overwrite); the dataset run records it once its inputs are checked."""
    from ..results.run_identity import check_identity, model_identity

    fingerprint = getattr(model, "weights_fingerprint", None)
    if fingerprint is None:
        from ..io.weights import load_weights, weights_fingerprint

        fingerprint = weights_fingerprint(load_weights(resolve_weights(args.weights)))
    identity = model_identity(
        fingerprint,
        getattr(model, "template", args.template),
        args.backend,
        args.precision,
        args.views,
        not args.no_view_quirk,
        weights_about=" ".join(args.weights),
        template_about=args.template or "built-in ellipsoid",
    )
    check_identity(args.out, identity, args.overwrite)
    return identity


@contextlib.contextmanager
def output_errors(what: str):
    """Turn an OS error while writing an output into one InputError: ``what`` names the output
    (e.g. "--out mesh.obj: writing"); written atomically, the previous file is unchanged."""
    try:
        yield
    except OSError as exc:
        if isinstance(exc, XmeshError):
            raise
        raise InputError(
            f"{what} failed ({os_error_reason(exc)}); the previous file, if any, is unchanged; "
            "expected a writable path with free space"
        ) from None


def run_dataset_command(args, chosen, path_options: tuple, body, listing: tuple | None = None) -> int:
    """Run ``body(args, model, pool, client)`` for a dataset command: on a Dask cluster with
    ``--cluster`` (the client made first, so a missing extra fails at once; the ``path_options`` of
    ``args`` made absolute, as the workers may run elsewhere; ``model`` the ModelSpec the workers
    build), else in this process with its loader pool started before the model is built, so that
    their start-ups overlap (on the GPU CUDA's driver starts first, in a thread). ``listing``:
    :func:`xmesh.dataset.list_samples`'s arguments, listed in a thread meanwhile (the run takes the
    result)."""
    from ..pipeline import startup

    if getattr(args, "backend", None) == "cupy" and not getattr(args, "cluster", None):
        from ..backends.cuda_driver import start_driver

        start_driver()  # beside the listing, the pool's start and CuPy's import
    if listing is not None:
        from ..dataset import list_samples

        startup.prefetch(list_samples, *listing)
    if getattr(args, "cluster", None):
        from ..cluster.connect import describe, open_client

        spec = spec_from_args(args)
        startup.mark("other")
        with open_client(args.cluster, model=spec) as client:
            startup.mark("cluster")
            print(f"xmesh {args.command}: cluster {args.cluster}: {describe(client)}", file=sys.stderr)
            for name in path_options:
                setattr(args, name, os.path.abspath(getattr(args, name)))
            return body(args, spec, None, client)
    from ..pipeline.loading import start_pool

    pool = None
    try:  # the pool shut down however the command ends, Ctrl+C while it starts included
        pool = start_pool(chosen.loaders)
        startup.mark("other")
        model = reconstructor_from_args(args)
        startup.mark("model")
        model.backend.load_kernels()
        startup.mark("kernels")
        return body(args, model, pool, None)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def add_views_option(parser) -> None:
    """``--views I I I``: the renderings of the official layout used as the three input views."""
    parser.add_argument(
        "--views",
        type=int,
        nargs=3,
        default=[0, 6, 7],
        metavar="I",
        help="renderings used as the 3 input views (default: 0 6 7, the original's)",
    )
