"""Procedural closed triangle meshes (outward-facing) and area-weighted surface sampling.

Every builder returns ``(vertices (V, 3) float32, faces (F, 3) int64)``, 0-based, with faces wound
counter-clockwise seen from outside. Composite shapes (airplane, chair, table, car) are unions of
closed parts that may overlap; each part is closed on its own.

Size: :func:`make_shape` centres a shape on its bounding box and scales it so the farthest vertex
lies at ``radius`` (default :data:`DEFAULT_RADIUS` = 0.24) from the origin, y up. That is the scale
of xmesh's world frame: the official demo's predicted airplane spans a radius of 0.23 there, and the
network's 248 px focal at 224 px (half field of view 24.3 deg) keeps a sphere of radius 0.24
inside the picture from any camera distance >= 0.59.
"""

from __future__ import annotations

import numpy as np

from xmesh.errors import InputError
from xmesh.model.camera import OBJECT_RADIUS

DEFAULT_RADIUS = OBJECT_RADIUS
SHAPE_NAMES = ("airplane", "chair", "table", "car", "torus", "superquadric")


# ------------------------------------------------------------------------------------- helpers


def as_rng(rng) -> np.random.Generator:
    """A NumPy Generator from a Generator, an int / sequence seed, or None (seed 0)."""
    if isinstance(rng, np.random.Generator):
        return rng
    return np.random.default_rng(0 if rng is None else rng)


def _signed_volume(vertices: np.ndarray, faces: np.ndarray) -> float:
    v = vertices.astype(np.float64)
    a, b, c = v[faces[:, 0]], v[faces[:, 1]], v[faces[:, 2]]
    return float(np.einsum("ij,ij->", a, np.cross(b, c)) / 6.0)


def _orient_outward(vertices: np.ndarray, faces: np.ndarray) -> np.ndarray:
    """Flip every face of a closed part whose signed volume is negative (inward winding)."""
    if _signed_volume(vertices, faces) < 0:
        return faces[:, ::-1].copy()
    return faces


def _finish(vertices, faces) -> tuple[np.ndarray, np.ndarray]:
    vertices = np.ascontiguousarray(vertices, dtype=np.float32)
    faces = np.ascontiguousarray(faces, dtype=np.int64)
    return vertices, _orient_outward(vertices, faces)


