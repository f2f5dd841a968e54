"""xmesh.synthetic: shapes, sampling, the rasteriser, the camera convention of renderings, datasets."""

from __future__ import annotations

import pickletools
import re

import cv2
import numpy as np
import pytest

from xmesh.errors import InputError
from xmesh.io import safe_pickle
from xmesh.io.cameras import load_cameras, read_camera_file
from xmesh.model.camera import ViewTransforms, camera_to_world, project, to_view, world_to_camera
from xmesh.render import draw, raster
from xmesh.synthetic import dataset, shapes

ROW = np.array([35.0, 27.0, 0.0, 0.7, 25.0])


def _alpha(path) -> np.ndarray:
    image = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    assert image is not None and image.ndim == 3 and image.shape[2] == 4
    return image[..., 3]


def _inside_fraction(alpha: np.ndarray, h224, w224) -> float:
    """Fraction of network pixel coordinates (224 scale) landing on a covered pixel of ``alpha``."""
    size = alpha.shape[0]
    rows = np.clip(np.floor(np.asarray(h224) * size / 224.0).astype(int), 0, size - 1)
    cols = np.clip(np.floor(np.asarray(w224) * size / 224.0).astype(int), 0, size - 1)
    return float(np.mean(alpha[rows, cols] > 0))


# ------------------------------------------------------------------------------------ rasteriser


def test_single_triangle_covers_its_area_and_matches_a_half_plane_reference():
    xy = np.array([[12.3, 20.7], [100.2, 15.1], [40.6, 110.9]])
    face_index, depth = raster.rasterize(xy, np.ones(3), np.array([[0, 1, 2]]), 128, 128)
    covered = face_index == 0
    (ax, ay), (bx, by) = xy[1] - xy[0], xy[2] - xy[0]
    area = abs(ax * by - ay * bx) / 2.0
    assert abs(covered.sum() - area) < 0.02 * area
    # independent reference: pixel centres on the inner side of all three edges
    cy, cx = np.mgrid[0:128, 0:128] + 0.5
    sides = []
    for a, b in ((0, 1), (1, 2), (2, 0)):
        sides.append((xy[b, 0] - xy[a, 0]) * (cy - xy[a, 1]) - (xy[b, 1] - xy[a, 1]) * (cx - xy[a, 0]))
    sides = np.stack(sides)
    reference = np.all(sides >= 0, axis=0) | np.all(sides <= 0, axis=0)
    assert np.array_equal(covered, reference)
    assert np.all(face_index[~covered] == -1) and np.all(np.isinf(depth[~covered]))
    assert np.allclose(depth[covered], 1.0)


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_zbuffer_keeps_the_nearer_triangle(order):
    xy = np.array([[10, 10], [50, 12], [20, 50], [15, 15], [60, 20], [25, 60]], dtype=float)
    depth = np.array([2.0, 2.0, 2.0, 1.0, 1.0, 1.0])  # the second triangle is nearer
    tris = np.array([[0, 1, 2], [3, 4, 5]])[list(order)]
    face_index, zmap = raster.rasterize(xy, depth, tris, 64, 64)
    near = order.index(1)
    only_far, _ = raster.rasterize(xy, depth, tris[[1 - near]], 64, 64)
    only_near, _ = raster.rasterize(xy, depth, tris[[near]], 64, 64)
    both = (only_far == 0) & (only_near == 0)
    assert both.sum() > 300
    assert np.all(face_index[both] == near)
    assert np.allclose(zmap[both], 1.0)
    far_alone = (only_far == 0) & (only_near < 0)
    assert far_alone.sum() > 50 and np.all(face_index[far_alone] == 1 - near)


