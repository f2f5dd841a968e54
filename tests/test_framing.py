"""Pictures frame their mesh: framed views, `xmesh render` (framed and --camera-view), the demo's picture."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drawings import assert_same_drawing, edge_band
from xmesh import cli
from xmesh.mesh import Mesh, read_obj
from xmesh.model.camera import camera_to_world, world_to_camera
from xmesh.pictures.demo import demo_picture, weights_caption
from xmesh.pictures.views import mesh_panel, points_panel
from xmesh.render import draw
from xmesh.render.framing import FILL, fit_framing
from xmesh.synthetic import dataset, shapes

SIZE = 96
ROW = np.array([35.0, 27.0, 0.0, 0.7, 25.0])


def _silhouette(rgba: np.ndarray) -> np.ndarray:
    return rgba[..., 3] > 0


def _span(mask: np.ndarray, panel: int | None = None) -> tuple[float, float]:
    """(larger bounding-box side of the covered pixels, covered area), as shares of the ``panel``
    side (default: the mask's width) and of the mask."""
    rows, cols = np.nonzero(mask)
    side = max(rows.max() - rows.min() + 1, cols.max() - cols.min() + 1)
    return side / (panel or mask.shape[1]), float(mask.mean())


def _non_white(rgb: np.ndarray, label_rows: int) -> np.ndarray:
    """Pixels of a panel that are not white, above its bottom label."""
    return np.any(rgb[: rgb.shape[0] - label_rows] < 250, axis=2)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shape=st.sampled_from(shapes.SHAPE_NAMES),
    log_scale=st.floats(-3.0, 3.0),
    offset=st.tuples(*[st.floats(-30.0, 30.0)] * 3),
    shift=st.floats(-2.0, 2.0),
    seed=st.integers(0, 2**16),
)
def test_a_mesh_of_any_scale_and_position_fills_20_to_90_percent_of_its_panel(shape, log_scale, offset, shift, seed):
    vertices, faces = shapes.make_shape(shape, np.random.default_rng(seed))
    scale = 10.0**log_scale
    # moved by up to 30 of its own sizes, and by up to 100 units whatever its size
    placed = (vertices * scale + np.asarray(offset) * scale + 10.0**shift).astype(np.float32)
    row = dataset.shapenet_cameras(1, rng=seed)[0]
    framing = fit_framing(placed, row)
    image = draw.render_mesh(placed, faces, row, size=SIZE, framing=framing)
    mask = _silhouette(image)
    side, area = _span(mask)
    assert 0.2 <= side <= 0.9, (side, scale, offset)
    assert area <= 0.9
    assert not (mask[0].any() or mask[-1].any() or mask[:, 0].any() or mask[:, -1].any())  # nothing cut off
    rows, cols = np.nonzero(mask)
    centre = np.array([(rows.min() + rows.max() + 1) / 2, (cols.min() + cols.max() + 1) / 2]) / SIZE
    assert np.abs(centre - 0.5).max() < 0.06  # centred


@pytest.mark.parametrize("log_scale", [-3.0, 0.0, 3.0])
def test_a_solid_shape_covers_20_to_90_percent_of_the_panel_area(log_scale):
    vertices, faces = shapes.superquadric((1.0, 0.8, 0.9), exponent=0.6, subdivisions=16)
    placed = (vertices * 10.0**log_scale + 5.0 * 10.0**log_scale).astype(np.float32)
    image = draw.render_mesh(placed, faces, ROW, size=SIZE, framing=fit_framing(placed, ROW))
    side, area = _span(_silhouette(image))
    assert 0.2 <= area <= 0.9 and abs(side - FILL) < 0.05


def test_zoom_is_the_framed_size_over_the_cameras_own_view():
    # a 2 cm ball 0.7 units away: its size on screen from the camera and framed, measured in pixels
    vertices, faces = shapes.superquadric((0.01, 0.01, 0.01), exponent=1.0, subdivisions=16, center=(0.02, 0, 0.01))
    size = 200
    seen, _ = _span(_silhouette(draw.render_mesh(vertices, faces, ROW, size=size)))
    framing = fit_framing(vertices, ROW)
    framed, _ = _span(_silhouette(draw.render_mesh(vertices, faces, ROW, size=size, framing=framing)))
    assert framing.zoom == pytest.approx(framed / seen, rel=0.08)
    assert framing.zoom == pytest.approx(FILL / (248 / 224 * 0.02 / 0.7), rel=0.1)  # 2 cm at 0.7 units
    assert framing.label == f"fit x{framing.zoom:.3g}"
    behind = fit_framing(vertices + np.float32([0, 0, 5]), [90.0, 0.0, 0.0, 0.7, 25.0])  # not all in front of it
    assert behind.zoom is None and behind.label == "fit"


