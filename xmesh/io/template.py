"""The mesh template: the official ``.dat`` layout (``iccv_p2mpp.dat``), loaded, validated and saved.

The file is a Python pickle of a dict (see ``golden/README.md``)::

    coord               (N0,3) float           the initial ellipsoid
    stage1/2/3          [T0, T1] per stage, each (coords (nnz,2) int, values (nnz,), shape (2,))
    pool_idx            [(N1-N0,2), (N2-N1,2)] int edge endpoints; unpooling appends their midpoints
    faces               3 x (F,4) int          faces_triangle with the first index repeated
    lape_idx            3 x (N,10) int         8 neighbours padded with -1, self index, count
    faces_triangle      3 x (F,3) int          0-based triangles of each level
    sample_coord        (K,3) float            deformation hypotheses (K = 43)
    sample_cheb_dense   2 x (K,K) float        dense supports of the hypothesis graph

Vertex counts follow from the file: N1 = N0 + len(pool_idx[0]), N2 = N1 + len(pool_idx[1]).
Everything is validated on load; a bad file raises :class:`~xmesh.errors.FileFormatError` naming
the file, the key and the problem. Nothing in the pickle is executed (``xmesh.io.safe_pickle``).
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import pickletools
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..errors import FileFormatError, InputError
from . import safe_pickle
from .atomic import atomic_write

NUM_STAGES = 3
CHEB_ORDER = 2  # supports per stage: T0 (identity) and T1
REQUIRED_KEYS = (
    "coord",
    "stage1",
    "stage2",
    "stage3",
    "pool_idx",
    "faces",
    "lape_idx",
    "faces_triangle",
    "sample_coord",
    "sample_cheb_dense",
)


@dataclass(frozen=True, eq=False)
class Template:
    """A validated mesh template; all arrays live on the host and are read-only.

    ``supports[s][k]`` is the k-th Chebyshev support (float32 CSR, N_s x N_s) of stage s;
    ``pool_idx[s]`` (int64, (N_{s+1}-N_s, 2)) the edges whose midpoints unpooling appends;
    ``faces_triangle[s]`` the 0-based int64 triangles of level s. ``faces`` and ``lape_idx`` are
    kept as read from the file (only for writing it back).
    """

    coord: np.ndarray
    supports: tuple
    pool_idx: tuple
    faces_triangle: tuple
    faces: tuple
    lape_idx: tuple
    sample_coord: np.ndarray
    sample_cheb: tuple

    @property
    def num_vertices(self) -> tuple[int, ...]:
        counts = [int(self.coord.shape[0])]
        for pairs in self.pool_idx:
            counts.append(counts[-1] + int(pairs.shape[0]))
        return tuple(counts)

    @property
    def num_faces(self) -> tuple[int, ...]:
        return tuple(int(f.shape[0]) for f in self.faces_triangle)

    @property
    def num_hypotheses(self) -> int:
        return int(self.sample_coord.shape[0])


# --------------------------------------------------------------------------------------------
# validation helpers: each returns a clean array or raises FileFormatError naming source + key


def _fail(source: str, key: str, problem: str) -> FileFormatError:
    return FileFormatError(f"{source}: template key {key}: {problem}")


def _array(value: Any, source: str, key: str, kinds: str, what: str) -> np.ndarray:
    if isinstance(value, (str, bytes, dict)) or value is None:
        raise _fail(source, key, f"is a {type(value).__name__}, expected {what}")
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise _fail(source, key, f"cannot be read as an array ({exc}); expected {what}") from None
    if arr.dtype.kind not in kinds:
        raise _fail(source, key, f"has dtype {arr.dtype}, expected {what}")
    return arr


def _floats(value: Any, source: str, key: str, shape: tuple, what: str) -> np.ndarray:
    """A finite float32 array of the given shape (None in ``shape`` matches any length)."""
    arr = _array(value, source, key, "fiu", what)
    _check_shape(arr, shape, source, key, what)
    with np.errstate(over="ignore", invalid="ignore"):
        arr = arr.astype(np.float32)
    if not np.all(np.isfinite(arr)):
        bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        raise _fail(
            source, key, f"holds {bad} non-finite value(s) (NaN/inf, or too large for float32); expected finite numbers"
        )
    return arr


def _ints(
    value: Any, source: str, key: str, shape: tuple, what: str, low: int | None = None, high: int | None = None
) -> np.ndarray:
    """An int64 array of the given shape with values in [low, high)."""
    arr = _array(value, source, key, "iu", what)
    _check_shape(arr, shape, source, key, what)
    arr = arr.astype(np.int64)
    if arr.size and low is not None and high is not None:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < low or hi >= high:
            raise _fail(source, key, f"holds indices from {lo} to {hi}, expected values in [{low}, {high})")
    return arr


def _check_shape(arr: np.ndarray, shape: tuple, source: str, key: str, what: str) -> None:
    ok = arr.ndim == len(shape) and all(want is None or want == got for want, got in zip(shape, arr.shape))
    if not ok:
        raise _fail(source, key, f"has shape {arr.shape}, expected {what}")


def _sequence(value: Any, length: int, source: str, key: str, what: str) -> list:
    if not isinstance(value, (list, tuple)):
        raise _fail(source, key, f"is a {type(value).__name__}, expected a list of {length} {what}")
    if len(value) != length:
        raise _fail(source, key, f"has {len(value)} entries, expected {length} {what}")
    return list(value)


def _readonly(arr: np.ndarray) -> np.ndarray:
    arr = np.ascontiguousarray(arr)
    arr.setflags(write=False)
    return arr


def _support(entry: Any, n: int, source: str, key: str) -> sp.csr_matrix:
    """One sparse support ``(coords (nnz,2), values (nnz,), shape (2,))`` -> float32 CSR (n, n)."""
    coords, values, shape = _sequence(entry, 3, source, key, "items (coords, values, shape)")
    shape = _ints(shape, source, f"{key} shape", (2,), "2 integers (rows, columns)")
    if tuple(int(s) for s in shape) != (n, n):
        raise _fail(
            source,
            f"{key} shape",
            f"is {tuple(int(s) for s in shape)}, expected ({n}, {n}): the vertex count of its stage",
        )
    coords = _ints(coords, source, f"{key} coords", (None, 2), "an integer (nnz, 2) array of (row, column)", 0, n)
    values = _floats(values, source, f"{key} values", (None,), "a float (nnz,) array")
    if values.shape[0] != coords.shape[0]:
        raise _fail(
            source, key, f"has {coords.shape[0]} coords but {values.shape[0]} values; expected the same number (nnz)"
        )
    mat = sp.csr_matrix((values, (coords[:, 0], coords[:, 1])), shape=(n, n), dtype=np.float32)
    mat.sum_duplicates()
    mat.sort_indices()
    for part in (mat.data, mat.indices, mat.indptr):
        part.setflags(write=False)
    return mat


def template_from_dict(data: Any, source: str = "<template dict>") -> Template:
    """Validate a dict of the official layout and build a :class:`Template`; ``source`` names it in errors."""
    if not isinstance(data, dict):
        raise FileFormatError(
            f"{source}: holds a {type(data).__name__}, expected a dict with the keys {', '.join(REQUIRED_KEYS)}"
        )
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise FileFormatError(
            f"{source}: the template lacks the key(s) {', '.join(missing)}; expected all of {', '.join(REQUIRED_KEYS)}"
        )

    coord = _floats(data["coord"], source, "coord", (None, 3), "a float (N0, 3) array of vertex positions")
    if coord.shape[0] < 4:
        raise _fail(source, "coord", f"has {coord.shape[0]} vertices, expected at least 4 (a closed mesh)")

    pools_raw = _sequence(data["pool_idx"], NUM_STAGES - 1, source, "pool_idx", "integer (P, 2) edge arrays")
    counts = [coord.shape[0]]
    pool_idx = []
    for k, pairs in enumerate(pools_raw):
        pairs = _ints(
            pairs,
            source,
            f"pool_idx[{k}]",
            (None, 2),
            f"an integer (P, 2) array of vertex pairs of level {k}",
            0,
            counts[-1],
        )
        pool_idx.append(_readonly(pairs))
        counts.append(counts[-1] + pairs.shape[0])

    supports = []
    for s in range(NUM_STAGES):
        key = f"stage{s + 1}"
        entries = _sequence(data[key], CHEB_ORDER, source, key, "sparse supports (coords, values, shape)")
        supports.append(tuple(_support(e, counts[s], source, f"{key}[{k}]") for k, e in enumerate(entries)))

    tri_raw = _sequence(data["faces_triangle"], NUM_STAGES, source, "faces_triangle", "integer (F, 3) arrays")
    faces_triangle = tuple(
        _readonly(
            _ints(
                f,
                source,
                f"faces_triangle[{s}]",
                (None, 3),
                f"an integer (F, 3) array of 0-based vertex indices of level {s}",
                0,
                counts[s],
            )
        )
        for s, f in enumerate(tri_raw)
    )

    faces_raw = _sequence(data["faces"], NUM_STAGES, source, "faces", "integer (F, 4) arrays")
    faces = tuple(
        _readonly(_array(f, source, f"faces[{s}]", "iu", "an integer 2-D array")) for s, f in enumerate(faces_raw)
    )
    for s, f in enumerate(faces):
        if f.ndim != 2:
            raise _fail(source, f"faces[{s}]", f"has shape {f.shape}, expected a 2-D integer array")

    lape_raw = _sequence(data["lape_idx"], NUM_STAGES, source, "lape_idx", "integer (N, 10) arrays")
    lape_idx = tuple(
        _readonly(_array(a, source, f"lape_idx[{s}]", "iu", "an integer 2-D array")) for s, a in enumerate(lape_raw)
    )
    for s, a in enumerate(lape_idx):
        if a.ndim != 2 or a.shape[0] != counts[s]:
            raise _fail(
                source,
                f"lape_idx[{s}]",
                f"has shape {a.shape}, expected ({counts[s]}, 10): one row per vertex of level {s}",
            )

    sample_coord = _floats(
        data["sample_coord"], source, "sample_coord", (None, 3), "a float (K, 3) array of hypothesis offsets"
    )
    num_k = sample_coord.shape[0]
    cheb_raw = _sequence(
        data["sample_cheb_dense"], CHEB_ORDER, source, "sample_cheb_dense", f"dense ({num_k}, {num_k}) supports"
    )
    sample_cheb = tuple(
        _readonly(
            _floats(
                a,
                source,
                f"sample_cheb_dense[{k}]",
                (num_k, num_k),
                f"a float ({num_k}, {num_k}) array (K = len(sample_coord))",
            )
        )
        for k, a in enumerate(cheb_raw)
    )

    return Template(
        coord=_readonly(coord),
        supports=tuple(supports),
        pool_idx=tuple(pool_idx),
        faces_triangle=faces_triangle,
        faces=faces,
        lape_idx=lape_idx,
        sample_coord=_readonly(sample_coord),
        sample_cheb=sample_cheb,
    )


def load_template(path: str | os.PathLike) -> Template:
    """Read and validate a template file of the official layout (e.g. ``iccv_p2mpp.dat``)."""
    data = safe_pickle.load(path, what="mesh template (.dat)")
    return template_from_dict(data, source=os.fspath(path))


# --------------------------------------------------------------------------------------------
# writing


def _index_array(arr: np.ndarray) -> np.ndarray:
    """Indices as int32 like the official file, unless they do not fit."""
    arr = np.asarray(arr)
    if arr.size == 0 or (arr.min() >= np.iinfo(np.int32).min and arr.max() <= np.iinfo(np.int32).max):
        return arr.astype(np.int32)
    return arr.astype(np.int64)


def _support_tuple(mat: sp.spmatrix) -> tuple:
    coo = sp.csr_matrix(mat).tocoo()
    coords = np.stack([coo.row, coo.col], axis=1).astype(np.int64)
    return coords, coo.data.astype(np.float32), np.array(coo.shape, dtype=np.int64)


def template_to_dict(template: Template) -> dict:
    """The official layout of ``template`` (the dict that ``save_template`` pickles)."""
    if not isinstance(template, Template):
        raise InputError(f"template_to_dict: template is a {type(template).__name__}, expected xmesh Template")
    out: dict = {
        "coord": np.array(template.coord, dtype=np.float32),
        "pool_idx": [_index_array(p) for p in template.pool_idx],
        "faces": [np.array(f) for f in template.faces],
        "lape_idx": [np.array(a) for a in template.lape_idx],
        "faces_triangle": [_index_array(f) for f in template.faces_triangle],
    }
    for s, stage in enumerate(template.supports):
        out[f"stage{s + 1}"] = [_support_tuple(m) for m in stage]
    out["sample_coord"] = np.array(template.sample_coord, dtype=np.float32)
    out["sample_cheb_dense"] = [np.array(a, dtype=np.float32) for a in template.sample_cheb]
    return out


def template_fingerprint(template: Template) -> str:
    """SHA-256 (hex) of ``template``'s official layout: every array's place, dtype, shape and bytes, so the
    same mesh from any file (or the built-in one) gives the same fingerprint."""
    digest = hashlib.sha256()

    def feed(place: str, value: Any) -> None:
        if isinstance(value, dict):
            for key in sorted(value):
                feed(f"{place}/{key}", value[key])
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                feed(f"{place}/{i}", item)
        else:
            array = np.ascontiguousarray(value)
            digest.update(f"{place}:{array.dtype.str}:{array.shape}\n".encode())
            digest.update(array.tobytes())

    feed("", template_to_dict(template))
    return digest.hexdigest()


# NumPy >= 2 names its array rebuilder ``numpy._core.multiarray``, a module NumPy 1 (and so
# Python 2) lacks; ``numpy.core.multiarray`` is readable by every NumPy version.
_PORTABLE_GLOBALS = {
    "numpy._core.multiarray _reconstruct": "numpy.core.multiarray _reconstruct",
    "numpy._core.multiarray scalar": "numpy.core.multiarray scalar",
}


def _portable_pickle(obj: Any) -> bytes:
    """Protocol-2 pickle of ``obj`` whose globals all resolve under NumPy 1 and 2 alike."""
    data = pickle.dumps(obj, protocol=2)
    out = io.BytesIO()
    start = 0
    for op, arg, pos in pickletools.genops(data):
        if op.name == "GLOBAL" and arg in _PORTABLE_GLOBALS:
            module, name = _PORTABLE_GLOBALS[arg].split(" ")
            out.write(data[start:pos])
            out.write(b"c" + module.encode("ascii") + b"\n" + name.encode("ascii") + b"\n")
            start = pos + 1 + len(arg) + 1  # opcode, "module\nname", final newline
    out.write(data[start:])
    return out.getvalue()


def save_template(template: Template, path: str | os.PathLike) -> None:
    """Write ``template`` in the official layout (pickle protocol 2, Python 2 readable), atomically."""
    data = _portable_pickle(template_to_dict(template))
    with atomic_write(path, "wb") as fh:
        fh.write(data)