def test_depth_is_perspective_correct():
    # a slanted 3-D triangle, projected with focal f; depth per pixel = ray/plane intersection
    f, c = 100.0, 32.0
    tri = np.array([[-0.4, -0.3, 1.0], [0.5, -0.2, 3.0], [0.0, 0.5, 2.0]])
    xy = f * tri[:, :2] / tri[:, 2:3] + c
    face_index, zmap = raster.rasterize(xy, tri[:, 2], np.array([[0, 1, 2]]), 64, 64)
    rows, cols = np.nonzero(face_index == 0)
    assert len(rows) > 200
    normal = np.cross(tri[1] - tri[0], tri[2] - tri[0])
    rays = np.stack([(cols + 0.5 - c) / f, (rows + 0.5 - c) / f, np.ones(len(rows))], axis=1)
    expected = (normal @ tri[0]) / (rays @ normal)
    assert np.allclose(zmap[rows, cols], expected, rtol=1e-5)
    # interpolating depth itself linearly on screen (the wrong way) would be measurably off
    coefficients = np.linalg.solve(np.column_stack([xy, np.ones(3)]), tri[:, 2])
    screen_linear = np.column_stack([cols + 0.5, rows + 0.5, np.ones(len(rows))]) @ coefficients
    assert np.max(np.abs(screen_linear - expected)) > 0.05


def test_draw_points_marks_dots():
    canvas = np.zeros((20, 20, 4), dtype=np.uint8)
    out = raster.draw_points(canvas, np.array([[5.5, 10.5], [100.0, 100.0]]), radius=1.0, color=(255, 0, 0))
    assert out[10, 5].tolist() == [255, 0, 0, 255]
    assert (out[..., 3] > 0).sum() == 5 and canvas.max() == 0  # a plus of 5 pixels, input untouched


# ---------------------------------------------------------------------------------- shapes


def _winding_number(points: np.ndarray, vertices: np.ndarray, faces: np.ndarray) -> np.ndarray:
    """Generalised winding number (solid angle / 4 pi) of closed meshes at ``points``."""
    v = vertices.astype(np.float64)[faces]  # (F, 3, 3)
    a, b, c = (v[None, :, k, :] - points[:, None, :] for k in range(3))
    la, lb, lc = (np.linalg.norm(x, axis=-1) for x in (a, b, c))
    det = np.einsum("pfi,pfi->pf", a, np.cross(b, c))
    dot = lambda x, y: np.einsum("pfi,pfi->pf", x, y)  # noqa: E731
    denominator = la * lb * lc + dot(a, b) * lc + dot(b, c) * la + dot(c, a) * lb
    return (2.0 * np.arctan2(det, denominator)).sum(axis=1) / (4.0 * np.pi)


@pytest.mark.parametrize("name", shapes.SHAPE_NAMES)
def test_shapes_are_closed_outward_and_sized(name):
    vertices, faces = shapes.make_shape(name, rng=5)
    assert vertices.dtype == np.float32 and faces.dtype == np.int64
    assert np.isclose(np.linalg.norm(vertices, axis=1).max(), shapes.DEFAULT_RADIUS, rtol=1e-5)
    directed = np.concatenate([faces[:, [0, 1]], faces[:, [1, 2]], faces[:, [2, 0]]])
    as_set = set(map(tuple, directed.tolist()))
    assert len(as_set) == len(directed)  # no directed edge twice: consistent winding
    assert all((b, a) in as_set for a, b in as_set)  # every edge has its twin: closed
    # outward: crossing the surface along the normal leaves one part (winding number drops by 1)
    points, normals = shapes.sample_surface(vertices, faces, 150, rng=1)
    eps = 1e-4
    inner = _winding_number(points.astype(np.float64) - eps * normals, vertices, faces)
    outer = _winding_number(points.astype(np.float64) + eps * normals, vertices, faces)
    assert np.mean(np.abs(inner - outer - 1.0) < 0.05) > 0.97
    far = _winding_number(np.array([[2.0, 0.0, 0.0], [0.0, -3.0, 1.0]]), vertices, faces)
    assert np.allclose(far, 0.0, atol=1e-6)


def test_make_shape_is_deterministic_and_jittered():
    a = shapes.make_shape("chair", rng=3)
    b = shapes.make_shape("chair", rng=3)
    c = shapes.make_shape("chair", rng=4)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not np.allclose(a[0], c[0])
    with pytest.raises(InputError, match="unknown shape"):
        shapes.make_shape("teapot")