def test_ground_truth_points_overlay_and_are_framed_with_the_mesh():
    vertices, faces = shapes.make_shape("chair", np.random.default_rng(3), radius=0.05)
    in_camera0 = world_to_camera(vertices, ROW)
    points = in_camera0[::7] + np.float32([0.08, 0.0, 0.0])  # beside the mesh: the framing holds both
    panel, framing = mesh_panel(in_camera0, faces, ROW, SIZE, points=points, camera0_row=ROW)
    red = (panel[..., 0] > 180) & (panel[..., 1] < 80) & (panel[..., 2] < 80)
    grey = np.all(np.abs(panel.astype(int) - panel[..., :1].astype(int)) < 12, axis=2) & (panel[..., 0] < 235)
    assert red.sum() > 30 and grey.sum() > 30
    red_cols, grey_cols = np.nonzero(red)[1], np.nonzero(grey[: SIZE - 16])[1]
    assert abs(red_cols.mean() - grey_cols.mean()) > 0.15 * SIZE  # the points stand apart, both in view
    world = np.concatenate([camera_to_world(in_camera0, ROW), camera_to_world(points, ROW)])
    assert np.allclose(framing.center, (world.min(0) + world.max(0)) / 2, atol=1e-6)
    alone, _ = points_panel(points, ROW, SIZE, camera0_row=ROW)
    side, _ = _span(_non_white(alone, 16), SIZE)
    assert 0.2 <= side <= 0.9


@pytest.fixture(scope="module")
def tiny_mesh_files(tmp_path_factory):
    """A 1 cm ball in camera 0's frame (as the network writes meshes) and the cameras of the demo."""
    folder = tmp_path_factory.mktemp("tiny")
    _, _, cameras = dataset.demo_scene(seed=0)
    vertices, faces = shapes.superquadric((0.005, 0.004, 0.005), exponent=0.7, subdivisions=10, center=(0.1, 0.05, 0))
    mesh = Mesh(world_to_camera(vertices, cameras[0]), faces)
    return mesh.to_obj(folder / "tiny.obj"), dataset.write_camera_file(folder / "cameras.txt", cameras), cameras


def test_xmesh_render_frames_each_view_and_keeps_the_camera_view(tiny_mesh_files, tmp_path):
    mesh_path, cameras_path, cameras = tiny_mesh_files
    framed, raw = tmp_path / "framed.png", tmp_path / "camera.png"
    assert (
        cli.main(["render", str(mesh_path), "--cameras", str(cameras_path), "--out", str(framed), "--size", "128"]) == 0
    )
    assert (
        cli.main(
            [
                "render",
                str(mesh_path),
                "--cameras",
                str(cameras_path),
                "--out",
                str(raw),
                "--size",
                "128",
                "--camera-view",
            ]
        )
        == 0
    )
    picture = cv2.cvtColor(cv2.imread(str(framed), cv2.IMREAD_UNCHANGED), cv2.COLOR_BGR2RGB)
    assert picture.shape == (128, 3 * 128 + 2 * 4, 3)
    for view in range(3):
        panel = picture[:, view * 132 : view * 132 + 128]
        side, _ = _span(_non_white(panel, 18), 128)
        assert 0.2 <= side <= 0.9, (view, side)
        assert np.any(panel[110:] < 128)  # the label saying it is framed
    camera = cv2.imread(str(raw), cv2.IMREAD_UNCHANGED)
    assert camera.shape == (128, 3 * 128, 4)
    mesh = read_obj(mesh_path)
    expected = draw.tile(draw.render_views(mesh, cameras=cameras, size=128, frame="camera0"))
    assert np.array_equal(cv2.cvtColor(camera, cv2.COLOR_BGRA2RGBA), expected)  # unframed, as the cameras see it
    _, area = _span(camera[..., 3] > 0)
    assert area < 0.01  # what framing is for: from the cameras, a 1 cm mesh is a few pixels


