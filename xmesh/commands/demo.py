"""xmesh demo: reconstruct a built-in procedural object end to end, nothing downloaded."""

from __future__ import annotations

import sys
import time
from pathlib import Path

DEMO_SEED = 1
DEMO_RECIPE = "the test recipe's small-move variant"  # the template comes out deformed, not collapsed


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="render a built-in object, reconstruct it and write the mesh (no download)")
    p.add_argument("--out", default="xmesh-demo", help="output folder (default: ./xmesh-demo)")
    p.add_argument(
        "--weights",
        nargs="+",
        default=None,
        help="real weights: 'official' (the copy stored by 'xmesh weights add'), an .npz or both "
        "checkpoint prefixes; default: synthetic weights (the test recipe's small-move variant, "
        "seed 1)",
    )
    p.add_argument("--backend", default="numpy", choices=("numpy", "cupy"))
    p.set_defaults(run=run)


def run(args) -> int:
    from ..backends import get_backend
    from ..errors import InputError
    from ..io.cameras import load_cameras
    from ..io.weight_sources import describe_weights, resolve_weights
    from ..io.weights import load_weights, synthetic_weights
    from ..io.writable import check_writable_folder
    from ..pictures.demo import weights_caption, write_demo_picture
    from ..reconstruct import Reconstructor
    from ..synthetic.dataset import demo_inputs

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: is a file; expected a folder (made if missing) for the demo's outputs")
    check_writable_folder(out)
    backend = get_backend(args.backend)  # fail at once where the backend cannot run
    if args.weights:  # check the weights before anything is rendered
        weights = load_weights(resolve_weights(args.weights, "--weights"))
        said = describe_weights(args.weights)
    else:
        weights = synthetic_weights(DEMO_SEED, small_moves=True)
        said = (
            f"SYNTHETIC weights ({DEMO_RECIPE}, seed {DEMO_SEED}): the official Pixel2Mesh++ weights cannot be "
            "bundled, so this mesh shows the pipeline working, not a trained reconstruction. "
            "Run 'xmesh weights add RELEASE.zip' once, then 'xmesh demo --weights official', for the real one."
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(
            f"--out {out}: cannot make the folder ({exc.strerror or exc}); expected a writable folder path"
        ) from None
    images, cameras = demo_inputs(out / "inputs", seed=0)
    print(f"xmesh demo: inputs {', '.join(str(i) for i in images)}, cameras {cameras}", file=sys.stderr)
    print(f"xmesh demo: using {said}", file=sys.stderr)
    start = time.perf_counter()
    model = Reconstructor(weights, backend=backend)
    mesh = model(images, cameras)
    elapsed = time.perf_counter() - start
    mesh_path = mesh.to_obj(out / "mesh.obj")
    mesh.coarse().to_obj(out / "coarse.obj")
    detail = (
        f"refined mesh: {len(mesh.vertices)} vertices, {len(mesh.faces)} faces; "
        f"reconstructed in {elapsed:.2f} s on {args.backend}"
    )
    picture = write_demo_picture(
        out / "mesh.png",
        images,
        load_cameras(cameras),
        mesh,
        weights_caption(args.weights, DEMO_SEED, DEMO_RECIPE),
        detail,
    )
    print(
        f"xmesh demo: wrote {mesh_path} ({len(mesh.vertices)} vertices, {len(mesh.faces)} faces), "
        f"{out / 'coarse.obj'} and {picture} in {elapsed:.2f} s on {args.backend}",
        file=sys.stderr,
    )
    return 0