def test_sample_surface_points_on_triangles_with_unit_outward_normals():
    vertices, faces = shapes.make_shape("superquadric", rng=2)  # convex, centred at the origin
    points, normals = shapes.sample_surface(vertices, faces, 400, rng=0)
    assert points.shape == normals.shape == (400, 3) and points.dtype == np.float32
    assert np.allclose(np.linalg.norm(normals, axis=1), 1.0, atol=1e-5)
    assert np.all(np.einsum("ij,ij->i", points, normals) > 0)
    # on the surface: some triangle whose plane holds the point and whose interior contains it
    v = vertices.astype(np.float64)
    a, b, c = v[faces[:, 0]], v[faces[:, 1]], v[faces[:, 2]]
    e1, e2 = b - a, c - a
    n = np.cross(e1, e2)
    n /= np.linalg.norm(n, axis=1, keepdims=True)
    d = points.astype(np.float64)[:, None, :] - a[None]
    plane = np.abs(np.einsum("pfi,fi->pf", d, n))
    g11, g12, g22 = (e1 * e1).sum(1), (e1 * e2).sum(1), (e2 * e2).sum(1)
    d1, d2 = np.einsum("pfi,fi->pf", d, e1), np.einsum("pfi,fi->pf", d, e2)
    det = g11 * g22 - g12 * g12
    s, t = (g22 * d1 - g12 * d2) / det, (g11 * d2 - g12 * d1) / det
    inside = (s >= -1e-4) & (t >= -1e-4) & (s + t <= 1 + 1e-4)
    distance = np.where(inside, plane, np.inf).min(axis=1)
    assert np.all(distance < 1e-6)


def test_sample_surface_is_area_weighted_and_uniform():
    vertices = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [5, 0, 0], [8, 0, 0], [5, 2, 0]], dtype=np.float32)
    faces = np.array([[0, 1, 2], [3, 4, 5]])  # areas 0.5 and 3
    n = 20000
    points, normals = shapes.sample_surface(vertices, faces, n, rng=7)
    first = points[:, 0] < 2
    p = 0.5 / 3.5
    assert abs(first.mean() - p) < 4 * np.sqrt(p * (1 - p) / n)
    assert np.allclose(points[first].mean(axis=0), [1 / 3, 1 / 3, 0], atol=0.01)  # the centroid
    assert np.allclose(points[~first].mean(axis=0), [6, 2 / 3, 0], atol=0.02)
    assert np.allclose(normals, [0, 0, 1])
    again, _ = shapes.sample_surface(vertices, faces, n, rng=7)
    assert np.array_equal(points, again)


# ---------------------------------------------------------------------------- camera convention


@pytest.mark.parametrize("size", [137, 224])
def test_silhouette_centroid_lands_on_the_projected_centre(size):
    center = np.array([0.06, 0.04, -0.05], dtype=np.float32)
    vertices, faces = shapes.superquadric((0.03, 0.03, 0.03), exponent=1.0, subdivisions=12, center=center)
    image = draw.render_mesh(vertices, faces, ROW, size=size, supersample=1)
    assert image.shape == (size, size, 4) and image.dtype == np.uint8
    assert image[0, 0, 3] == 0
    rows, cols = np.nonzero(image[..., 3] > 0)
    h, w = project(world_to_camera(center[None], ROW))
    expected = np.array([h[0], w[0]]) * size / 224.0
    assert np.abs(expected - size / 2).max() > 0.05 * size  # off centre: a sign flip would show
    assert np.allclose([rows.mean() + 0.5, cols.mean() + 0.5], expected, atol=0.6)


def test_demo_vertices_projected_by_the_network_fall_inside_each_silhouette(tmp_path):
    images, cameras_path = dataset.demo_inputs(tmp_path, seed=0)
    assert len(images) == 3 and all(p.is_file() for p in images)
    vertices, _, cameras = dataset.demo_scene(seed=0)
    loaded = load_cameras(cameras_path)
    assert np.allclose(loaded, cameras, rtol=1e-6)
    points0 = world_to_camera(vertices, loaded[0])  # the network's frame: camera 0
    tf = ViewTransforms.from_cameras(loaded)
    alphas = [_alpha(p) for p in images]
    for view, alpha in enumerate(alphas):
        h, w = project(to_view(points0, tf, view))
        assert _inside_fraction(alpha, h, w) >= 0.95
        h_world, w_world = project(to_view(vertices, tf, view))
        assert _inside_fraction(alpha, h_world, w_world) < 0.2  # skipping the camera-0 frame would not fit


