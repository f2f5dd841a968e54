"""Photos -> the network's input views: the original loader where the intrinsics already match, its
resampling geometry otherwise, masks, rolled and off-centre cameras, other intrinsics and lenses."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from photo_scene import make_scene, network_intrinsics, render_pinhole, roll
from xmesh.errors import InputError
from xmesh.io.cameras import load_cameras
from xmesh.photo import frame
from xmesh.photo.intrinsics import Intrinsics
from xmesh.photo.posed import PhotoView
from xmesh.photo.prepare import bilinear_white, prepare_photo
from xmesh.photo.views import convert


def _network_views(rows, intrinsics, turns=None):
    """PhotoViews for the network's own cameras (the network's world is the input world)."""
    views = []
    for i, row in enumerate(rows):
        row = np.asarray(row, dtype=np.float64)
        az, el = np.deg2rad(row[0]), np.deg2rad(row[1])
        centre = row[3] * np.array([np.cos(el) * np.cos(az), np.sin(el), np.cos(el) * np.sin(az)])
        turn = np.eye(3) if turns is None else turns[i]
        views.append(PhotoView(f"v{i}", intrinsics[i], turn @ frame.network_rotation(row[0], row[1]), centre))
    return views


def _network_cameras(rows, intrinsics, turns=None):
    return convert(
        _network_views(rows, intrinsics, turns),
        np.zeros(3),
        frame.TARGET_RADIUS,
        up=(0.0, 1.0, 0.0),
        first_azimuth=float(rows[0][0]),
    )


def test_renderings_with_the_network_intrinsics_go_through_the_original_loader(demo_dir, golden_dir):
    """The original demo's renderings, posed as photos with the network's intrinsics at 137 px: the
    result is the original's network input bit for bit (golden ``images``, computed by its loader)."""
    golden = np.load(golden_dir / "demo_seed1.npz")
    rows = load_cameras(demo_dir / "cameras.txt").astype(np.float64)
    cams = _network_cameras(rows, [network_intrinsics(137)] * 3)
    assert np.max(np.abs(cams.table - rows)) < 1e-9
    images = cams.prepare_images([demo_dir / f"plane{i}.png" for i in (1, 2, 3)])
    assert images.dtype == np.float32 and np.array_equal(images, golden["images"])


def test_resampling_has_the_resize_geometry():
    """Bilinear sampling at the mapping a resize would use gives cv2.resize's values (float data):
    pixel centres at +0.5, edge pixels repeated half a pixel out."""
    rng = np.random.default_rng(0)
    for height, width in ((137, 137), (300, 260), (224, 224)):
        image = rng.uniform(size=(height, width, 3))
        centres = np.arange(224) + 0.5
        u, v = np.meshgrid(centres * width / 224, centres * height / 224)
        ours = bilinear_white(image, np.stack([u, v], axis=-1), np.ones((224, 224), bool))
        ref = cv2.resize(image.astype(np.float32), (224, 224), interpolation=cv2.INTER_LINEAR)
        assert np.max(np.abs(ours - ref)) < 1e-5
    # a ray that misses the photo reads white
    out = bilinear_white(
        np.zeros((10, 10, 3)), np.array([[[-1.0, 5.0], [5.0, 10.6], [5.0, 5.0]]]), np.ones((1, 3), bool)
    )
    assert out[0, :2].tolist() == [[1.0] * 3] * 2 and out[0, 2].tolist() == [0.0] * 3


def test_a_mask_acts_as_the_alpha_channel(demo_dir):
    rgba = cv2.imread(str(demo_dir / "plane1.png"), cv2.IMREAD_UNCHANGED)
    rows = load_cameras(demo_dir / "cameras.txt").astype(np.float64)
    for k in (network_intrinsics(137), Intrinsics(160.0, 150.0, 70.0, 66.0, 137, 137)):  # original, resampled
        cams = _network_cameras(rows, [k] * 3)
        with_alpha = prepare_photo(cams, 0, rgba)
        # a mask marks the object where it is above half its range; alpha where it is above 0
        mask = np.where(rgba[:, :, 3] > 0, 255, 0).astype(np.uint8)
        with_mask = prepare_photo(cams, 0, np.ascontiguousarray(rgba[:, :, :3]), mask=mask)
        assert np.array_equal(with_alpha, with_mask)
        # the mask wins over an alpha channel, and paths work like arrays
        assert np.array_equal(prepare_photo(cams, 0, demo_dir / "plane1.png", mask=mask), with_alpha)
        with pytest.warns(UserWarning, match="view 0 .v0.: photo: no mask and no alpha channel"):
            prepare_photo(cams, 0, np.ascontiguousarray(rgba[:, :, :3]))
        assert not np.array_equal(prepare_photo(cams, 0, rgba, mask=np.ascontiguousarray(mask[:, ::-1])), with_alpha)
    # the background really turns white: corner pixels of the demo are transparent
    assert np.all(with_alpha[0, 0] == 1.0)


def _coverage(cams, index, photo):
    """The photo's alpha resampled like its colours: 1 on the object, 0 elsewhere (and off the photo)."""
    inverted = np.repeat(255 - photo[:, :, 3:4], 3, axis=2)
    everywhere = np.full(photo.shape[:2], 255, np.uint8)  # no white-out: the image is the coverage
    return 1.0 - prepare_photo(cams, index, inverted, mask=everywhere)[:, :, 0]


