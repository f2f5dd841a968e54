"""Posed photos -> the network's camera rows: COLMAP text models and camera-to-world poses, under
arbitrary similarities of the input world, and the errors that name the view."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest

import xmesh
from photo_scene import make_scene, network_intrinsics, roll, write_colmap
from xmesh.errors import InputError, MissingFileError
from xmesh.photo import colmap, frame
from xmesh.photo.enclosing_sphere import smallest_enclosing_sphere
from xmesh.photo.intrinsics import Intrinsics, from_model

NAMES = ["IMG_0001.jpg", "IMG_0002.jpg", "IMG_0003.jpg"]


def _relative(a, b):
    return np.abs(np.asarray(a) - np.asarray(b)) / np.maximum(np.abs(np.asarray(b)), 1e-300)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_colmap_recovers_the_cameras_under_a_random_similarity(tmp_path, seed):
    scene = make_scene(seed)
    write_colmap(scene, tmp_path, NAMES)
    cams = xmesh.cameras.from_colmap(tmp_path, NAMES, first_azimuth=scene.rows[0, 0])
    assert cams.table.shape == (3, 5)
    assert np.all(_relative(cams.table, scene.rows)[:, [0, 1, 3]] < 1e-4)
    assert np.max(np.abs(cams.table - scene.rows)) < 1e-9  # in fact to rounding
    assert np.array_equal(cams.rows, scene.rows.astype(np.float32))
    # the similarity found is the inverse of the one applied
    assert np.allclose(cams.to_network(scene.to_input(scene.points)), scene.points, atol=1e-9)
    assert cams.scale * scene.sigma == pytest.approx(1.0, rel=1e-9)


def test_the_cameras_do_not_depend_on_the_world_frame(tmp_path):
    rows = []
    for seed in (3, 4):  # one object, two different similarities
        scene = make_scene(1)
        other = make_scene(seed)
        scene.rotation, scene.sigma, scene.shift = other.rotation, other.sigma, other.shift
        write_colmap(scene, tmp_path / str(seed), NAMES)
        rows.append(xmesh.cameras.from_colmap(tmp_path / str(seed), NAMES).table)
    assert np.max(np.abs(rows[0] - rows[1])) < 1e-9
    # azimuth 0 is view 0's by default; the others keep their azimuths relative to it
    scene = make_scene(1)
    assert rows[0][0, 0] == 0.0
    turned = (rows[0][:, 0] - (scene.rows[:, 0] - scene.rows[0, 0]) + 180.0) % 360.0 - 180.0
    assert np.allclose(turned, 0.0, atol=1e-9)
    assert np.allclose(rows[0][:, [1, 3]], scene.rows[:, [1, 3]], rtol=1e-9)


def test_rolled_and_off_centre_cameras_give_the_same_rows_and_report_the_turn(tmp_path):
    """A camera turned about its own centre has the same network camera: up is given here, since
    rolled photos no longer fix it exactly."""
    scene = make_scene(5)
    turns = [roll(12.0), roll(-7.0) @ _yaw(4.0), _yaw(-3.0)]
    write_colmap(scene, tmp_path, NAMES, turns=turns)
    up = scene.rotation[:, 1]  # the network's y axis in the input world
    cams = xmesh.cameras.from_colmap(tmp_path, NAMES, up=up, first_azimuth=scene.rows[0, 0])
    assert np.max(np.abs(cams.table - scene.rows)) < 1e-9
    assert np.allclose(np.abs(cams.roll_degrees()[:2]), [12.0, 7.0], atol=0.5)
    assert cams.off_axis_degrees()[2] == pytest.approx(3.0, abs=1e-6)
    # without up, three photos within a 21-degree fan of azimuths fix it poorly: a warning says so;
    # the whole capture (21 more photos, each rolled up to 5 degrees) fixes it to about a degree
    with pytest.warns(UserWarning, match="up direction is estimated from 3 cameras"):
        xmesh.cameras.from_poses(_poses_json(make_scene(3), tmp_path / "p.json"), NAMES)
    rolls = np.random.default_rng(0).uniform(-5.0, 5.0, size=21)
    write_colmap(scene, tmp_path / "capture", NAMES, turns=turns, other_rolls=rolls)
    estimate = xmesh.cameras.from_colmap(tmp_path / "capture", NAMES, first_azimuth=scene.rows[0, 0])
    assert np.max(np.abs(estimate.table[:, 1] - scene.rows[:, 1])) < 1.5
    assert np.max(np.abs(estimate.table[:, 0] - scene.rows[:, 0])) < 1.5


def _yaw(degrees):
    from scipy.spatial.transform import Rotation

    return Rotation.from_euler("y", degrees, degrees=True).as_matrix()


def test_up_estimate_is_exact_for_level_cameras_and_signed_upwards():
    scene = make_scene(6)
    views = [scene.input_pose(i) for i in range(3)]
    up = frame.estimate_up([r[0] for r, _ in views], [-r[1] for r, _ in views])
    assert np.allclose(up, scene.rotation[:, 1], atol=1e-12)
    # every camera at one azimuth: the x axes are parallel and the mean camera up is used
    same = [scene.input_pose(0)[0]] * 3
    fallback = frame.estimate_up([r[0] for r in same], [-r[1] for r in same])
    assert np.allclose(fallback, -same[0][1])


def test_object_sphere_drops_strays_and_is_equivariant():
    rng = np.random.default_rng(0)
    points = rng.normal(size=(1000, 3))
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    noisy = np.concatenate([points * 2.0 + 5.0, [[500.0, 0, 0], [0, -900.0, 0]]])
    centre, radius = frame.object_sphere(noisy)
    sphere = points * 2.0 + 5.0  # the strays far off are dropped: the sphere's own enclosing sphere remains
    expected_centre, expected_radius = smallest_enclosing_sphere(sphere)
    assert np.allclose(centre, expected_centre, atol=1e-12) and radius == pytest.approx(expected_radius, rel=1e-12)
    assert np.allclose(centre, 5.0, atol=0.02) and radius == pytest.approx(2.0, rel=0.01)
    q = np.linalg.qr(rng.normal(size=(3, 3)))[0]
    c2, r2 = frame.object_sphere(3.0 * noisy @ q.T + 1.0)
    assert np.allclose(c2, 3.0 * q @ centre + 1.0) and r2 == pytest.approx(3.0 * radius)


def test_object_centre_does_not_follow_a_dense_cluster_of_points():
    """Points uniform on a sphere plus five times as many crowded on one cap (as SIFT crowds points on
    a textured side): their mean moves a fifth of the radius, the enclosing sphere's centre stays
    within 1% of the true centre and its radius within 1%."""
    rng = np.random.default_rng(4)
    truth, true_radius = np.array([0.3, -1.2, 2.0]), 0.7
    even = rng.normal(size=(800, 3))
    cap = rng.normal(size=(4000, 3)) * 0.25 + [0.0, 0.0, 1.0]  # directions near +z
    directions = np.concatenate([even, cap])
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    cloud = truth + true_radius * directions
    assert np.linalg.norm(cloud.mean(axis=0) - truth) > 0.2 * true_radius  # the mean is biased
    centre, radius = frame.object_sphere(cloud)
    assert np.linalg.norm(centre - truth) < 0.01 * true_radius
    assert radius == pytest.approx(true_radius, rel=0.01)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 500])
def test_smallest_enclosing_sphere_is_the_smallest(n):
    """Every point inside, and the optimality condition of the smallest enclosing sphere: its centre
    is a convex combination of the points on its surface (otherwise moving it would shrink it)."""
    from scipy.optimize import nnls

    points = np.random.default_rng(n).normal(size=(n, 3)) * [1.0, 2.0, 0.5]
    centre, radius = smallest_enclosing_sphere(points)
    distance = np.linalg.norm(points - centre, axis=1)
    assert distance.max() <= radius * (1 + 1e-12)
    on_surface = points[distance >= radius * (1 - 1e-9)]
    system = np.vstack([on_surface.T, np.ones(len(on_surface)) * 10.0])  # sum of weights = 1, weighted
    weights, residual = nnls(system, np.append(centre, 10.0))
    assert residual < 1e-9 * max(1.0, radius)


def _poses_json(scene, path, convention="opencv", names=NAMES, with_points=False):
    views = []
    for i in range(3):
        rot, centre = scene.input_pose(i)
        axes = rot.T if convention == "opencv" else rot.T @ np.diag([1.0, -1.0, -1.0])
        m = np.eye(4)
        m[:3, :3], m[:3, 3] = axes, centre
        k = network_intrinsics(137)
        views.append(
            {
                "image": names[i],
                "camera_to_world": m.tolist(),
                "fx": k.fx,
                "fy": k.fy,
                "cx": k.cx,
                "cy": k.cy,
                "width": 137,
                "height": 137,
            }
        )
    data = {"convention": convention, "views": views[::-1]}  # listed out of order: matched by name
    if with_points:
        data["points"] = scene.to_input(scene.points).tolist()
    else:
        data["radius"] = frame.TARGET_RADIUS * scene.sigma
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("convention", ["opencv", "opengl"])
def test_poses_recover_the_cameras(tmp_path, convention):
    scene = make_scene(7)
    path = _poses_json(scene, tmp_path / "poses.json", convention)
    # the optical axes meet at the object centre, and the radius is given
    cams = xmesh.cameras.from_poses(path, NAMES, first_azimuth=scene.rows[0, 0])
    assert np.max(np.abs(cams.table - scene.rows)) < 1e-9
    with_points = _poses_json(scene, tmp_path / "points.json", convention, with_points=True)
    cams = xmesh.cameras.from_poses(with_points, NAMES, first_azimuth=scene.rows[0, 0])
    assert np.max(np.abs(cams.table - scene.rows)) < 1e-9


def test_colmap_text_model_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    rotations = [np.linalg.qr(rng.normal(size=(3, 3)))[0] for _ in range(3)]
    rotations = [r * np.sign(np.linalg.det(r)) for r in rotations]
    translations = rng.normal(size=(3, 3))
    k = [
        Intrinsics(500.0, 510.0, 320.5, 240.25, 640, 480),
        Intrinsics(400.0, 400.0, 300.0, 200.0, 600, 400, {"k1": -0.1, "k2": 0.01, "p1": 1e-3, "p2": -2e-3}),
        network_intrinsics(137),
    ]
    points = rng.normal(size=(50, 3))
    colmap.write_text_model(tmp_path, NAMES, rotations, translations, k, points)
    model = colmap.read_text_model(tmp_path)
    assert [im.name for im in model.images] == NAMES
    for im, r, t, kk in zip(model.images, rotations, translations, k):
        assert np.allclose(im.rotation, r, atol=1e-14) and np.allclose(im.translation, t, rtol=0, atol=0)
        assert im.intrinsics == kk or (im.intrinsics.fx == kk.fx and im.intrinsics.distortion == kk.distortion)
    assert np.array_equal(model.points, points)


def test_distortion_matches_opencv():
    k = from_model("OPENCV", 640, 480, [500, 505, 320, 240, -0.2, 0.05, 1e-3, -2e-3], "test")
    points = np.random.default_rng(2).uniform([-1, -1, 2], [1, 1, 4], size=(100, 3))
    uv, front = k.project(points)
    ref, _ = cv2.projectPoints(
        points,
        np.zeros(3),
        np.zeros(3),
        np.array([[500, 0, 320], [0, 505, 240], [0, 0, 1.0]]),
        np.array([-0.2, 0.05, 1e-3, -2e-3]),
    )
    assert front.all() and np.allclose(uv, ref[:, 0], atol=1e-9)
    full = from_model(
        "FULL_OPENCV", 640, 480, [500, 505, 320, 240, -0.2, 0.05, 1e-3, -2e-3, 0.01, 0.02, -0.01, 0.003], "t"
    )
    ref, _ = cv2.projectPoints(
        points,
        np.zeros(3),
        np.zeros(3),
        np.array([[500, 0, 320], [0, 505, 240], [0, 0, 1.0]]),
        np.array([-0.2, 0.05, 1e-3, -2e-3, 0.01, 0.02, -0.01, 0.003]),
    )
    assert np.allclose(full.project(points)[0], ref[:, 0], atol=1e-9)


# --------------------------------------------------------------------------------------- errors


def test_unregistered_view_is_named(tmp_path):
    write_colmap(make_scene(0), tmp_path, NAMES)
    with pytest.raises(InputError, match=r"view 1: photo 'IMG_0099.jpg' was not registered by COLMAP"):
        xmesh.cameras.from_colmap(tmp_path, ["IMG_0001.jpg", "IMG_0099.jpg", "IMG_0003.jpg"])


def test_fewer_than_three_views(tmp_path):
    scene = make_scene(0)
    write_colmap(scene, tmp_path, NAMES)
    with pytest.raises(InputError, match=r"2 view\(s\); Pixel2Mesh\+\+ needs exactly 3"):
        xmesh.cameras.from_colmap(tmp_path, NAMES[:2])
    model = colmap.read_text_model(tmp_path)
    two = tmp_path / "two"
    colmap.write_text_model(
        two,
        NAMES[:2],
        [im.rotation for im in model.images[:2]],
        [im.translation for im in model.images[:2]],
        [network_intrinsics(137)] * 2,
        model.points,
    )
    with pytest.raises(InputError, match=r"2 view\(s\)"):
        xmesh.cameras.from_colmap(two)


def test_camera_looking_away_is_named(tmp_path):
    scene = make_scene(0)
    with pytest.raises(InputError, match=r"view 1 \(IMG_0002.jpg\): the camera looks away from the object.*behind it"):
        xmesh.cameras.from_poses(_turned_poses(scene, tmp_path), NAMES, center=scene.shift, radius=scene.sigma * 0.24)
    write_colmap(scene, tmp_path / "aside", NAMES, turns=[np.eye(3), np.eye(3), _yaw(40.0)])
    with pytest.raises(InputError, match=r"view 2 \(IMG_0003.jpg\): the camera looks away.*outside the 137x137 photo"):
        xmesh.cameras.from_colmap(tmp_path / "aside", NAMES, center=scene.shift, radius=scene.sigma * 0.24)


def _turned_poses(scene, folder):
    path = _poses_json(scene, folder / "poses.json")
    data = json.loads(path.read_text())
    m = np.asarray(data["views"][1]["camera_to_world"])  # views are listed in reverse: this is view 1
    m[:3, :3] = m[:3, :3] @ np.diag([-1.0, 1.0, -1.0])
    data["views"][1]["camera_to_world"] = m.tolist()
    path.write_text(json.dumps(data))
    return path


def test_empty_mask_is_named(tmp_path):
    write_colmap(make_scene(0), tmp_path, NAMES)
    masks = [np.full((137, 137), 255, np.uint8), np.zeros((137, 137), np.uint8), np.full((137, 137), 255, np.uint8)]
    with pytest.raises(InputError, match=r"view 1 \(IMG_0002.jpg\): mask is empty"):
        xmesh.cameras.from_colmap(tmp_path, NAMES, masks=masks)


@pytest.mark.filterwarnings("ignore:camera distances")
def test_masks_pick_the_object_points(tmp_path):
    """Background points (a floor far around the object) are dropped by the masks, which the
    object's silhouettes are; without masks they would enlarge the sphere."""
    from photo_scene import network_photos

    scene = make_scene(9)
    rng = np.random.default_rng(0)
    floor = np.c_[rng.uniform(-3, 3, 400), np.full(400, -0.3), rng.uniform(-3, 3, 400)]
    write_colmap(scene, tmp_path, NAMES)
    model = colmap.read_text_model(tmp_path)
    colmap.write_text_model(
        tmp_path,
        NAMES,
        [im.rotation for im in model.images],
        [im.translation for im in model.images],
        [network_intrinsics(137)] * 3,
        np.concatenate([model.points, scene.to_input(floor)]),
    )
    masks = [photo[:, :, 3] for photo in network_photos(scene)]
    cams = xmesh.cameras.from_colmap(tmp_path, NAMES, masks=masks)
    assert cams.radius == pytest.approx(0.24 * scene.sigma, rel=0.03)
    assert np.linalg.norm(scene.from_input(cams.centre[None])[0]) < 0.01
    loose = xmesh.cameras.from_colmap(tmp_path, NAMES)
    assert loose.radius > 1.2 * cams.radius


def test_model_errors(tmp_path):
    with pytest.raises(MissingFileError, match="does not exist"):
        xmesh.cameras.from_colmap(tmp_path / "nothing", NAMES)
    (tmp_path / "cameras.bin").write_bytes(b"\0")
    with pytest.raises(MissingFileError, match="model_converter"):
        xmesh.cameras.from_colmap(tmp_path, NAMES)
    with pytest.raises(InputError, match="camera model 'FISHEYE' is not supported"):
        from_model("FISHEYE", 10, 10, [1, 2, 3], "cameras.txt")
    bad = {"views": [{"camera_to_world": np.diag([2.0, 2, 2, 1]).tolist(), "fx": 1, "fy": 1, "cx": 0, "cy": 0}] * 3}
    with pytest.raises(InputError, match="view 0: the rotation part of camera_to_world is not a rotation"):
        xmesh.cameras.from_poses(bad, radius=1.0)