def test_render_mesh_file_agrees_with_the_official_demo(demo_dir, tmp_path):
    from xmesh.mesh import read_obj
    from xmesh.pictures.views import render_mesh_file

    gt = read_obj(demo_dir / "predict.obj").vertices[::10]
    out = render_mesh_file(
        demo_dir / "predict.obj", demo_dir / "cameras.txt", tmp_path / "views.png", gt_points=gt, camera_view=True
    )
    tiled = cv2.imread(str(out), cv2.IMREAD_UNCHANGED)
    assert tiled.shape == (137, 3 * 137, 4)
    for view in range(3):
        ours = tiled[:, 137 * view : 137 * (view + 1), 3] > 0
        theirs = _alpha(demo_dir / f"plane{view + 1}.png") > 0
        assert (ours & theirs).sum() / (ours | theirs).sum() > 0.6  # the predicted plane over the input
    red = (tiled[..., 2] == 220) & (tiled[..., 1] == 30) & (tiled[..., 0] == 30)  # BGRA on disk
    assert red.sum() > 100


def test_frames_and_argument_errors():
    vertices, faces = shapes.make_shape("torus")
    in_camera0 = world_to_camera(vertices, ROW)
    a = draw.render_mesh(vertices, faces, ROW, frame="world")
    b = draw.render_mesh(in_camera0, faces, ROW, frame="camera0", camera0_row=ROW)
    assert np.mean(a[..., 3] != b[..., 3]) < 0.002
    assert np.allclose(camera_to_world(in_camera0, ROW), vertices, atol=1e-5)
    with pytest.raises(InputError, match="camera0_row"):
        draw.render_mesh(in_camera0, faces, ROW, frame="camera0")
    with pytest.raises(InputError, match="camera row"):
        draw.render_mesh(vertices, faces, [0, 0, 0, -1, 25])
    with pytest.raises(InputError, match="face indices"):
        draw.render_mesh(vertices, faces + len(vertices), ROW)
    views = draw.render_views(vertices, faces, dataset.shapenet_cameras(3, rng=1), size=64)
    assert len(views) == 3 and all(v.shape == (64, 64, 4) for v in views)


def test_save_png_round_trips_rgba(tmp_path):
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(9, 13, 4), dtype=np.uint8)
    path = draw.save_png(tmp_path / "x.png", image)
    back = cv2.cvtColor(cv2.imread(str(path), cv2.IMREAD_UNCHANGED), cv2.COLOR_BGRA2RGBA)
    assert np.array_equal(back, image)
    assert not [p for p in tmp_path.iterdir() if p.name != "x.png"]  # no temporary left over
    with pytest.raises(InputError):
        draw.save_png(tmp_path / "y.png", image.astype(np.float32))


# -------------------------------------------------------------------------------------- dataset


def test_cameras_and_metadata_round_trip(tmp_path):
    cameras = dataset.shapenet_cameras(24, rng=11)
    assert cameras.shape == (24, 5)
    assert np.all((cameras[:, 0] >= 0) & (cameras[:, 0] < 360))
    assert np.all((cameras[:, 1] >= 25) & (cameras[:, 1] <= 30))
    assert np.all((cameras[:, 3] >= 0.6) & (cameras[:, 3] <= 0.9))
    assert np.all(cameras[:, 2] == 0) and np.all(cameras[:, 4] == 25)
    path = dataset.write_camera_file(tmp_path / "rendering_metadata.txt", cameras)
    assert np.array_equal(read_camera_file(path), cameras)
    assert np.array_equal(np.loadtxt(path), cameras)
    assert np.array_equal(load_cameras(path), cameras[[0, 6, 7]].astype(np.float32))