def merge(*parts: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate meshes into one (face indices offset), keeping each part as it is."""
    vertices, faces, offset = [], [], 0
    for v, f in parts:
        vertices.append(np.asarray(v, dtype=np.float32))
        faces.append(np.asarray(f, dtype=np.int64) + offset)
        offset += len(v)
    return np.concatenate(vertices), np.concatenate(faces)


def normalize(vertices: np.ndarray, radius: float = DEFAULT_RADIUS) -> np.ndarray:
    """Centre on the bounding box and scale so the farthest vertex is ``radius`` from the origin."""
    v = np.asarray(vertices, dtype=np.float64)
    v = v - (v.min(axis=0) + v.max(axis=0)) / 2.0
    extent = np.sqrt((v * v).sum(axis=1)).max()
    if not extent > 0:
        raise InputError("normalize: all vertices coincide; expected a shape with extent")
    return (v * (radius / extent)).astype(np.float32)


def _rotation_x(degrees: float) -> np.ndarray:
    t = np.deg2rad(degrees)
    c, s = np.cos(t), np.sin(t)
    return np.array([[1, 0, 0], [0, c, -s], [0, s, c]])


# ----------------------------------------------------------------------------------- primitives


def _cube_lattice(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The surface of the cube [-1, 1]^3 cut into n x n quads per side: unique vertices, outward faces."""
    if n < 1:
        raise InputError(f"subdivisions={n}: expected an integer >= 1")
    points, faces = [], []
    i, j = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    quad_i, quad_j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    quad_i, quad_j = quad_i.ravel(), quad_j.ravel()
    base = 0
    for axis in range(3):
        a, b = (axis + 1) % 3, (axis + 2) % 3  # e_a x e_b = e_axis
        for side in (0, n):
            grid = np.zeros((n + 1, n + 1, 3), dtype=np.int64)
            grid[..., axis] = side
            grid[..., a] = i
            grid[..., b] = j
            points.append(grid.reshape(-1, 3))
            idx = lambda di, dj, base=base: base + (quad_i + di) * (n + 1) + (quad_j + dj)  # noqa: E731
            tris = np.concatenate(
                [
                    np.stack([idx(0, 0), idx(1, 0), idx(1, 1)], axis=1),
                    np.stack([idx(0, 0), idx(1, 1), idx(0, 1)], axis=1),
                ]
            )
            faces.append(tris if side == n else tris[:, ::-1])
            base += (n + 1) ** 2
    lattice, inverse = np.unique(np.concatenate(points), axis=0, return_inverse=True)
    faces = inverse.reshape(-1)[np.concatenate(faces)]
    return lattice.astype(np.float64) * (2.0 / n) - 1.0, faces


def box(center, size, subdivisions: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """An axis-aligned box of full edge lengths ``size`` around ``center``, each side cut into quads."""
    unit, faces = _cube_lattice(subdivisions)
    vertices = unit * (np.asarray(size, dtype=np.float64) / 2.0) + np.asarray(center, dtype=np.float64)
    return _finish(vertices, faces)


def superquadric(
    radii=(1.0, 1.0, 1.0), exponent: float = 0.5, subdivisions: int = 12, center=(0.0, 0.0, 0.0)
) -> tuple[np.ndarray, np.ndarray]:
    """The surface ``|x/a|^(2/e) + |y/b|^(2/e) + |z/c|^(2/e) = 1`` (e=1: ellipsoid, e<1: boxier).

    Built by pushing a subdivided cube radially onto the surface (no poles, closed)."""
    if not exponent > 0:
        raise InputError(f"superquadric: exponent={exponent}; expected > 0")
    unit, faces = _cube_lattice(subdivisions)
    direction = np.tan(unit * (np.pi / 4.0))  # spreads the vertices more evenly than a plain cube
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    radii = np.asarray(radii, dtype=np.float64)
    implicit = np.sum(np.abs(direction / radii) ** (2.0 / exponent), axis=1)
    vertices = direction * implicit[:, None] ** (-exponent / 2.0) + np.asarray(center, dtype=np.float64)
    return _finish(vertices, faces)


def torus(
    major: float = 1.0, minor: float = 0.35, segments: int = 32, rings: int = 16, center=(0.0, 0.0, 0.0), rotation=None
) -> tuple[np.ndarray, np.ndarray]:
    """A torus around the y axis (ring in the xz plane), optionally rotated by a 3x3 matrix."""
    if not 0 < minor < major:
        raise InputError(f"torus: minor={minor}, major={major}; expected 0 < minor < major")
    u = np.arange(segments) * (2.0 * np.pi / segments)
    v = np.arange(rings) * (2.0 * np.pi / rings)
    uu, vv = np.meshgrid(u, v, indexing="ij")
    ring = major + minor * np.cos(vv)
    vertices = np.stack([ring * np.cos(uu), minor * np.sin(vv), ring * np.sin(uu)], axis=-1).reshape(-1, 3)
    i, j = np.meshgrid(np.arange(segments), np.arange(rings), indexing="ij")
    i, j = i.ravel(), j.ravel()
    idx = lambda a, b: (a % segments) * rings + (b % rings)  # noqa: E731
    faces = np.concatenate(
        [
            np.stack([idx(i, j), idx(i + 1, j), idx(i + 1, j + 1)], axis=1),
            np.stack([idx(i, j), idx(i + 1, j + 1), idx(i, j + 1)], axis=1),
        ]
    )
    if rotation is not None:
        vertices = vertices @ np.asarray(rotation, dtype=np.float64).T
    return _finish(vertices + np.asarray(center, dtype=np.float64), faces)


# ----------------------------------------------------------------------------------- categories


def _jitter(rng: np.random.Generator | None, shape=(), spread: float = 0.15):
    if rng is None:
        return np.ones(shape)
    return rng.uniform(1.0 - spread, 1.0 + spread, size=shape)


def airplane(rng=None) -> tuple[np.ndarray, np.ndarray]:
    """Fuselage (stretched ellipsoid along x) + wings + horizontal and vertical tail (thin boxes)."""
    # fuselage half-length, fuselage radius, full wing span, wing chord
    length, body, span, chord = _jitter(rng, 4) * np.array([0.5, 0.07, 0.95, 0.16])
    sweep = 0.0 if rng is None else rng.uniform(-0.04, 0.06)
    return merge(
        superquadric((length, body, body), exponent=1.0, subdivisions=10),
        box((-sweep, 0.0, 0.0), (chord, 0.02, span), subdivisions=4),
        box((-0.85 * length, 0.02, 0.0), (0.5 * chord, 0.015, 0.35 * span), subdivisions=3),
        box((-0.85 * length, 0.5 * body + 0.08, 0.0), (0.55 * chord, 0.16, 0.015), subdivisions=3),
    )


def chair(rng=None) -> tuple[np.ndarray, np.ndarray]:
    """Seat, backrest and four legs (boxes)."""
    width, depth, leg, back = _jitter(rng, 4) * np.array([0.5, 0.5, 0.45, 0.55])
    thick, sink = 0.06, 0.02  # parts reach ``sink`` into the seat: no coplanar touching faces
    legs = [
        box((sx * (width / 2 - 0.04), sink - leg / 2 - thick / 2, sz * (depth / 2 - 0.04)), (0.05, leg, 0.05))
        for sx in (-1, 1)
        for sz in (-1, 1)
    ]
    return merge(
        box((0.0, 0.0, 0.0), (width, thick, depth), subdivisions=4),
        box((0.0, back / 2 + thick / 2 - sink, -depth / 2 + 0.03), (0.98 * width, back, 0.05), subdivisions=4),
        *legs,
    )


def table(rng=None) -> tuple[np.ndarray, np.ndarray]:
    """A table top and four legs (boxes)."""
    width, depth, leg = _jitter(rng, 3) * np.array([1.0, 0.6, 0.5])
    thick = 0.05
    legs = [
        box((sx * (width / 2 - 0.06), 0.02 - leg / 2 - thick / 2, sz * (depth / 2 - 0.06)), (0.06, leg, 0.06))
        for sx in (-1, 1)
        for sz in (-1, 1)
    ]
    return merge(box((0.0, 0.0, 0.0), (width, thick, depth), subdivisions=5), *legs)


def car(rng=None) -> tuple[np.ndarray, np.ndarray]:
    """A boxy superquadric body, a cabin, and four torus wheels."""
    length, height, width = _jitter(rng, 3) * np.array([0.5, 0.12, 0.22])
    wheel = 0.07
    turn = _rotation_x(90.0)  # wheel axis along z
    wheels = [
        torus(wheel, 0.4 * wheel, 20, 10, center=(sx * 0.6 * length, -height, sz * width), rotation=turn)
        for sx in (-1, 1)
        for sz in (-1, 1)
    ]
    return merge(
        superquadric((length, height, width), exponent=0.35, subdivisions=10),
        superquadric(
            (0.5 * length, 0.9 * height, 0.85 * width),
            exponent=0.5,
            subdivisions=8,
            center=(-0.1 * length, 1.2 * height, 0.0),
        ),
        *wheels,
    )


_BUILDERS = {
    "airplane": airplane,
    "chair": chair,
    "table": table,
    "car": car,
    "torus": lambda rng=None: torus(1.0, 0.35 * float(_jitter(rng)), rotation=_rotation_x(30.0)),
    "superquadric": lambda rng=None: superquadric(
        tuple(_jitter(rng, 3) * (1.0, 0.7, 0.8)), exponent=0.4, subdivisions=14
    ),
}


def make_shape(name: str, rng=None, radius: float = DEFAULT_RADIUS) -> tuple[np.ndarray, np.ndarray]:
    """One of :data:`SHAPE_NAMES`, proportions jittered by ``rng`` (None: canonical proportions),
    centred and scaled to ``radius`` (see the module docstring)."""
    if name not in _BUILDERS:
        raise InputError(f"make_shape: unknown shape {name!r}; expected one of {', '.join(SHAPE_NAMES)}")
    if not radius > 0:
        raise InputError(f"make_shape: radius={radius}; expected > 0")
    vertices, faces = _BUILDERS[name](None if rng is None else as_rng(rng))
    return normalize(vertices, radius), faces


# ------------------------------------------------------------------------------------- sampling


def face_normals(vertices: np.ndarray, faces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(unit normals (F, 3) float64, areas (F,) float64); degenerate faces get a zero normal."""
    v = np.asarray(vertices, dtype=np.float64)
    cross = np.cross(v[faces[:, 1]] - v[faces[:, 0]], v[faces[:, 2]] - v[faces[:, 0]])
    length = np.linalg.norm(cross, axis=1)
    unit = np.divide(cross, length[:, None], out=np.zeros_like(cross), where=length[:, None] > 0)
    return unit, length / 2.0


def sample_surface(vertices, faces, n: int, rng=None) -> tuple[np.ndarray, np.ndarray]:
    """``n`` points uniform over the surface area and the unit normals of their faces, both (n, 3) float32."""
    vertices = np.asarray(vertices, dtype=np.float64)
    faces = np.asarray(faces)
    if vertices.ndim != 2 or vertices.shape[1] != 3:
        raise InputError(f"sample_surface: vertices have shape {vertices.shape}; expected (V, 3)")
    if faces.ndim != 2 or faces.shape[1] != 3 or not np.issubdtype(faces.dtype, np.integer):
        raise InputError(
            f"sample_surface: faces have shape {faces.shape} / dtype {faces.dtype}; expected (F, 3) integers"
        )
    if faces.size and (faces.min() < 0 or faces.max() >= len(vertices)):
        raise InputError(f"sample_surface: face indices must lie in [0, {len(vertices) - 1}]")
    if int(n) != n or n < 0:
        raise InputError(f"sample_surface: n={n}; expected an integer >= 0")
    normals, areas = face_normals(vertices, faces)
    total = areas.sum()
    if not total > 0:
        raise InputError("sample_surface: the mesh has zero surface area; nothing to sample")
    rng = as_rng(rng)
    chosen = rng.choice(len(faces), size=int(n), p=areas / total)
    r1, r2 = rng.random(int(n)), rng.random(int(n))
    root = np.sqrt(r1)
    weights = np.stack([1.0 - root, root * (1.0 - r2), root * r2], axis=1)
    points = np.einsum("nk,nkd->nd", weights, vertices[faces[chosen]])
    return points.astype(np.float32), normals[chosen].astype(np.float32)
