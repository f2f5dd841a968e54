"""The mesh template: official-layout loading/validation/saving, and the procedural generator."""

from __future__ import annotations

import copy
import pickle
import pickletools

import numpy as np
import pytest
import scipy.sparse as sp

from xmesh.errors import FileFormatError, InputError, MissingFileError, UnsafePickleError
from xmesh.io import safe_pickle
from xmesh.io.template import Template, load_template, save_template, template_from_dict, template_to_dict
from xmesh.template_gen import (
    chebyshev_t1,
    generate_template,
    icosphere_offsets,
    mesh_edges,
    subdivide,
    template_dict,
    uv_ellipsoid,
)

OFFICIAL_COUNTS = (156, 618, 2466)


@pytest.fixture(scope="module")
def golden_path(golden_dir):
    return golden_dir / "template.dat"


@pytest.fixture(scope="module")
def golden_raw(golden_path):
    return safe_pickle.load(golden_path, what="template")


@pytest.fixture(scope="module")
def golden(golden_path):
    return load_template(golden_path)


def level_coords(t: Template) -> list[np.ndarray]:
    """Vertex positions of every level, by unpooling (float64)."""
    coords = [t.coord.astype(np.float64)]
    for pairs in t.pool_idx:
        c = coords[-1]
        coords.append(np.vstack([c, (c[pairs[:, 0]] + c[pairs[:, 1]]) / 2]))
    return coords


def dense_t1_reference(faces: np.ndarray, n: int) -> np.ndarray:
    """Independent dense T1 = 2L/lmax - I, L = I - D^-1/2 A D^-1/2, from the triangles."""
    a = np.zeros((n, n))
    for i, j in ((0, 1), (1, 2), (2, 0)):
        a[faces[:, i], faces[:, j]] = 1
        a[faces[:, j], faces[:, i]] = 1
    dinv = 1 / np.sqrt(a.sum(1))
    lap = np.eye(n) - dinv[:, None] * a * dinv[None, :]
    return 2 * lap / np.linalg.eigvalsh(lap)[-1] - np.eye(n)