def test_demo_picture_shows_the_inputs_beside_both_meshes_and_names_the_weights(tmp_path):
    images, cameras_path = dataset.demo_inputs(tmp_path, seed=0)
    vertices, faces, cameras = dataset.demo_scene(seed=0)
    in_camera0 = world_to_camera(vertices, cameras[0])
    mesh = Mesh(in_camera0 * 0.01, faces, coarse_vertices=in_camera0 * 100.0)  # 1/100 and 100 times the object
    size = 112
    picture = demo_picture(images, cameras, mesh, weights_caption(None, 1), size=size)
    assert picture.shape[1] == 5 * size + 4 * 4 and picture.shape[0] > size + 30  # a row of 5, then the caption
    for index in range(5):
        panel = picture[1 : size - 1, index * (size + 4) + 1 : index * (size + 4) + size - 1]
        side, _ = _span(_non_white(panel, 18), size)
        assert 0.2 <= side <= 0.9, (index, side)
    caption = picture[size:]
    assert np.any(caption < 128)
    assert "SYNTHETIC" in weights_caption(None, 1) and "seed 1" in weights_caption(None, 1)
    assert weights_caption(["a.ckpt-50", "b.ckpt-10"]) == "weights: a.ckpt-50, b.ckpt-10"
    real = demo_picture(images, cameras, mesh, weights_caption(["a.ckpt-50", "b.ckpt-10"]), size=size)
    assert np.array_equal(real[:size], picture[:size]) and not np.array_equal(real[size:], picture[size:])


def test_drawings_of_one_mesh_compare_equal_through_last_bit_moves_but_not_another_mesh():
    vertices, faces = shapes.superquadric((0.05, 0.03, 0.02), exponent=0.7, subdivisions=6)
    vertices = world_to_camera(vertices, ROW)  # in camera 0's frame, as the network's meshes are

    def drawing(points):
        panel, framing = mesh_panel(points.astype(np.float32), faces, ROW, SIZE, camera0_row=ROW)
        return panel, framing

    panel, framing = drawing(vertices)
    xy, _, _ = framing.screen(camera_to_world(vertices, ROW), SIZE)
    band = edge_band(xy, faces, (SIZE, SIZE))
    rng = np.random.default_rng(0)
    for moved in (1e-6, 1e-5):  # what another BLAS does to the network's vertices, relative to their size
        assert_same_drawing(drawing(vertices * (1 + moved * rng.standard_normal(vertices.shape)))[0], panel, band)
    for other in (vertices * [1.1, 1.0, 1.0], vertices * [1.0, 0.9, 1.0]):  # 10% wider or flatter
        with pytest.raises(AssertionError):
            assert_same_drawing(drawing(other)[0], panel, band)


def test_xmesh_demo_shows_both_meshes_as_shaded_surfaces_and_says_the_weights_are_synthetic(tmp_path):
    """The demo's synthetic weights (the small-move variant) deform the template without collapsing
    it: each mesh panel is a surface covering a good share of the panel in both directions (a thin
    line covers a sliver), shaded in many tones (its faces visible), with the SYNTHETIC caption."""
    out = tmp_path / "demo"
    assert cli.main(["demo", "--out", str(out)]) == 0
    picture = cv2.cvtColor(cv2.imread(str(out / "mesh.png")), cv2.COLOR_BGR2RGB)
    size = (picture.shape[1] - 4 * 4) // 5
    for index in (3, 4):  # the coarse and the refined mesh
        panel = picture[1 : size - 1, index * (size + 4) + 1 : index * (size + 4) + size - 1]
        covered = _non_white(panel, 18)
        side, area = _span(covered, size)
        assert 0.4 <= side <= 0.95 and area > 0.2, (index, side, area)
        rows, cols = np.nonzero(covered)
        spread = np.sqrt(np.linalg.eigvalsh(np.cov(np.stack([rows, cols]).astype(np.float64))))
        assert spread[0] > 0.5 * spread[1], (index, spread)  # as wide one way as the other, not a line
        tones = np.unique(panel[: covered.shape[0]][covered].astype(np.int64) @ [65536, 256, 1])
        assert len(tones) > 30, (index, len(tones))  # shaded facets, not one flat colour
    caption = picture[size:]
    assert np.any(caption < 128)
    assert "SYNTHETIC" in weights_caption(None, 1, "the test recipe's small-move variant")
