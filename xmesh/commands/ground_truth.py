"""xmesh ground-truth MESH [MESH ...] --synset S --images ROOT --out DIR"""

from __future__ import annotations

import sys


def add_parser(sub) -> None:
    p = sub.add_parser(
        "ground-truth",
        help="sample your own objects' surfaces into ground-truth .dat files for xmesh eval",
        description="Sample points with normals uniformly over each mesh's surface, as the original's "
        "data was made, in the frame of the object's rendering VIEW, and write them as "
        "DIR/{synset}_{item}_{view}.dat in the official layout (item: the mesh file's "
        "name, or its folder's for ShapeNet's {item}/model.obj).",
    )
    p.add_argument("meshes", nargs="+", metavar="MESH", help="mesh files (.obj or .ply), in the renderings' world")
    p.add_argument("--synset", required=True, help="the category id the files are named with, e.g. 02691156 (digits)")
    p.add_argument(
        "--images",
        required=True,
        metavar="ROOT",
        help="the renderings' root: {synset}/{item}/rendering/NN.png and rendering_metadata.txt, as "
        "xmesh eval --images reads them",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the .dat files (xmesh eval's --gt)")
    p.add_argument("--view", type=int, default=0, help="the rendering whose camera frame the points are in (default 0)")
    p.add_argument(
        "--points", type=int, default=16384, metavar="N", help="points per object (default 16384, as the original)"
    )
    p.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply the mesh's coordinates first (default 1; 0.57 for ShapeNetCore v1 models with the "
        "3D-R2N2 renderings, as the original's data generator)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed of the sampling (default 0)")
    p.set_defaults(run=run)


def run(args) -> int:
    from pathlib import Path

    from ..errors import InputError
    from ..ground_truth import write_object_ground_truth
    from ..io.writable import check_writable_folder
    from .common import output_errors

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {args.out}: is a file; expected a folder (made if missing)")
    check_writable_folder(out)
    with output_errors(f"--out {args.out}: making the folder"):
        out.mkdir(parents=True, exist_ok=True)
    for mesh in args.meshes:
        with output_errors(f"--out {args.out}: writing the ground truth of {mesh}"):
            path = write_object_ground_truth(
                mesh,
                out,
                args.synset,
                args.images,
                view=args.view,
                n_points=args.points,
                scale=args.scale,
                seed=args.seed,
            )
        print(f"wrote {path}", file=sys.stderr)
    return 0
