"""Model weights: the official variable spec, loading (npz / checkpoint / dict), validation, synthetic draws.

Weights are dicts keyed by the official checkpoint names *with* ``:0`` (e.g.
``meshnetmvp2m/cnn/conv2d_1/W:0``), holding float32 arrays. Stage 1 (MVP2M) variables start with
``meshnetmvp2m/``, stage 2 (MeshNet) ones with ``meshnet/``; the official release ships one
checkpoint per stage, so :func:`load_weights` accepts a list of sources and merges them.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import zipfile
import zlib
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from xmesh.errors import InputError, MissingFileError, WeightsError, first_few

__all__ = [
    "STAGE_PREFIXES",
    "expected_variables",
    "synthetic_weights",
    "load_weights",
    "validate_weights",
    "normalize_name",
    "weights_fingerprint",
]

STAGE_PREFIXES = {1: "meshnetmvp2m/", 2: "meshnet/"}
_STAGE_LABELS = {1: "stage-1 (meshnetmvp2m)", 2: "stage-2 (meshnet)"}

# CNN18: (out channels, kernel size) for conv2d_1..18; strides do not affect the variables.
_CNN = [
    (16, 3),
    (16, 3),
    (32, 3),
    (32, 3),
    (32, 3),
    (64, 3),
    (64, 3),
    (64, 3),
    (128, 3),
    (128, 3),
    (128, 3),
    (256, 5),
    (256, 3),
    (256, 3),
    (512, 5),
    (512, 3),
    (512, 3),
    (512, 3),
]
_HIDDEN = 192
_STAGE1_PROJ = 3 + 3 * 960  # coords + max/mean/std of 4 gathered maps (64+128+256+512)
_STAGE2_PROJ = 3 + 3 * 112  # coords + max/mean/std of 16+32+64


def _cnn(prefix: str) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    cin = 3
    for k, (cout, ksize) in enumerate(_CNN, start=1):
        out[f"{prefix}cnn/conv2d_{k}/W:0"] = (ksize, ksize, cin, cout)
        out[f"{prefix}cnn/conv2d_{k}/b:0"] = (cout,)
        cin = cout
    return out


def _gconv(scope: str, fin: int, fout: int) -> dict[str, tuple[int, ...]]:
    return {f"{scope}/weights_0:0": (fin, fout), f"{scope}/weights_1:0": (fin, fout), f"{scope}/bias:0": (fout,)}


def _stage1() -> dict[str, tuple[int, ...]]:
    prefix = STAGE_PREFIXES[1]
    out = _cnn(prefix)
    # (block, number of layers, layer index of the first one, input width of the first one)
    for block, count, first_idx, first_in in (
        (1, 14, 1, _STAGE1_PROJ),
        (2, 14, 17, _STAGE1_PROJ + _HIDDEN),
        (3, 15, 33, _STAGE1_PROJ + _HIDDEN),
    ):
        for j in range(1, count + 1):
            idx = first_idx + j - 1
            fin = first_in if j == 1 else _HIDDEN
            fout = 3 if j == count else _HIDDEN
            out.update(_gconv(f"{prefix}pixel2mesh/graph_conv_blk{block}_{j}_layer_{idx}_vars", fin, fout))
    return out


def _stage2() -> dict[str, tuple[int, ...]]:
    prefix = STAGE_PREFIXES[2]
    out = _cnn(prefix)
    widths = [(_STAGE2_PROJ, _HIDDEN)] + [(_HIDDEN, _HIDDEN)] * 4 + [(_HIDDEN, 1)]
    for scope, first in (("graph_drb_blk1_layer_2", 1), ("graph_drb_blk2_layer_5", 7)):
        for i, (fin, fout) in enumerate(widths):
            out.update(_gconv(f"{prefix}pixel2mesh/{scope}/localgconv_{first + i}_vars", fin, fout))
    return out


def _check_stages(stages: Any, arg: str = "stages") -> tuple[int, ...]:
    if isinstance(stages, int) and not isinstance(stages, bool):
        stages = (stages,)
    try:
        chosen = tuple(sorted(set(stages)))
    except TypeError:
        raise InputError(f"{arg}: expected 1, 2 or a sequence of them, got {stages!r}") from None
    if not chosen or any(s not in STAGE_PREFIXES for s in chosen):
        raise InputError(f"{arg}: expected a non-empty subset of (1, 2), got {stages!r}")
    return chosen


def expected_variables(stage: int | None = None) -> dict[str, tuple[int, ...]]:
    """Official variable names (with ``:0``) -> shapes, for ``stage`` 1, 2, or both (None)."""
    if stage is None:
        return {**_stage1(), **_stage2()}
    if stage == 1 and not isinstance(stage, bool):
        return _stage1()
    if stage == 2:
        return _stage2()
    raise InputError(f"stage: expected 1, 2 or None, got {stage!r}")


def _draw(name: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if len(shape) == 4:
        kh, kw, cin, _ = shape
        lim = math.sqrt(6.0 / (kh * kw * cin))
        return rng.uniform(-lim, lim, shape)
    if len(shape) == 2:
        fin, fout = shape
        lim = math.sqrt(6.0 / (fin + fout))
        if "graph_conv_blk" in name and fout == 3:
            lim *= 0.1
        u = rng.uniform(-lim, lim, shape)
        if fout == 1:
            u = 0.05 * (u + lim) if name.endswith("weights_0:0") else 0.01 * u
        return u
    u = rng.uniform(-0.05, 0.05, shape)
    if "graph_conv_blk" in name and shape == (3,):
        u = u + np.array([0.0, 0.0, -0.8])
    elif shape == (1,):
        u = u + 1.0
    return u


def synthetic_weights(
    seed: int, stages: Iterable[int] | int = (1, 2), small_moves: bool = False
) -> dict[str, np.ndarray]:
    """Weights drawn by the recipe of ``golden/README.md`` (float64 draws stored as float32).

    ``small_moves``: the demo's variant, whose stage-1 graph convolutions carry each vertex's
    coordinates through (:func:`_carry_coordinates`) beside the recipe's draws scaled by
    :data:`SMALL_MOVE_SCALE`, so the template comes out visibly deformed by the images rather than
    collapsed; stage 2 is the recipe's."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed: expected a non-negative integer, got {seed!r}")

    def one(stage: int, name: str, shape: tuple) -> np.ndarray:
        value = _draw(name, shape, int(seed))
        if small_moves and stage == 1 and "graph_conv_blk" in name:
            value = _carry_coordinates(name, SMALL_MOVE_SCALE * value)
        return value.astype(np.float32)

    variables = [
        (stage, name, shape) for stage in _check_stages(stages) for name, shape in expected_variables(stage).items()
    ]
    # each variable has its own generator, so drawing them in threads (NumPy fills arrays without
    # the GIL) gives the same arrays; the largest first, so that the threads finish together
    largest = sorted(variables, key=lambda v: -math.prod(v[2]))
    with ThreadPoolExecutor(max_workers=_DRAW_THREADS, thread_name_prefix="xmesh-draw") as pool:
        drawn = dict(zip((v[1] for v in largest), pool.map(lambda v: one(*v), largest)))
    return {name: drawn[name] for _, name, _ in variables}