def assert_raw_equal(a, b, where="template"):
    if isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            assert_raw_equal(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_raw_equal(x, y, f"{where}[{i}]")
    else:
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, where
        np.testing.assert_array_equal(a, b, err_msg=where)


# ----------------------------------------------------------------------------- loading golden


def test_load_golden_shapes_and_types(golden, golden_raw):
    t = golden
    assert t.num_vertices == OFFICIAL_COUNTS
    assert t.num_faces == (308, 1232, 4928)
    assert t.num_hypotheses == 43
    assert t.coord.dtype == np.float32 and t.coord.shape == (156, 3)
    np.testing.assert_array_equal(t.coord, golden_raw["coord"])
    assert [p.shape for p in t.pool_idx] == [(462, 2), (1848, 2)]
    assert all(p.dtype == np.int64 for p in t.pool_idx + t.faces_triangle)
    for s, n in enumerate(OFFICIAL_COUNTS):
        assert len(t.supports[s]) == 2
        for k, m in enumerate(t.supports[s]):
            assert isinstance(m, sp.csr_matrix) and m.dtype == np.float32 and m.shape == (n, n)
            coords, values, _ = golden_raw[f"stage{s + 1}"][k]
            dense = np.zeros((n, n), np.float32)
            dense[coords[:, 0], coords[:, 1]] = values
            np.testing.assert_array_equal(m.toarray(), dense)
    assert t.sample_coord.shape == (43, 3) and [a.shape for a in t.sample_cheb] == [(43, 43)] * 2
    with pytest.raises(ValueError):
        t.coord[0, 0] = 1.0  # read-only


def test_round_trip_golden_is_byte_for_byte_in_values_and_dtypes(golden, golden_raw, golden_path, tmp_path):
    out = tmp_path / "sub" / "template.dat"
    save_template(golden, out)
    data = out.read_bytes()
    assert data[:2] == b"\x80\x02"  # protocol 2
    globals_used = {arg for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"}
    assert not any("_core" in g for g in globals_used), globals_used  # readable by NumPy 1 / Python 2
    assert_raw_equal(golden_raw, safe_pickle.load(out))
    again = load_template(out)
    assert again.num_vertices == golden.num_vertices
    for s in range(3):
        for k in range(2):
            assert (again.supports[s][k] != golden.supports[s][k]).nnz == 0
    assert not list(tmp_path.glob("sub/.*.tmp"))  # atomic write left no temporary


def test_template_to_dict_rejects_non_template():
    with pytest.raises(InputError, match="template"):
        template_to_dict({"coord": None})


# ----------------------------------------------------------------------------- validation


def _set(path, value):
    def mutate(d):
        target = d
        for key in path[:-1]:
            target = target[key]
        if isinstance(target, tuple):
            raise AssertionError("mutate tuples via their parent")
        target[path[-1]] = value(target[path[-1]]) if callable(value) else value

    return mutate


def _support(stage, k, part, fn):
    def mutate(d):
        entry = list(d[stage][k])
        entry[part] = fn(entry[part])
        d[stage][k] = tuple(entry)

    return mutate


def _drop(key):
    def mutate(d):
        del d[key]

    return mutate


def _nan_at(a, index=(0, 0)):
    a = a.astype(np.float32).copy()
    a[index] = np.nan
    return a


BAD = [
    ("missing key", _drop("pool_idx"), "lacks the key(s) pool_idx"),
    ("coord width", _set(["coord"], lambda a: a[:, :2]), "coord: has shape (156, 2)"),
    ("coord type", _set(["coord"], "not an array"), "coord: is a str"),
    ("coord dtype", _set(["coord"], lambda a: a.astype(str)), "coord: has dtype"),
    ("coord nan", _set(["coord"], _nan_at), "coord: holds 1 non-finite"),
    ("coord overflow", _set(["coord"], lambda a: a.astype(np.float64) * 1e300), "non-finite"),
    ("pool count", _set(["pool_idx"], lambda p: p[:1]), "pool_idx: has 1 entries, expected 2"),
    ("pool not list", _set(["pool_idx"], lambda p: p[0]), "pool_idx: is a ndarray"),
    ("pool width", _set(["pool_idx", 0], lambda a: a[:, :1]), "pool_idx[0]: has shape (462, 1)"),
    ("pool range 0", _set(["pool_idx", 0], lambda a: np.where(a == 5, 156, a)), "[0, 156)"),
    ("pool range 1", _set(["pool_idx", 1], lambda a: np.where(a == 5, 618, a)), "[0, 618)"),
    ("pool negative", _set(["pool_idx", 1], lambda a: np.where(a == 5, -1, a)), "from -1"),
    ("pool float", _set(["pool_idx", 0], lambda a: a.astype(np.float32)), "pool_idx[0]: has dtype float32"),
    # one edge fewer: level 1 has 617 vertices, so pool_idx[1]'s vertex 617 is out of range
    ("pool short 0", _set(["pool_idx", 0], lambda a: a[:-1]), "pool_idx[1]: holds indices from 0 to 617"),
    # one edge fewer at the last level: stage3's supports no longer fit
    (
        "pool short 1",
        _set(["pool_idx", 1], lambda a: a[:-1]),
        "stage3[0] shape: is (2466, 2466), expected (2465, 2465)",
    ),
    ("support shape", _support("stage1", 1, 2, lambda s: np.array([618, 618])), "expected (156, 156)"),
    ("support count", _set(["stage3"], lambda s: s[:1]), "stage3: has 1 entries, expected 2"),
    ("support tuple", _set(["stage2", 0], lambda e: e[:2]), "stage2[0]: has 2 entries, expected 3"),
    ("coords range", _support("stage2", 1, 0, lambda c: np.where(c == 7, 618, c)), "stage2[1] coords"),
    ("coords width", _support("stage1", 1, 0, lambda c: c[:, :1]), "stage1[1] coords: has shape"),
    ("nnz mismatch", _support("stage3", 1, 1, lambda v: v[:-1]), "17250 coords but 17249 values"),
    (
        "values inf",
        _support("stage1", 0, 1, lambda v: np.where(np.arange(v.size) == 3, np.inf, v)),
        "stage1[0] values: holds 1 non-finite",
    ),
    (
        "faces_triangle range",
        _set(["faces_triangle", 2], lambda f: np.where(f == 9, 2466, f)),
        "faces_triangle[2]: holds indices from 0 to 2466",
    ),
    ("faces_triangle width", _set(["faces_triangle", 0], lambda f: f[:, :2]), "faces_triangle[0]: has shape"),
    ("faces count", _set(["faces"], lambda f: f[:2]), "faces: has 2 entries, expected 3"),
    ("lape rows", _set(["lape_idx", 1], lambda a: a[:-1]), "lape_idx[1]: has shape (617, 10), expected (618, 10)"),
    ("sample_coord width", _set(["sample_coord"], lambda a: a[:, :2]), "sample_coord: has shape (43, 2)"),
    (
        "sample_cheb size",
        _set(["sample_cheb_dense", 1], lambda a: a[:42, :42]),
        "sample_cheb_dense[1]: has shape (42, 42), expected a float (43, 43)",
    ),
    ("sample_cheb vs K", _set(["sample_coord"], lambda a: a[:42]), "sample_cheb_dense[0]: has shape (43, 43)"),
    ("sample_cheb nan", _set(["sample_cheb_dense", 0], _nan_at), "sample_cheb_dense[0]: holds 1 non-finite"),
    ("sample_cheb count", _set(["sample_cheb_dense"], lambda s: s + s[:1]), "has 3 entries, expected 2"),
]


@pytest.mark.parametrize("name,mutate,message", BAD, ids=[b[0] for b in BAD])
def test_every_validation_error(golden_raw, name, mutate, message):
    bad = copy.deepcopy(golden_raw)
    mutate(bad)
    with pytest.raises(FileFormatError) as info:
        template_from_dict(bad, source="crafted.dat")
    text = str(info.value)
    assert text.startswith("crafted.dat: "), text
    assert message in text, text


def test_not_a_dict():
    with pytest.raises(FileFormatError, match=r"x\.dat: holds a list, expected a dict"):
        template_from_dict([1, 2], source="x.dat")


def test_load_errors_name_the_file(golden_raw, tmp_path):
    bad = copy.deepcopy(golden_raw)
    bad["coord"] = bad["coord"][:, :2]
    path = tmp_path / "bad.dat"
    path.write_bytes(pickle.dumps(bad, protocol=2))
    with pytest.raises(FileFormatError, match=str(path).replace("\\", "\\\\") + ": template key coord"):
        load_template(path)
    with pytest.raises(MissingFileError):
        load_template(tmp_path / "absent.dat")
    evil = tmp_path / "evil.dat"
    evil.write_bytes(pickle.dumps({"coord": print}, protocol=2))
    with pytest.raises(UnsafePickleError):
        load_template(evil)


def test_tolerant_of_official_variants(golden_raw):
    """Python tuples for shapes, int32 coords, float64 values (as scipy's sparse_to_tuple makes them)."""
    raw = copy.deepcopy(golden_raw)
    coords, values, shape = raw["stage3"][1]
    raw["stage3"][1] = (coords.astype(np.int32), values.astype(np.float64), (int(shape[0]), int(shape[1])))
    raw["coord"] = raw["coord"].astype(np.float64)
    t = template_from_dict(raw)
    assert t.coord.dtype == np.float32 and t.supports[2][1].dtype == np.float32
    assert t.supports[2][1].nnz == 17250


# ----------------------------------------------------------------------------- conventions


def test_golden_t1_convention_is_rescaled_normalized_laplacian(golden):
    """Golden T1 == 2L/lmax - I, L = I - D^-1/2 A D^-1/2 from its own faces (dense reference and ours)."""
    for s in range(2):  # stage 3 (2466^2 dense) is covered by test_generated_matches_golden
        n = golden.num_vertices[s]
        ref = dense_t1_reference(golden.faces_triangle[s], n)
        np.testing.assert_allclose(golden.supports[s][1].toarray(), ref, rtol=0, atol=1e-7)
        ours = chebyshev_t1(mesh_edges(golden.faces_triangle[s]), n).toarray()
        np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-12)
        # not the un-rescaled variants: -D^-1/2 A D^-1/2 has a zero diagonal
        assert np.all(np.abs(np.diag(ref)) > 0.3)
    k = golden.num_hypotheses
    _, graph = icosphere_offsets()
    faces_like = np.zeros((k, k))
    faces_like[graph[:, 0], graph[:, 1]] = faces_like[graph[:, 1], graph[:, 0]] = 1
    golden_pattern = golden.sample_cheb[1] != 0
    np.fill_diagonal(golden_pattern, False)
    np.testing.assert_array_equal(golden_pattern, faces_like.astype(bool))
    np.testing.assert_allclose(golden.sample_cheb[1], chebyshev_t1(graph, k).toarray(), rtol=0, atol=1e-7)


def test_generated_matches_golden(golden_raw):
    """The generator reproduces the golden ellipsoid template; hypotheses to within 1 float32 ulp."""
    gen = template_dict()
    for key in golden_raw:
        if key in ("sample_coord",):
            continue
        assert_raw_equal(golden_raw[key], gen[key], key)
    assert gen["sample_coord"].dtype == np.float32
    np.testing.assert_allclose(gen["sample_coord"], golden_raw["sample_coord"], rtol=0, atol=4e-9)


# ----------------------------------------------------------------------------- generator properties


@pytest.fixture(scope="module")
def gen():
    return generate_template()


def test_generated_counts_and_euler(gen):
    assert gen.num_vertices == OFFICIAL_COUNTS
    assert gen.num_faces == (308, 1232, 4928)
    for n, f in zip(gen.num_vertices, gen.faces_triangle):
        e = mesh_edges(f).shape[0]
        assert e == 3 * f.shape[0] // 2
        assert n - e + f.shape[0] == 2
        assert np.unique(f).size == n  # every vertex is used
    assert mesh_edges(gen.faces_triangle[0]).shape[0] == 462


def test_generated_level0_is_the_ellipsoid(gen):
    c = gen.coord.astype(np.float64)
    r = (((c - [0, 0, -0.8]) / [0.2, 0.2, 0.4]) ** 2).sum(1)
    np.testing.assert_allclose(r, 1.0, atol=1e-6)
    np.testing.assert_allclose(c[[0, -1]], [[0, 0, -0.4], [0, 0, -1.2]], atol=1e-7)
    assert np.all(c[:, 2] < 0)  # in front of camera 0


def test_unpooling_edges_are_unique_edges_and_midpoints(gen):
    coords = level_coords(gen)
    for k, pairs in enumerate(gen.pool_idx):
        edges = mesh_edges(gen.faces_triangle[k])
        assert np.all(pairs[:, 0] < pairs[:, 1])
        listed = {tuple(p) for p in pairs.tolist()}
        assert len(listed) == len(pairs)  # once each
        assert listed == {tuple(e) for e in edges.tolist()}  # exactly the previous level's edges
        # each parent face (a,b,c) -> 4 children; the middle child's corners are the edge midpoints
        parent, child = gen.faces_triangle[k], gen.faces_triangle[k + 1]
        fine = coords[k + 1]
        mids = child[3::4]
        for corner, (i, j) in enumerate(((0, 1), (1, 2), (2, 0))):
            np.testing.assert_allclose(fine[mids[:, corner]], (fine[parent[:, i]] + fine[parent[:, j]]) / 2, atol=1e-12)
        # and corner children keep the parent vertex
        np.testing.assert_array_equal(child[0::4, 0], parent[:, 0])


def test_faces_oriented_outward(gen):
    for coords, faces in zip(level_coords(gen), gen.faces_triangle):
        v = coords[faces]
        normals = np.cross(v[:, 1] - v[:, 0], v[:, 2] - v[:, 0])
        assert np.einsum("ij,ij->i", v[:, 0], np.cross(v[:, 1], v[:, 2])).sum() / 6 > 0.06  # ~ 4/3 pi .2 .2 .4
        assert np.all(np.einsum("ij,ij->i", normals, v.mean(1) - [0, 0, -0.8]) > 0)
        directed = np.concatenate([faces[:, [0, 1]], faces[:, [1, 2]], faces[:, [2, 0]]])
        assert np.unique(directed, axis=0).shape[0] == directed.shape[0]  # consistent orientation


def test_supports_structure_and_spectrum(gen):
    for s, n in enumerate(gen.num_vertices):
        t0, t1 = gen.supports[s]
        assert (t0 != sp.identity(n, format="csr", dtype=np.float32)).nnz == 0
        assert abs(t1 - t1.T).max() == 0
        edges = mesh_edges(gen.faces_triangle[s])
        assert t1.nnz == n + 2 * edges.shape[0]
        pattern = t1.copy()
        pattern.setdiag(0)
        pattern.eliminate_zeros()
        rows, cols = pattern.nonzero()
        got = {(int(a), int(b)) for a, b in zip(rows, cols) if a < b}
        assert got == {tuple(e) for e in edges.tolist()}
        if n <= 618:
            eig = np.linalg.eigvalsh(t1.toarray().astype(np.float64))
        else:
            eig = np.array(
                [
                    sp.linalg.eigsh(t1.astype(np.float64), k=1, which=w, return_eigenvectors=False)[0]
                    for w in ("SA", "LA")
                ]
            )
        assert eig.min() == pytest.approx(-1.0, abs=1e-5)  # the Laplacian's 0 eigenvalue
        assert eig.max() == pytest.approx(1.0, abs=1e-5)  # lambda_max, rescaled


def test_lape_and_faces_layout(gen):
    for s, n in enumerate(gen.num_vertices):
        f4, f3, lape = gen.faces[s], gen.faces_triangle[s], gen.lape_idx[s]
        np.testing.assert_array_equal(f4[:, :3], f3)
        np.testing.assert_array_equal(f4[:, 3], f3[:, 0])
        assert lape.shape == (n, 10)
        np.testing.assert_array_equal(lape[:, 8], np.arange(n))
        edges = mesh_edges(f3)
        nb = [set() for _ in range(n)]
        for a, b in edges.tolist():
            nb[a].add(b)
            nb[b].add(a)
        for i in (0, 1, n // 2, n - 1):
            want = sorted(nb[i])[:8]
            assert lape[i, 9] == len(want)
            assert lape[i, : len(want)].tolist() == want and np.all(lape[i, len(want) : 8] == -1)


def test_hypotheses(gen):
    s = gen.sample_coord.astype(np.float64)
    np.testing.assert_array_equal(s[0], 0)
    np.testing.assert_allclose(np.linalg.norm(s[1:], axis=1), 0.05, rtol=1e-6)
    np.testing.assert_allclose(s[1:].mean(0), 0, atol=1e-9)  # symmetric about the centre
    a0, a1 = gen.sample_cheb
    np.testing.assert_array_equal(a0, np.eye(43, dtype=np.float32))
    np.testing.assert_array_equal(a1, a1.T)
    deg = (a1 != 0).sum(1) - 1
    assert deg[0] == 42 and sorted(set(deg[1:13].tolist())) == [6] and sorted(set(deg[13:].tolist())) == [7]
    eig = np.linalg.eigvalsh(a1.astype(np.float64))
    assert eig.min() == pytest.approx(-1, abs=1e-5) and eig.max() == pytest.approx(1, abs=1e-5)
    # the 12 icosahedron vertices are pairwise at least the icosahedron's edge apart
    d = np.linalg.norm(s[1:13, None] - s[None, 1:13], axis=2) + np.eye(12)
    assert d.min() == pytest.approx(0.05 * 2 / np.sqrt(1 + ((1 + 5**0.5) / 2) ** 2), rel=1e-6)


def test_generated_validates_and_round_trips(gen, tmp_path):
    assert generate_template() is gen  # cached
    with pytest.raises(ValueError):
        gen.pool_idx[0][0, 0] = 3
    with pytest.raises(ValueError):
        gen.supports[0][1].data[0] = 3
    again = template_from_dict(template_to_dict(gen))
    assert again.num_vertices == OFFICIAL_COUNTS
    path = tmp_path / "gen.dat"
    save_template(gen, path)
    loaded = load_template(path)
    assert_raw_equal(template_to_dict(gen), template_to_dict(loaded))


def test_building_blocks_generalise():
    """Other resolutions keep the invariants (properties that would catch an indexing slip)."""
    v, f = uv_ellipsoid(rings=5, segments=7, center=(1, 2, 3), radii=(1, 2, 3))
    assert v.shape == (37, 3) and f.shape == (70, 3)
    v2, f2, pairs = subdivide(v, f)
    assert v2.shape[0] == 37 + len(pairs) and f2.shape == (280, 3)
    assert len(v2) - mesh_edges(f2).shape[0] + len(f2) == 2
    t1 = chebyshev_t1(mesh_edges(f2), len(v2)).toarray()
    np.testing.assert_allclose(t1, dense_t1_reference(f2, len(v2)), atol=1e-12)
    with pytest.raises(InputError, match="1 of the 4 vertices have no edge"):
        chebyshev_t1(np.array([[0, 1], [1, 2], [0, 2]]), 4)