def _compare(cams, index, photo, reference):
    """Silhouette IoU, and the mean colour error inside the object, of a prepared photo and the
    network camera's own rendering (BGRA, 224 px)."""
    ours, theirs = _coverage(cams, index, photo) > 0.5, reference[:, :, 3] > 127
    iou = (ours & theirs).sum() / (ours | theirs).sum()
    inside = (_coverage(cams, index, photo) > 0.99) & (reference[:, :, 3] == 255)
    colour = prepare_photo(cams, index, photo)
    return iou, float(np.abs(colour - reference[:, :, :3] / 255.0)[inside].mean())


@pytest.mark.parametrize("case", ["other intrinsics", "rolled and off-centre", "phone-sized with distortion"])
def test_photos_come_out_as_the_network_camera_sees_them(case):
    """A photo taken from the network camera's place with another camera (intrinsics, roll, aim,
    lens) is resampled into (nearly) what the network's camera itself would have taken."""
    scene = make_scene(4)
    index = 1
    rot, centre = scene.input_pose(index)
    reference = render_pinhole(scene, rot, centre, network_intrinsics(224))
    turned = case != "other intrinsics"
    if case == "other intrinsics":
        k, turn = Intrinsics(420.0, 430.0, 170.0, 205.0, 330, 380), np.eye(3)
    elif case == "rolled and off-centre":
        k, turn = Intrinsics(500.0, 500.0, 240.0, 240.0, 480, 480), roll(25.0) @ _yaw(6.0)
    else:
        k = Intrinsics(2600.0, 2600.0, 1010.0, 760.0, 2000, 1500, {"k1": -0.08, "k2": 0.02})
        turn = roll(-8.0) @ _yaw(-2.0)
    photo_rot, _ = scene.input_pose(index, turn)
    photo = render_pinhole(scene, photo_rot, centre, k, supersample=1 if k.width > 1000 else 3)
    views = [PhotoView(f"v{i}", network_intrinsics(137), *scene.input_pose(i)) for i in range(3)]
    views[index] = PhotoView("photo", k, photo_rot, centre)
    cams = convert(views, scene.shift, frame.TARGET_RADIUS * scene.sigma, up=scene.rotation[:, 1])
    iou, error = _compare(cams, index, photo, reference)
    assert iou > 0.98 and error < 0.04, (iou, error)
    assert (abs(cams.roll_degrees()[index]) > 5.0) == turned
    # a wrong intrinsic (focal off by 10%) is visibly wrong: the check can fail
    wrong = PhotoView(
        "photo", Intrinsics(k.fx * 1.1, k.fy * 1.1, k.cx, k.cy, k.width, k.height, k.distortion), photo_rot, centre
    )
    bad = convert(
        views[:index] + [wrong] + views[index + 1 :],
        scene.shift,
        frame.TARGET_RADIUS * scene.sigma,
        up=scene.rotation[:, 1],
    )
    assert _compare(bad, index, photo, reference)[0] < 0.85


def _yaw(degrees):
    from scipy.spatial.transform import Rotation

    return Rotation.from_euler("y", degrees, degrees=True).as_matrix()


def test_photo_errors_name_the_view(demo_dir):
    rows = load_cameras(demo_dir / "cameras.txt").astype(np.float64)
    cams = _network_cameras(rows, [network_intrinsics(137)] * 3)
    rgba = cv2.imread(str(demo_dir / "plane2.png"), cv2.IMREAD_UNCHANGED)
    clear = rgba.copy()
    clear[:, :, 3] = 0
    with pytest.raises(InputError, match=r"view 1 \(v1\): photo: the alpha channel is 0 everywhere"):
        prepare_photo(cams, 1, clear)
    with pytest.raises(InputError, match=r"view 2 \(v2\): mask is empty"):
        prepare_photo(cams, 2, rgba, mask=np.zeros((137, 137), np.uint8))
    with pytest.raises(InputError, match=r"view 0 \(v0\): mask: the mask is 100x137 pixels but its photo is 137x137"):
        prepare_photo(cams, 0, rgba, mask=np.ones((137, 100), np.uint8) * 255)
    with pytest.raises(
        InputError,
        match=r"view 0 \(v0\): photo: the photo is 137x100 pixels but its camera was "
        "calibrated at 137x137, another aspect ratio",
    ):
        prepare_photo(cams, 0, rgba[:100])
    with pytest.raises(InputError, match="got 2 photos"):
        cams.prepare_images([rgba, rgba])


def test_a_photo_larger_than_its_calibration_is_scaled_alike(demo_dir):
    """COLMAP run on 137 px copies, the photo given at 274 px: the intrinsics scale with it."""
    rows = load_cameras(demo_dir / "cameras.txt").astype(np.float64)
    cams = _network_cameras(rows, [network_intrinsics(137)] * 3)
    rgba = cv2.imread(str(demo_dir / "plane3.png"), cv2.IMREAD_UNCHANGED)
    small = prepare_photo(cams, 2, rgba)
    large = prepare_photo(cams, 2, cv2.resize(rgba, (274, 274), interpolation=cv2.INTER_NEAREST))
    assert np.abs(large - small).mean() < 0.01
    shifted = prepare_photo(cams, 2, cv2.resize(rgba, (274, 274), interpolation=cv2.INTER_NEAREST)[::-1].copy())
    assert np.abs(shifted - small).mean() > 0.02