_DRAW_THREADS = max(
    1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
)


SMALL_MOVE_SCALE = 0.02  # the demo variant's share of the recipe's draws in stage 1's graph convolutions


def _carry_coordinates(name: str, drawn: np.ndarray) -> np.ndarray:
    """A stage-1 graph-convolution variable that also passes the coordinates on: a block's first
    layer puts x and -x (its input's first three channels, the coordinates) in hidden channels
    0-5, which every hidden layer keeps (ReLU leaves them as relu(x), relu(-x)) and the block's
    last layer turns back into x."""
    carried = drawn.copy()
    if not name.endswith("weights_0:0"):  # the neighbours' weights and the biases: the draws alone
        return carried
    fin, fout = carried.shape
    eye = np.eye(3)
    if fout == 3:  # last layer of a block: x = relu(x) - relu(-x)
        carried[0:3] += eye
        carried[3:6] -= eye
    elif fin == _HIDDEN:  # a hidden layer keeps channels 0-5
        carried[0:6, 0:6] += np.eye(6)
    else:  # a block's first layer, after a projection (coordinates first)
        carried[0:3, 0:3] += eye
        carried[0:3, 3:6] -= eye
    return carried


def normalize_name(key: str) -> str:
    """Official form of a weight key: '|' -> '/', and ``:0`` appended when no ``:N`` suffix is present."""
    name = str(key).replace("|", "/")
    head, sep, tail = name.rpartition(":")
    if not (sep and tail.isdigit()):
        name += ":0"
    return name


