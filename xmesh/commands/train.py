"""xmesh train --stage S --images ROOT --gt ROOT --list FILE --weights W [W ...] --out DIR"""

from __future__ import annotations

from .common import add_model_options, add_views_option


def add_parser(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train or fine-tune stage 1 or stage 2, step for step as the original",
        description="Train one stage of Pixel2Mesh++ on a list in the official layout (renderings and "
        "ground-truth .dat, your own objects' from xmesh ground-truth): one sample a step, "
        "the list shuffled every epoch, Adam (lr 1e-5), the original's losses. Checkpoints "
        "go to OUT/checkpoints at every epoch end (and every --checkpoint-every steps); "
        "running again with the same --out resumes. OUT/weights.npz and the stage's "
        "TensorFlow checkpoint hold the result; docs/training.md says what is faithful "
        "and what is a deviation.",
    )
    p.add_argument(
        "--stage", type=int, required=True, choices=(1, 2), help="the stage to train (1: MVP2M, 2: the DRBs)"
    )
    p.add_argument(
        "--images",
        required=True,
        metavar="ROOT",
        help="the ShapeNetRendering folder ({synset}/{item}/rendering/NN.png), or a folder holding it",
    )
    p.add_argument(
        "--gt", required=True, metavar="ROOT", help="folder of the ground-truth {synset}_{item}_NN.dat files"
    )
    p.add_argument("--list", required=True, metavar="FILE", help="training list: one {synset}_{item}_NN.dat per line")
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="run folder: checkpoints/, train_log.csv, val_log.csv, loss.png, weights.npz and the TF checkpoint",
    )
    p.add_argument("--epochs", type=int, default=None, help="epochs to train (default: 50 for stage 1, 10 for stage 2)")
    p.add_argument(
        "--batch-size",
        type=int,
        default=1,
        metavar="B",
        help="samples averaged per Adam step (default 1, the original's; more is a deviation)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        metavar="K",
        help="also checkpoint every K steps (default: at epoch ends only)",
    )
    p.add_argument(
        "--val-list",
        default=None,
        metavar="FILE",
        help="score Chamfer and F-score on this list after every epoch, into OUT/val_log.csv",
    )
    p.add_argument(
        "--val-images", default=None, metavar="ROOT", help="the validation list's renderings (default: --images)"
    )
    p.add_argument("--val-gt", default=None, metavar="ROOT", help="the validation list's ground truth (default: --gt)")
    p.add_argument(
        "--starts",
        default=None,
        metavar="DIR",
        help="stage 2: a folder of stage 1's meshes, {id}_predict.xyz (or the original's "
        "coarse_intermediate {synset}_{item}_00_predict.xyz); default: computed once from the stage-1 "
        "weights in "
        "--weights into OUT/starts/",
    )
    p.add_argument(
        "--cnn-from-stage1",
        action="store_true",
        help="stage 2: start its CNN from stage 1's CNN in --weights, as the original's stage-2 training "
        "restores a CNN before its first step",
    )
    p.add_argument("--lr", type=float, default=1e-5, help="Adam's learning rate (default 1e-5, the original's)")
    p.add_argument(
        "--seed",
        type=int,
        default=123,
        help="seed of the data order and the loss's surface samples (default 123, the original's)",
    )
    add_views_option(p)
    p.add_argument("--overwrite", action="store_true", help="start afresh in --out, removing its checkpoints and logs")
    p.add_argument("--no-progress", action="store_true", help="do not draw the progress bar")
    add_model_options(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from ..errors import InputError
    from ..train.fit import fit

    if args.precision != "fp32":
        raise InputError(f"--precision {args.precision}: training runs in fp32, as the original")
    figures = fit(
        args.stage,
        args.images,
        args.gt,
        args.list,
        list(args.weights),
        args.out,
        epochs=args.epochs,
        batch_size=args.batch_size,
        checkpoint_every=args.checkpoint_every,
        val_list=args.val_list,
        val_images=args.val_images,
        val_gt=args.val_gt,
        starts=args.starts,
        template=args.template,
        backend=args.backend,
        lr=args.lr,
        seed=args.seed,
        views=args.views,
        view_quirk=not args.no_view_quirk,
        cnn_from_stage1=args.cnn_from_stage1,
        overwrite=args.overwrite,
        progress=not args.no_progress,
    )
    print(f"xmesh train: {figures['summary']}")
    for line in figures["wrote"]:
        print(f"wrote {line}")
    return 0