def test_ground_truth_points_are_in_camera0_frame_with_rotated_normals():
    vertices, faces = shapes.make_shape("superquadric", rng=8)  # convex, centred at the origin
    gt = dataset.ground_truth_points(vertices, faces, ROW, n=500, rng=2)
    assert gt.shape == (500, 6) and gt.dtype == np.float32
    world_points, world_normals = shapes.sample_surface(vertices, faces, 500, rng=2)  # same draws
    assert np.allclose(camera_to_world(gt[:, :3], ROW), world_points, atol=1e-5)
    centre = world_to_camera(np.zeros((1, 3)), ROW)[0]
    assert np.all(np.einsum("ij,ij->i", gt[:, :3] - centre, gt[:, 3:]) > 0)  # still outward
    # a rotation: same angles between normals as in the world frame
    assert np.allclose(gt[:, 3:] @ gt[:3, 3:].T, world_normals @ world_normals[:3].T, atol=1e-5)


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds")
    return dataset.write_dataset(root, n_per_category=1, categories=("02691156", "03001627"), seed=3, n_points=3000)


def test_dataset_layout_and_ground_truth(small_dataset):
    root = small_dataset["root"]
    ids = (root / "test_list.txt").read_text().splitlines()
    assert ids == small_dataset["ids"] and len(ids) == 2
    for sample, gt_path, folder in zip(ids, small_dataset["gt"], small_dataset["renderings"]):
        match = re.fullmatch(r"(\d{8})_([0-9a-f]{32})_00\.dat", sample)
        assert match
        synset, item = match.groups()
        assert folder == root / "ShapeNetRendering" / synset / item / "rendering"
        assert gt_path == root / "gt" / sample
        pngs = sorted(folder.glob("*.png"))
        assert [p.name for p in pngs] == [f"{i:02d}.png" for i in range(24)]
        cameras = read_camera_file(folder / "rendering_metadata.txt")
        assert cameras.shape == (24, 5)
        first = cv2.imread(str(pngs[0]), cv2.IMREAD_UNCHANGED)
        assert first.shape == (137, 137, 4) and first[0, 0, 3] == 0 and (first[..., 3] == 255).sum() > 300

        data = gt_path.read_bytes()
        assert data[:2] == b"\x80\x02"  # protocol 2
        globals_ = [arg for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"]
        assert globals_ and not any("numpy._core" in g for g in globals_)
        image, points = safe_pickle.load(gt_path)
        assert np.array_equal(image, first)
        assert points.shape == (3000, 6) and points.dtype == np.float32
        assert np.allclose(np.linalg.norm(points[:, 3:], axis=1), 1.0, atol=1e-5)
        # camera-0 frame: the object sits on camera 0's axis at its distance
        assert abs(points[:, 2].mean() + cameras[0, 3]) < 0.1
        # ...and projects into every used view's silhouette through the network's transforms
        used = load_cameras(folder / "rendering_metadata.txt")  # views 0, 6, 7
        tf = ViewTransforms.from_cameras(used)
        for view, index in enumerate((0, 6, 7)):
            h, w = project(to_view(points[:, :3], tf, view))
            assert _inside_fraction(_alpha(pngs[index]), h, w) >= 0.97


def test_dataset_is_deterministic_by_seed(tmp_path, small_dataset):
    again = dataset.write_dataset(
        tmp_path / "a", n_per_category=1, categories=("02691156", "03001627"), seed=3, n_points=3000
    )
    assert again["ids"] == small_dataset["ids"]
    for ours, theirs in zip(again["gt"], small_dataset["gt"]):
        assert ours.read_bytes() == theirs.read_bytes()
    for ours, theirs in zip(again["renderings"], small_dataset["renderings"]):
        for name in ("00.png", "13.png", "rendering_metadata.txt"):
            assert (ours / name).read_bytes() == (theirs / name).read_bytes()
    other = dataset.write_dataset(tmp_path / "b", n_per_category=1, categories=("03001627",), seed=4, n_points=3000)
    assert other["ids"][0] != small_dataset["ids"][1]