EXPECTED_SOURCE = (
    "expected an .npz keyed by the official variable names (e.g. meshnetmvp2m/cnn/conv2d_1/W:0) or a "
    "TensorFlow checkpoint prefix (PREFIX with PREFIX.index beside it)"
)
# (leading bytes, what a file that starts with them is) of formats a weights path may wrongly name
_SIGNATURES = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file (Keras weights?)"),
    (b"\x93NUMPY", "a single NumPy .npy array"),
    (b"PK\x03\x04", "a zip archive"),
    (b"PK\x05\x06", "an empty zip archive"),
    (b"\x80", "a Python pickle (a PyTorch checkpoint?)"),
    (b"\x1f\x8b", "a gzip file"),
)
IMAGE_KINDS = ("a PNG image", "a JPEG image")
NPZ_KIND = "an .npz (a zip archive of .npy arrays)"


def describe_file(path: str | os.PathLike) -> str:
    """What the file at ``path`` holds, from its first bytes ("a PNG image", "a zip archive", "text",
    "3000 bytes of unknown content"), for messages about a file of the wrong kind."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(64)
        size = os.path.getsize(path)
    except OSError:
        return "an unreadable file"
    if not head:
        return "an empty file"
    for signature, kind in _SIGNATURES:
        if head.startswith(signature):
            if kind == "a zip archive" and zipfile.is_zipfile(path):
                with zipfile.ZipFile(path) as archive:
                    names = archive.namelist()
                if any(n.endswith("data.pkl") for n in names):
                    return "a PyTorch checkpoint (a zip archive holding data.pkl)"
                if names and all(n.endswith(".npy") for n in names):
                    return NPZ_KIND
                return (
                    f"a zip archive of {len(names)} file(s) ({first_few(names)}; a release of the official "
                    "checkpoints is stored by xmesh weights add ZIP, then named 'official')"
                )
            if kind == "a zip archive":
                return "a truncated or damaged zip archive (its table of contents is missing)"
            return kind
    try:
        head.decode("utf-8")
        return "text"
    except UnicodeDecodeError:
        return f"{size} bytes of unknown content (starting {head[:8]!r})"


def wrong_kind(path: str | os.PathLike, what: str) -> WeightsError:
    """The error for a weights path whose file is ``what`` (:func:`describe_file`), not weights."""
    return WeightsError(f"{path}: {what}, not Pixel2Mesh++ weights; {EXPECTED_SOURCE}")


def _any_known(names: Iterable[str]) -> bool:
    """Whether any of ``names`` is a variable of either stage."""
    known = expected_variables()
    return any(normalize_name(n) in known for n in names)


def _none_wanted(path: Path, kind: str, names: list[str]) -> WeightsError:
    """The error for weights whose arrays all have other names than the model's: a file of another model."""
    known = list(expected_variables())
    return WeightsError(
        f"{path}: {kind} of {len(names)} array(s) ({first_few(sorted(names)) or 'none'}), none of "
        f"them a Pixel2Mesh++ variable; expected the official names, {len(known)} in all "
        f"({first_few(known)})"
    )


def _from_npz(path: Path, wanted: set[str]) -> dict[str, Any]:
    if not zipfile.is_zipfile(path):  # NumPy would read any other bytes as a pickle and advise allow_pickle
        what = describe_file(path)
        if what != "a single NumPy .npy array":
            raise wrong_kind(path, what)
    try:
        npz = np.load(path, allow_pickle=False)
        if not hasattr(npz, "files"):
            raise ValueError("it holds a single array, not a zip archive of named arrays")
        with npz:
            if not _any_known(npz.files):
                raise _none_wanted(path, "an .npz", list(npz.files))
            return {normalize_name(k): npz[k] for k in npz.files if normalize_name(k) in wanted}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error, KeyError, NotImplementedError) as exc:
        if isinstance(exc, WeightsError):
            raise
        if "Object arrays" in str(exc):
            raise WeightsError(
                f"{path}: an .npz holding object arrays (pickled Python objects, which xmesh does not "
                "load: loading them could run code); expected an .npz of plain float32 arrays keyed by "
                "official variable names"
            ) from None
        raise WeightsError(
            f"{path}: not a readable weights .npz ({type(exc).__name__}: {exc}); expected an .npz of plain "
            "float32 arrays keyed by official variable names (object arrays and pickles are refused)"
        ) from None


def _from_path(path: Path, wanted: set[str]) -> dict[str, Any]:
    if path.suffix == ".npz":
        if path.is_dir():
            raise InputError(
                f"{path}: weights path is a folder; expected an .npz file keyed by official variable names"
            )
        if not path.is_file():
            raise MissingFileError(f"{path}: weights file not found; expected an .npz keyed by official variable names")
        return _from_npz(path, wanted)
    if not path.exists() and not Path(f"{path}.index").exists():
        raise MissingFileError(
            f"{path}: weights source not found; expected an .npz file, a checkpoint prefix "
            f"(PREFIX.index beside it), a .index file or a folder with a 'checkpoint' file"
        )
    checkpoint_file = path.suffix == ".index" or re.fullmatch(r".*\.data-\d{5}-of-\d{5}", path.name)
    if path.is_file() and not checkpoint_file and not Path(f"{path}.index").exists():
        # a file that is no checkpoint's part: an .npz under another name, or a file of another kind
        what = describe_file(path)
        if what == NPZ_KIND:
            return _from_npz(path, wanted)
        raise wrong_kind(path, what)
    from xmesh.io.checkpoint import read_checkpoint, read_index, resolve_prefix  # numba's import: only here

    prefix = resolve_prefix(path)
    stored = list(read_index(prefix))
    if not _any_known(stored):
        raise _none_wanted(prefix, "a TensorFlow checkpoint", stored)
    names = [n for n in stored if normalize_name(n) in wanted]
    return {normalize_name(k): v for k, v in read_checkpoint(prefix, names).items()}


def _collect(source: Any, wanted: set[str], out: dict[str, Any]) -> None:
    if isinstance(source, (list, tuple)):
        if not source:
            raise InputError("source: empty list of weight sources; expected at least one .npz, checkpoint or dict")
        for item in source:
            _collect(item, wanted, out)
    elif isinstance(source, Mapping):
        for key, value in source.items():
            name = normalize_name(key)
            if name in wanted:
                out[name] = value
    elif isinstance(source, (str, os.PathLike)):
        out.update(_from_path(Path(source), wanted))
    else:
        raise InputError(
            f"source: expected a path (.npz or checkpoint prefix), a dict of arrays or a list of those, "
            f"got {type(source).__name__}"
        )


def load_weights(source: Any, stages: Iterable[int] | int = (1, 2)) -> dict[str, np.ndarray]:
    """Weights for ``stages`` from an .npz, a checkpoint (prefix, .index or folder), a dict, or a list of
    these (merged; later sources override earlier ones). Returns float32 C-contiguous arrays keyed by
    official names with ``:0``; variables the stages do not use are dropped. Raises WeightsError."""
    chosen = _check_stages(stages)
    wanted: set[str] = set()
    for stage in chosen:
        wanted.update(expected_variables(stage))
    raw: dict[str, Any] = {}
    _collect(source, wanted, raw)
    validate_weights(raw, chosen)
    return {name: np.ascontiguousarray(raw[name], dtype=np.float32) for name in sorted(raw)}


def weights_fingerprint(weights: Mapping[str, np.ndarray]) -> str:
    """SHA-256 (hex) of loaded weights (:func:`load_weights`): every array's name, shape and float32
    bytes in name order, so equal weights from an .npz or a checkpoint give the same fingerprint."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        array = np.ascontiguousarray(weights[name], dtype="<f4")
        digest.update(f"{name}:{array.shape}\n".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _missing_hint(missing: list[str], chosen: tuple[int, ...]) -> str:
    """A hint when every variable of a requested stage is missing (the other checkpoint was not passed)."""
    absent = set(missing)
    hints = []
    for stage in chosen:
        if set(expected_variables(stage)) <= absent:
            ckpt = "meshnetmvp2m" if stage == 1 else "meshnet"
            hints.append(
                f"all {len(expected_variables(stage))} {_STAGE_LABELS[stage]} variables are missing: "
                f"pass the {ckpt} checkpoint too, e.g. load_weights([stage1_source, stage2_source])"
                + (f", or ask only for stages=({3 - stage},)" if len(chosen) == 2 else "")
            )
    return "; ".join(hints)


def validate_weights(weights: Mapping[str, Any], stages: Iterable[int] | int = (1, 2)) -> None:
    """Check ``weights`` holds every variable of ``stages`` with the right shape, a floating dtype and
    finite values (as float32). Raises WeightsError listing every problem; the error carries the
    lists as attributes ``missing``, ``wrong_shape``, ``wrong_dtype``, ``non_finite``."""
    chosen = _check_stages(stages)
    given = {normalize_name(k): v for k, v in weights.items()}
    missing: list[str] = []
    wrong_shape: list[tuple[str, tuple, tuple]] = []
    wrong_dtype: list[tuple[str, str]] = []
    non_finite: list[tuple[str, int]] = []
    for stage in chosen:
        for name, shape in expected_variables(stage).items():
            if name not in given:
                missing.append(name)
                continue
            try:
                arr = np.asarray(given[name])
            except (ValueError, TypeError) as exc:
                wrong_dtype.append((name, f"not an array ({exc})"))
                continue
            if arr.dtype.kind != "f":
                wrong_dtype.append((name, str(arr.dtype)))
                continue
            if tuple(arr.shape) != shape:
                wrong_shape.append((name, shape, tuple(arr.shape)))
                continue
            with np.errstate(over="ignore"):
                bad = int(arr.size - np.count_nonzero(np.isfinite(arr.astype(np.float32, copy=False))))
            if bad:
                non_finite.append((name, bad))
    if not (missing or wrong_shape or wrong_dtype or non_finite):
        return
    parts = []
    if missing:
        hint = _missing_hint(missing, chosen)
        absent = set(missing)
        whole = {n for stage in chosen if set(expected_variables(stage)) <= absent for n in expected_variables(stage)}
        rest = [n for n in missing if n not in whole]  # the names a whole missing stage's hint does not cover
        parts.append(
            f"{len(missing)} missing variable(s)"
            + (f" ({hint})" if hint else "")
            + (f": {first_few(rest)}" if rest else "")
        )
    if wrong_shape:
        parts.append(
            f"{len(wrong_shape)} variable(s) with the wrong shape: "
            + first_few([f"{n}: expected {e}, got {g}" for n, e, g in wrong_shape])
        )
    if wrong_dtype:
        parts.append(
            f"{len(wrong_dtype)} variable(s) with a non-floating dtype (expected float32): "
            + first_few([f"{n}: {d}" for n, d in wrong_dtype])
        )
    if non_finite:
        parts.append(
            f"{len(non_finite)} variable(s) with non-finite values (NaN/inf, also after casting to float32): "
            + first_few([f"{n}: {c} value(s)" for n, c in non_finite])
        )
    err = WeightsError(f"weights for stages {chosen} are invalid: " + "; ".join(parts))
    err.missing, err.wrong_shape, err.wrong_dtype, err.non_finite = missing, wrong_shape, wrong_dtype, non_finite
    raise err
