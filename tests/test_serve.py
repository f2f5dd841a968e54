"""xmesh serve: a real server on 127.0.0.1 (NumPy backend, synthetic weights) answers concurrent requests in
one batch with the offline meshes (within the golden tolerances: a batch rounds otherwise than a lone
sample), refuses every bad request with a 4xx naming the field (and keeps serving), answers 503 when
full, finishes its requests on SIGTERM, and serves its page."""

from __future__ import annotations

import base64
import http.client
import json
import os
import pickle
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

pytest.importorskip("litserve")

import browser  # noqa: E402
import xmesh  # noqa: E402
from conftest import requires_cuda  # noqa: E402
from tolerance import GPU_ATOL, GPU_MAX_FRACTION, assert_mostly_within, assert_same_mesh  # noqa: E402
from xmesh.backends import get_backend  # noqa: E402
from xmesh.io.cameras import load_cameras  # noqa: E402
from xmesh.io.gltf import read_glb  # noqa: E402
from xmesh.io.images import UINT8_TO_UNIT, load_images  # noqa: E402
from xmesh.io.weights import (
    synthetic_weights,  # noqa: E402
    weights_fingerprint,  # noqa: E402
)
from xmesh.mesh import Mesh, read_obj, read_ply  # noqa: E402
from xmesh.serve.client import ServerError, multipart_body, reconstruct_remote  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 180
BATCH_WAIT_MS = 2000  # the test server waits this long to gather a batch (a NumPy sample takes seconds here)
READ_TIMEOUT_S, BODY_TIMEOUT_S = 1, 6  # the test server's pause and whole-body limits


# BLAS single-threaded in the servers and the CLI: they share this machine's cores with the test and
# with each other. Their meshes are compared with the offline ones within the golden tolerances, which
# hold whatever the thread counts.
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def child_env() -> dict:
    return dict(os.environ, **ONE_THREAD)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, tmp: Path, *options: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"serve-{self.port}.log"
        command = [
            sys.executable,
            "-m",
            "xmesh",
            "serve",
            "--weights",
            "synthetic:1",
            "--port",
            str(self.port),
            "--http-processes",
            "1",
            *options,
        ]
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(command, cwd=tmp, stdout=log, stderr=subprocess.STDOUT, env=child_env())
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"xmesh serve exited: {self.log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise AssertionError(f"xmesh serve did not become healthy: {self.log.read_text()[-3000:]}")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(90)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def info(self) -> dict:
        with urllib.request.urlopen(self.url + "/v1/info", timeout=10) as response:
            return json.loads(response.read())


def post(url: str, body: bytes, content_type: str | None, path: str = "/v1/reconstruct", headers=None):
    """(status, headers, body) of a POST, without raising on 4xx/5xx."""
    connection = http.client.HTTPConnection(url.split("//")[1], timeout=600)
    all_headers = {"Content-Type": content_type} if content_type else {}
    all_headers.update(headers or {})
    try:
        connection.request("POST", path, body=body, headers=all_headers)
    except (BrokenPipeError, ConnectionResetError):
        pass  # a server that refuses a body may answer and close before all of it is sent
    response = connection.getresponse()
    answer = (response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    connection.close()
    return answer


def form(images, fields) -> tuple[bytes, str]:
    return multipart_body(
        [(Path(p).name, Path(p).read_bytes()) if not isinstance(p, tuple) else p for p in images], fields
    )


@pytest.fixture(scope="module")
def inputs(demo_dir):
    paths = [demo_dir / f"plane{i}.png" for i in (1, 2, 3)]
    rows = load_cameras(demo_dir / "cameras.txt")
    order = [2, 0, 1]
    return {"a": (paths, rows), "b": ([paths[i] for i in order], rows[order])}


@pytest.fixture(scope="module")
def model():
    return xmesh.Reconstructor(synthetic_weights(1))


@pytest.fixture(scope="module")
def offline(inputs, model):
    """The meshes ``xmesh reconstruct`` computes for samples a and b: one sample per call."""
    with threadpool_limits(1):
        return {key: model(paths, rows) for key, (paths, rows) in inputs.items()}


@pytest.fixture(scope="module")
def posed(tmp_path_factory, model):
    """RGBA photos of a synthetic capture (alpha: the object), their poses JSON (camera-to-world,
    OpenGL axes, intrinsics), and the mesh ``xmesh reconstruct --poses`` makes of them."""
    from photo_scene import make_scene, network_intrinsics, network_photos
    from xmesh.cameras import from_poses

    scene, folder = make_scene(2), tmp_path_factory.mktemp("posed")
    paths, views = [], []
    for i, photo in enumerate(network_photos(scene, 137)):
        paths.append(folder / f"IMG_{i}.png")
        cv2.imwrite(str(paths[-1]), photo)
        rot, centre = scene.input_pose(i)
        pose = np.eye(4)
        pose[:3, :3], pose[:3, 3] = rot.T @ np.diag([1.0, -1.0, -1.0]), centre
        k = network_intrinsics(137)
        views.append(
            {
                "image": paths[-1].name,
                "camera_to_world": pose.tolist(),
                "fx": k.fx,
                "fy": k.fy,
                "cx": k.cx,
                "cy": k.cy,
                "width": 137,
                "height": 137,
            }
        )
    poses = {"convention": "opengl", "views": views, "center": scene.shift.tolist(), "radius": 0.24 * scene.sigma}
    with threadpool_limits(1):
        return paths, json.dumps(poses), model(paths, from_poses(poses, [p.name for p in paths]))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(
        tmp_path_factory.mktemp("serve"),
        "--max-batch",
        "8",
        "--batch-timeout-ms",
        str(BATCH_WAIT_MS),
        "--max-body-mb",
        "8",
        "--read-timeout-s",
        str(READ_TIMEOUT_S),
        "--body-timeout-s",
        str(BODY_TIMEOUT_S),
        "--max-queue",
        "64",
    )
    yield srv
    srv.stop()


def check_server_timing(headers: dict) -> None:
    """An answer's Server-Timing: every step of PHASES, none negative (stamps of the HTTP process and the
    worker on one clock), the steps adding up to the total, the total the X-Xmesh-Server-Ms header and
    compute the X-Xmesh-Compute-Ms header (3 decimals each: a step may be 0.0005 ms off)."""
    from xmesh.serve.routes import PHASES, parse_server_timing

    steps = parse_server_timing(headers["server-timing"])
    assert list(steps) == [name for name, *_ in PHASES], steps
    assert min(steps.values()) >= 0.0, steps
    parts = [value for name, value in steps.items() if name != "total"]
    assert abs(sum(parts) - steps["total"]) <= 0.001 * len(parts), steps
    assert abs(steps["total"] - float(headers["x-xmesh-server-ms"])) <= 0.001, steps
    assert abs(steps["compute"] - float(headers["x-xmesh-compute-ms"])) <= 0.001, steps


def cameras_field(rows) -> dict:
    return {"cameras": json.dumps(np.asarray(rows, dtype=np.float64).tolist())}


def png_bytes(image) -> bytes:
    return cv2.imencode(".png", image)[1].tobytes()


def obj_mesh(data: bytes, where: Path) -> Mesh:
    """The mesh of an OBJ answer, read back by xmesh's reader (written to ``where`` first)."""
    where.write_bytes(data)
    return read_obj(where)


# ------------------------------------------------------------------------------------------ batching


def test_concurrent_requests_run_as_one_batch_and_equal_offline_reconstructions(
    server, inputs, offline, posed, tmp_path
):
    (paths_a, rows_a), (paths_b, rows_b) = inputs["a"], inputs["b"]
    np.savetxt(tmp_path / "cams_b.txt", rows_b)
    results: dict = {}

    def raw(key, paths, rows, query="", headers=None):
        body, kind = form(paths, cameras_field(rows))
        results[key] = post(server.url, body, kind, "/v1/reconstruct" + query, headers)

    def remote():
        results["remote"] = reconstruct_remote(server.url, paths_a, cameras=rows_a)

    def cli():
        results["cli"] = subprocess.run(
            [
                sys.executable,
                "-m",
                "xmesh",
                "reconstruct",
                *map(str, paths_b),
                "--cameras",
                str(tmp_path / "cams_b.txt"),
                "--server",
                server.url,
                "--out",
                str(tmp_path / "b.ply"),
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=child_env(),
        )

    bad_body, bad_kind = form(paths_a, {"cameras": "[[0, 25, 0, 0.8, NaN], [1, 2, 0, 1, 25], [1, 2, 0, 1, 25]]"})
    jobs = [
        lambda: raw("obj", paths_a, rows_a),
        lambda: raw("ply", paths_b, rows_b, headers={"Accept": "application/x-ply"}),
        lambda: raw("preview", paths_a, rows_a, "?format=preview"),
        remote,
        cli,
        lambda: results.setdefault(
            "poses", post(server.url, *form(posed[0], {"poses": posed[1]}), "/v1/reconstruct?format=glb")
        ),
        lambda: results.setdefault("bad", post(server.url, bad_body, bad_kind)),
        lambda: raw("two", paths_a[:2], rows_a),
    ]
    threads = [threading.Thread(target=job) for job in jobs]
    for thread in threads:
        thread.start()
        time.sleep(0.05)
    for thread in threads:
        thread.join(600)

    # the bad requests beside them were refused on their own
    assert results["bad"][0] == 400 and json.loads(results["bad"][2])["field"] == "cameras"
    assert results["two"][0] == 400 and json.loads(results["two"][2])["field"] == "images"
    # the good ones ran batched, and each is the offline mesh within the golden tolerances
    statuses = {key: results[key][0] for key in ("obj", "ply", "preview")}
    assert statuses == {"obj": 200, "ply": 200, "preview": 200}, results
    sizes = [int(results[key][1]["x-xmesh-batch-size"]) for key in ("obj", "ply", "preview")]
    assert max(sizes) > 1, sizes
    assert all(float(results[key][1]["x-xmesh-server-ms"]) > 0 for key in ("obj", "ply", "preview"))
    for key in ("obj", "ply", "preview"):
        check_server_timing(results[key][1])
    assert results["obj"][1]["content-type"] == "model/obj"
    (tmp_path / "a.obj").write_bytes(results["obj"][2])
    (tmp_path / "b_served.ply").write_bytes(results["ply"][2])
    expected_a, expected_b = offline["a"], offline["b"]
    for mesh, expected in (
        (read_obj(tmp_path / "a.obj"), expected_a),
        (read_ply(tmp_path / "b_served.ply"), expected_b),
        (results["remote"], expected_a),
    ):
        assert_same_mesh(mesh, expected)
    assert results["poses"][0] == 200, results["poses"][2][:300]
    vertices, faces = read_glb(results["poses"][2])  # in the poses' world, as xmesh reconstruct --poses
    assert_same_mesh(Mesh(vertices, faces), posed[2])
    assert results["cli"].returncode == 0, results["cli"].stderr
    assert_same_mesh(read_ply(tmp_path / "b.ply"), expected_b)
    # the page's preview: a picture and the three files
    preview = json.loads(results["preview"][2])
    picture = cv2.imdecode(np.frombuffer(base64.b64decode(preview["picture"]), np.uint8), cv2.IMREAD_COLOR)
    assert picture.shape[1] > 4 * picture.shape[0] / 2 and picture.std() > 10
    vertices, faces = read_glb(base64.b64decode(preview["files"]["glb"]))
    assert_same_mesh(Mesh(vertices, faces), expected_a)
    assert_same_mesh(obj_mesh(base64.b64decode(preview["files"]["obj"]), tmp_path / "preview.obj"), expected_a)


def test_a_server_of_batches_of_one_answers_each_request_as_offline(tmp_path, inputs, offline):
    srv = Server(tmp_path, "--max-batch", "1")
    try:
        results: dict = {}

        def send(key):
            paths, rows = inputs[key]
            results[key] = post(srv.url, *form(paths, cameras_field(rows)))

        threads = [threading.Thread(target=send, args=(key,)) for key in ("a", "b")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(600)
        for key in ("a", "b"):
            status, headers, answer = results[key]
            assert status == 200, answer[:300]
            assert headers["x-xmesh-batch-size"] == "1"
            assert_same_mesh(obj_mesh(answer, tmp_path / f"{key}.obj"), offline[key])
    finally:
        assert srv.stop() == 0
    log = srv.log.read_text()
    assert "Traceback" not in log
    assert "leaked" not in log and "resource_tracker" not in log  # every queue's semaphores released


def test_info_names_the_weights_fingerprint_and_devices(server):
    info = server.info()
    assert info["weights"]["synthetic"] is True
    assert info["weights"]["sha256"] == weights_fingerprint(synthetic_weights(1))
    assert info["devices"] == ["cpu"] and info["precision"] == "fp32" and info["max_batch"] == 8


# ------------------------------------------------------------------------------------------ bad input


def png_bomb(side: int = 30000) -> bytes:
    """A complete grey PNG of side x side zero pixels: a few MB that decode to side**2 bytes."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    packer = zlib.compressobj(1)
    rows = bytes((side + 1) * 1000)
    idat = b"".join([packer.compress(rows) for _ in range(side // 1000)] + [packer.flush()])
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0))
        + chunk(b"IDAT", idat)
        + chunk(b"IEND", b"")
    )


def bad_requests(paths, rows):
    good = [(p.name, p.read_bytes()) for p in paths]
    cams = cameras_field(rows)
    return {
        "malformed multipart": (
            b"--zz\r\nContent-Disposition: form-data\r\n\r\ngarbage",
            "multipart/form-data; boundary=yy",
            400,
            "body",
        ),
        "no boundary": (b"garbage", "multipart/form-data", 400, "body"),
        "json body": (b'{"images": []}', "application/json", 415, "body"),
        "two images": (*multipart_body(good[:2], cams), 400, "images"),
        "four images": (*multipart_body(good + good[:1], cams), 400, "images"),
        "undecodable image": (
            *multipart_body([("x.png", b"\x89PNG\r\n\x1a\n" + bytes(40))] + good[1:], cams),
            400,
            "images[0] ('x.png')",
        ),
        "not an image": (*multipart_body([("notes.txt", b"hello")] + good[1:], cams), 400, "images[0] ('notes.txt')"),
        "empty image": (*multipart_body(good[:2] + [("c.png", b"")], cams), 400, "images[2] ('c.png')"),
        "two bad images": (
            *multipart_body(good[:1] + [("b.png", b"\x89PNG\r\n\x1a\n" + bytes(40)), ("c.png", b"")], cams),
            400,
            "images[1] ('b.png')",
        ),  # the first at fault in view order, not the first to fail
        "decompression bomb": (
            *multipart_body([("bomb.png", png_bomb())] + good[1:], cams),
            413,
            "images[0] ('bomb.png')",
        ),
        "cameras not numbers": (
            *multipart_body(good, {"cameras": '[["a", 1, 0, 1, 25], [0, 1, 0, 1, 25], [0, 1, 0, 1, 25]]'}),
            400,
            "cameras",
        ),
        "cameras NaN": (
            *multipart_body(good, {"cameras": "[[NaN, 1, 0, 1, 25], [0, 1, 0, 1, 25], [0, 1, 0, 1, 25]]"}),
            400,
            "cameras",
        ),
        "cameras two rows": (
            *multipart_body(good, {"cameras": "[[0, 1, 0, 1, 25], [0, 1, 0, 1, 25]]"}),
            400,
            "cameras",
        ),
        "cameras not JSON": (*multipart_body(good, {"cameras": "0 25 0 0.8 25"}), 400, "cameras"),
        "no cameras": (*multipart_body(good, {}), 400, "cameras"),
        "cameras and poses": (*multipart_body(good, {**cams, "poses": "{}"}), 400, "cameras"),
        "poses without views": (*multipart_body(good, {"poses": '{"convention": "opencv"}'}), 400, "poses"),
        "unknown field": (*multipart_body(good, {**cams, "camera": "x"}), 400, "camera"),
        "body over the limit": (*multipart_body(good + [("big.png", bytes(9 * 2**20))], cams), 413, "body"),
    }


def test_every_bad_request_is_a_4xx_naming_its_field_and_the_server_keeps_serving(server, inputs):
    cases = bad_requests(*inputs["a"])
    for name, (body, kind, status, field) in cases.items():
        got, headers, answer = post(server.url, body, kind)
        assert got == status, (name, got, answer[:300])
        detail = json.loads(answer)
        assert detail["field"] == field and detail["status"] == status and detail["error"], (name, detail)
        assert b"Traceback" not in answer
    unknown_format = post(
        server.url, *form(inputs["a"][0], cameras_field(inputs["a"][1])), "/v1/reconstruct?format=stl"
    )
    assert unknown_format[0] == 400 and json.loads(unknown_format[2])["field"] == "format"
    with urllib.request.urlopen(server.url + "/health", timeout=10) as response:
        assert response.status == 200
    assert server.info()["in_server"] == 0


def test_a_body_without_length_over_the_limit_is_cut_off(server):
    body, kind = multipart_body([("big.png", bytes(9 * 2**20))], {})
    connection = http.client.HTTPConnection(f"127.0.0.1:{server.port}", timeout=60)
    connection.request(
        "POST",
        "/v1/reconstruct",
        body=iter([body[i : i + 2**20] for i in range(0, len(body), 2**20)]),
        headers={"Content-Type": kind},
        encode_chunked=True,
    )
    response = connection.getresponse()
    assert response.status == 413 and json.loads(response.read())["field"] == "body"


def raw_request(port: int, declared_length: int) -> socket.socket:
    """A connection that has sent a request's headers and the start of its body."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(
        f"POST /v1/reconstruct HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=zz\r\n"
        f"Content-Length: {declared_length}\r\n\r\n--zz\r\n".encode("ascii")
    )
    return sock


def json_answer(sock: socket.socket) -> bytes:
    """What the server sent on ``sock`` until its JSON body is whole, or it closed."""
    answer = b""
    while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
        data = sock.recv(65536)
        if not data:
            break
        answer += data
    return answer


def test_a_client_that_stops_sending_gets_408_and_one_that_leaves_costs_nothing(server, inputs):
    slow = raw_request(server.port, 100_000)
    answer = json_answer(slow)
    slow.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["field"] == "body"
    for _ in range(3):
        gone = raw_request(server.port, 100_000)
        gone.sendall(b'Content-Disposition: form-data; name="images"')
        gone.close()
    time.sleep(0.5)
    got = post(server.url, *form(inputs["a"][0][:2], cameras_field(inputs["a"][1])))
    assert got[0] == 400 and json.loads(got[2])["field"] == "images"
    assert server.info()["in_server"] == 0


def test_a_client_that_trickles_its_body_gets_408_at_the_whole_body_deadline(server):
    """A byte every 0.3 s never pauses as long as --read-timeout-s, yet the body must be whole within
    --body-timeout-s: such a client cannot hold a place in the server for ever."""
    sock = raw_request(server.port, 100_000)
    sock.sendall(b'Content-Disposition: form-data; name="cameras"\r\n\r\n')
    start = time.monotonic()
    # a byte whenever 0.3 s pass with nothing to read: none is sent after the answer (a closed peer's
    # reset could drop it before it is read)
    while not select.select([sock], [], [], 0.3)[0] and time.monotonic() - start < BODY_TIMEOUT_S + 30:
        sock.sendall(b"0")
    elapsed = time.monotonic() - start
    answer = json_answer(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    detail = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert detail["field"] == "body" and detail["error"].startswith(f"not whole after {BODY_TIMEOUT_S} s"), detail
    assert BODY_TIMEOUT_S - 0.5 < elapsed < BODY_TIMEOUT_S + 15, elapsed
    assert server.info()["in_server"] == 0


def test_the_cli_sends_poses_to_the_server_and_writes_the_obj_it_would_write_here(server, posed, tmp_path):
    paths, poses, expected = posed
    (tmp_path / "poses.json").write_text(poses, encoding="utf-8")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "xmesh",
            "reconstruct",
            *map(str, paths),
            "--poses",
            str(tmp_path / "poses.json"),
            "--server",
            server.url,
            "--out",
            str(tmp_path / "m.obj"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=child_env(),
    )
    assert done.returncode == 0, done.stderr
    mesh = read_obj(tmp_path / "m.obj")  # in the poses' world, as xmesh reconstruct --poses writes it here
    assert_same_mesh(mesh, expected)


CURL_PAGES = [
    page
    for page in (ROOT / "README.md", ROOT / "docs" / "serving.md")
    if page.is_file() and "curl -F images=@" in page.read_text(encoding="utf-8")
]


def readme_curl(page: Path) -> list[str]:
    """The curl line of the README ("Serve it") or the manual's serving page, as the shell would split it."""
    import shlex

    text = page.read_text(encoding="utf-8")
    start = text.index("curl -F images=@")
    line = text[start : text.index("\n", text.index("http://", start))].replace("\\\n", " ")
    return shlex.split(line)


def test_the_curl_line_is_documented():
    assert CURL_PAGES, "neither README.md nor docs/serving.md shows the curl line"


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
@pytest.mark.parametrize("page", CURL_PAGES, ids=[p.name for p in CURL_PAGES])
def test_the_readme_curl_line_gets_the_mesh_of_its_cameras(server, model, tmp_path, page):
    """The documented curl line sends the pictures ``xmesh demo`` writes, with their own camera rows (as
    in its cameras.txt, rounded), and gets the mesh of those rows."""
    from xmesh.cli import build_parser
    from xmesh.synthetic.dataset import demo_inputs

    words = readme_curl(page)
    images = [w[len("images=@") :] for w in words if w.startswith("images=@")]
    cameras = np.asarray(json.loads(next(w for w in words if w.startswith("cameras="))[len("cameras=") :]))
    out = Path(words[words.index("-o") + 1])
    demo_out = build_parser().parse_args(["demo"]).out  # where a plain `xmesh demo` writes
    paths, camera_file = demo_inputs(tmp_path / demo_out / "inputs", seed=0)  # what it writes there
    assert images == [str(p.relative_to(tmp_path)) for p in paths]
    np.testing.assert_allclose(cameras, load_cameras(camera_file), rtol=0, atol=1e-4)  # 4 decimals of float32 rows
    words = [w.replace("http://127.0.0.1:8000", server.url) for w in words]
    done = subprocess.run(words, capture_output=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr
    with threadpool_limits(1):
        expected = model(paths, cameras.astype(np.float32))
    assert_same_mesh(read_obj(tmp_path / out), expected)


# ------------------------------------------------------------------------------------------ options


def test_the_serve_options_are_checked_before_anything_starts(monkeypatch, tmp_path):
    from xmesh.cli import build_parser
    from xmesh.commands.serve import check_options, parse_devices
    from xmesh.errors import InputError

    parser = build_parser()

    def options(*extra):
        return parser.parse_args(["serve", "--weights", "synthetic:1", *extra])

    for good in ((), ("--host", "0.0.0.0"), ("--host", "::"), ("--port", "1024"), ("--port", "65535")):
        check_options(options(*good))
    bad = {
        ("--port", "80"): "--port 80",
        ("--max-batch", "0"): "--max-batch 0",
        ("--max-queue", "0"): "--max-queue 0",
        ("--max-body-mb", "0"): "--max-body-mb 0",
        ("--body-timeout-s", "0"): "--body-timeout-s",
        ("--read-timeout-s", "-1"): "--read-timeout-s",
        ("--batch-timeout-ms", "-1"): "--batch-timeout-ms",
        ("--http-processes", "0"): "--http-processes 0",
        ("--port", "65536"): "--port 65536",
    }
    for extra, named in bad.items():
        with pytest.raises(InputError, match=named):
            check_options(options(*extra))
    # a user sees a line naming the option, no traceback, and nothing starts
    for extra, named in ((("--port", "80"), "--port 80"), (("--host", "10.1.2.3"), "--host: invalid choice")):
        done = subprocess.run(
            [sys.executable, "-m", "xmesh", "serve", "--weights", "synthetic:1", *extra],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=child_env(),
            timeout=120,
        )
        assert done.returncode != 0 and named in done.stderr and "Traceback" not in done.stderr, done.stderr

    assert parse_devices(None, "numpy") is None
    assert parse_devices("0,2", "cupy") == (0, 2) and parse_devices("1", "cupy") == (1,)
    with pytest.raises(InputError, match="--backend numpy runs one CPU worker"):
        parse_devices("0", "numpy")
    for value in ("1,1", "-1", "a", "", "0,,1"):
        with pytest.raises(InputError, match="expected 'all' or distinct GPU indices"):
            parse_devices(value, "cupy")
    monkeypatch.setattr("litserve.connector.check_cuda_with_nvidia_smi", lambda: 4)
    assert parse_devices("all", "cupy") == parse_devices(None, "cupy") == (0, 1, 2, 3)
    monkeypatch.setattr("litserve.connector.check_cuda_with_nvidia_smi", lambda: 0)
    with pytest.raises(InputError, match="nvidia-smi lists no GPU"):
        parse_devices("all", "cupy")


def test_a_worker_sees_only_its_own_gpu_counted_among_those_the_server_saw(monkeypatch):
    from xmesh.serve.worker import select_device

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6,7")
    select_device("cuda:1")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "6"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    select_device("cuda:2")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2"
    select_device("cpu")  # the NumPy backend's one worker: nothing chosen
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2"


def test_info_of_weights_from_a_file_says_they_are_not_synthetic_and_fingerprints_their_contents(tmp_path):
    from xmesh.cli import build_parser
    from xmesh.commands.common import resolve_weights
    from xmesh.commands.serve import server_info
    from xmesh.io.weights import load_weights

    np.savez(tmp_path / "w.npz", **synthetic_weights(1))
    args = build_parser().parse_args(
        ["serve", "--weights", str(tmp_path / "w.npz"), "--backend", "cupy", "--precision", "fp16"]
    )
    info = server_info(args, weights_fingerprint(load_weights(resolve_weights(args.weights))), (0, 2), 3)
    assert info["weights"]["synthetic"] is False and "w.npz" in info["weights"]["description"]
    assert info["weights"]["sha256"] == weights_fingerprint(synthetic_weights(1))  # the arrays, not the file
    assert info["devices"] == ["cuda:0", "cuda:2"] and info["precision"] == "fp16" and info["backend"] == "cupy"
    assert info["http_processes"] == 3


# ------------------------------------------------------------------------------------------ full, stopped


def test_a_full_server_answers_503_and_sigterm_finishes_the_requests_in_flight(tmp_path, inputs, offline):
    srv = Server(tmp_path, "--max-queue", "1", "--batch-timeout-ms", "0")
    try:
        paths, rows = inputs["a"]
        body, kind = form(paths, cameras_field(rows))
        first: dict = {}
        thread = threading.Thread(target=lambda: first.setdefault("answer", post(srv.url, body, kind)))
        thread.start()
        deadline = time.monotonic() + 30
        while srv.info()["in_server"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        status, headers, answer = post(srv.url, body, kind)
        assert status == 503 and headers["retry-after"] == "1" and json.loads(answer)["status"] == 503
        srv.process.send_signal(signal.SIGTERM)
        thread.join(300)
        status, headers, answer = first["answer"]
        assert status == 200, answer[:300]
        assert_same_mesh(obj_mesh(answer, tmp_path / "first.obj"), offline["a"])
        assert srv.process.wait(120) == 0  # a clean stop, nothing left to clean up by hand
        log = srv.log.read_text()
        assert "Traceback" not in log and "leaked" not in log, log[-3000:]
        with pytest.raises(OSError):
            urllib.request.urlopen(srv.url + "/health", timeout=5)
    finally:
        srv.stop()


# ------------------------------------------------------------------------------------------ on a GPU

# A served mesh against `xmesh reconstruct`'s in the same mode: fp32 within the end-to-end tolerance; fp16
# within 1e-3, twice the mode's largest coordinate error against fp32 (5.1e-4, docs/PERFORMANCE.md's
# precision table), since a batch may pick other cuDNN algorithms than a lone sample.
SERVED_TOLERANCE = {"fp32": (GPU_ATOL, GPU_MAX_FRACTION), "fp16": (1e-3, GPU_MAX_FRACTION)}


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_on_a_gpu_served_meshes_are_the_local_ones_within_the_mode_tolerance(tmp_path, inputs, precision):
    srv = Server(
        tmp_path,
        "--backend",
        "cupy",
        "--precision",
        precision,
        "--devices",
        "0",
        "--max-batch",
        "8",
        "--batch-timeout-ms",
        "300",
    )
    try:
        info = srv.info()
        answers: dict = {}
        jobs = [(key, i) for key in ("a", "b") for i in range(3)]

        def send(key, i):
            answers[key, i] = post(
                srv.url, *form(inputs[key][0], cameras_field(inputs[key][1])), "/v1/reconstruct?format=glb"
            )

        threads = [threading.Thread(target=send, args=job) for job in jobs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
    finally:
        srv.stop()
    assert info["devices"] == ["cuda:0"] and info["precision"] == precision and info["backend"] == "cupy"
    local = xmesh.Reconstructor(synthetic_weights(1), backend="cupy", precision=precision)
    atol, fraction = SERVED_TOLERANCE[precision]
    assert max(int(answers[job][1]["x-xmesh-batch-size"]) for job in jobs) > 1
    for key, i in jobs:
        status, _, body = answers[key, i]
        assert status == 200, body[:300]
        expected = local(*inputs[key]).vertices
        vertices, _ = read_glb(body)
        assert_mostly_within(vertices, expected, atol, fraction, (key, i))


@pytest.mark.gpu
@requires_cuda
def test_on_a_gpu_a_batch_out_of_memory_is_split_and_each_answer_is_its_sample_alone(monkeypatch):
    """CuPy's own OutOfMemoryError, raised for batches of more than two, in the worker's GPU path (the
    views staged and uploaded, the network launched, the results collected): the batch is run in
    halves and every request answered as its sample run alone."""
    import cupy

    from xmesh.serve.upload import Sample
    from xmesh.serve.worker import ReconstructAPI

    api = ReconstructAPI.__new__(ReconstructAPI)
    api.model = xmesh.Reconstructor(synthetic_weights(1), backend="cupy", precision="fp32")
    real, sizes = api.model._run_once, []

    def run_once(images, cameras, trace):
        sizes.append(len(cameras))
        if len(cameras) > 2:
            raise cupy.cuda.memory.OutOfMemoryError(len(cameras) << 30, 1 << 30)
        return real(images, cameras, trace)

    monkeypatch.setattr(api.model, "_run_once", run_once)
    rng = np.random.default_rng(5)
    samples = [
        Sample(
            rng.integers(0, 256, (3, 224, 224, 3), dtype=np.uint8),
            np.float32([[rng.uniform(0, 360), 25, 0, 0.8, 25]] * 3),
        )
        for _ in range(5)
    ]
    answers = api.predict(samples)
    # 5 and 3 ran out of memory; the halves that ran held every sample once
    assert sizes[0] == 5 and sum(n for n in sizes if n <= 2) == 5 and api.model.max_batch == 2, sizes
    for sample, answer in zip(samples, answers):
        assert "error" not in answer and answer["batch"] == 5, answer
        alone = [
            api.model.backend.to_numpy(a) for a in api.model.run(UINT8_TO_UNIT[sample.images][None], sample.rows[None])
        ]
        for name, want in (("coarse", alone[0][0]), ("refined", alone[1][0])):
            assert_mostly_within(answer[name], want, GPU_ATOL, GPU_MAX_FRACTION, label=name)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_on_a_gpu_batches_in_flight_together_equal_the_same_batches_run_alone(precision):
    """The worker's two halves on CuPy with batches in flight: three launched before any is collected.
    Batches 1 and 3 have float32 views, which the network reads in the staging buffer itself, so batch
    3's upload into batch 1's buffer (the Stager's two slots in turn) must wait for batch 1's network;
    batch 2 has 8-bit views; batch 3 is captured as CUDA graphs (its size seen a second time) while the
    others run. Each equals the same samples run as one batch by ``Reconstructor.run`` from the host,
    within the end-to-end tolerance of tests/test_cupy_backend.py."""
    from xmesh.serve.upload import Sample
    from xmesh.serve.worker import ReconstructAPI

    api = ReconstructAPI.__new__(ReconstructAPI)
    api.model = xmesh.Reconstructor(synthetic_weights(1), backend="cupy", precision=precision)
    rng = np.random.default_rng(11)
    batches = [
        [
            Sample(
                rng.integers(0, 256, (3, 224, 224, 3), dtype=np.uint8),
                np.float32([[rng.uniform(0, 360), 25, 0, 0.8, 25]] * 3),
            )
            for _ in range(size)
        ]
        for size in (3, 2, 3)
    ]
    for sample in batches[0] + batches[2]:
        sample.images = UINT8_TO_UNIT[sample.images]
    launched = [api.launch(samples) for samples in batches]
    answers = [api.collect(job) for job in launched]
    for samples, got in zip(batches, answers):
        views = np.stack([s.images if s.images.dtype == np.float32 else UINT8_TO_UNIT[s.images] for s in samples])
        coarse, refined = (
            api.model.backend.to_numpy(a) for a in api.model.run(views, np.stack([s.rows for s in samples]))
        )
        for b, answer in enumerate(got):
            assert "error" not in answer, answer
            assert answer["batch"] == len(samples) and answer["ms"] > 0
            for name, want in (("coarse", coarse[b]), ("refined", refined[b])):
                assert_mostly_within(answer[name], want, GPU_ATOL, GPU_MAX_FRACTION, label=name)


# ------------------------------------------------------------------------------------------ the page


@browser.needs_chromium
def test_the_page_renders_in_a_browser_and_loads_nothing_from_elsewhere(server, tmp_path):
    with urllib.request.urlopen(server.url + "/", timeout=10) as response:
        html = response.read().decode("utf-8")
    for outside in ("http://", "https://", "//", "@import", "url("):
        assert outside not in html.replace("http://127.0.0.1", ""), outside
    page = tmp_path / "page.html"
    page.write_text(html, encoding="utf-8")
    seen = browser.probe(page)
    assert seen["title"] == "xmesh serve" and seen["text"] > 200
    shot = cv2.imread(str(browser.screenshot(page, tmp_path / "page.png", 1000, 700)))
    assert shot is not None and shot.std() > 5  # something drawn, not a blank window


PAGE_DRIVER = """<script>
window.addEventListener('load', function () {
  var files = %s, transfer = new DataTransfer();
  files.forEach(function (f) {
    var bytes = Uint8Array.from(atob(f[1]), function (c) { return c.charCodeAt(0); });
    transfer.items.add(new File([bytes], f[0], {type: 'image/png'}));
  });
  document.getElementById('images').files = transfer.files;
  document.getElementById('cameras').value = %s;
  document.getElementById('form').requestSubmit();
});
</script>"""


@browser.needs_chromium
def test_the_page_sends_three_photos_and_shows_the_picture_and_the_downloads(server, inputs, tmp_path):
    """A script puts the demo photos and cameras into the page's form and submits it, as a person would;
    the page's own code sends the request and shows the answer."""
    import re

    with urllib.request.urlopen(server.url + "/", timeout=10) as response:
        html = response.read().decode("utf-8")
    paths, rows = inputs["a"]
    files = [[p.name, base64.b64encode(p.read_bytes()).decode("ascii")] for p in paths]
    driver = PAGE_DRIVER % (json.dumps(files), json.dumps(json.dumps(np.asarray(rows, np.float64).tolist())))
    page = tmp_path / "driven.html"  # a file page talking to the server: its origin differs, hence the flag
    page.write_text(
        html.replace("<head>", f'<head><base href="{server.url}/">', 1).replace("</body>", driver + "</body>", 1),
        encoding="utf-8",
    )
    dom = browser.dom_after(page, "--disable-web-security", f"--user-data-dir={tmp_path / 'profile'}", budget_ms=120000)
    status = re.search(r'<div id="status"[^>]*>(.*?)</div>', dom, re.S).group(1)
    assert status.startswith("2466 vertices, 4928 faces; batch of "), status
    assert re.findall(r'download="([^"]+)"', dom) == ["mesh.obj", "mesh.ply", "mesh.glb"]
    picture = re.search(r'id="picture"[^>]*src="data:image/png;base64,([^"]+)"', dom)
    picture = picture or re.search(r'src="data:image/png;base64,([^"]+)"[^>]*id="picture"', dom)
    image = cv2.imdecode(np.frombuffer(base64.b64decode(picture.group(1)), np.uint8), cv2.IMREAD_COLOR)
    assert image is not None and image.shape[1] > 2 * image.shape[0] and image.std() > 10


# ------------------------------------------------------------------------------------------ without a server


@pytest.mark.parametrize("encoding", [".png", ".jpg", "progressive .jpg"])
def test_the_size_of_a_photo_is_read_from_its_header(encoding):
    from xmesh.serve.upload import image_size

    rng = np.random.default_rng(1)
    for height, width in ((1, 1), (37, 411), (300, 200)):
        image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        flags = [cv2.IMWRITE_JPEG_PROGRESSIVE, 1] if encoding.startswith("progressive") else []
        data = cv2.imencode(encoding.split()[-1], image, flags)[1].tobytes()
        assert image_size(data, "images[0]") == (width, height)
        assert cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED).shape[:2] == (height, width)


def test_a_failing_sample_fails_alone_and_out_of_memory_is_503():
    from xmesh.errors import DeviceOutOfMemoryError
    from xmesh.serve.upload import Sample
    from xmesh.serve.worker import ReconstructAPI

    class Model:
        backend = get_backend("numpy")

        def run(self, images, cameras):
            if np.isnan(images).any():
                raise FloatingPointError("simulated: a sample the network cannot run")
            if (cameras[:, 0, 0] < 0).any():
                raise DeviceOutOfMemoryError("simulated")
            return images[:, 0, :2, 0], images[:, 0, :2, 1]

    api = ReconstructAPI.__new__(ReconstructAPI)
    api.model = Model()
    rng = np.random.default_rng(0)
    samples = [Sample(rng.random((3, 224, 224, 3), dtype=np.float32), np.ones((3, 5), np.float32)) for _ in range(3)]
    samples[1].images[0, 0, 0, 0] = np.nan
    answers = api.predict(samples)
    assert [("error" in a) for a in answers] == [False, True, False]
    assert answers[1]["status"] == 500 and answers[0]["batch"] == 1
    np.testing.assert_array_equal(answers[2]["coarse"], samples[2].images[0, :2, 0])
    samples[1].images[0, 0, 0, 0], samples[1].rows[0, 0] = 0.5, -1.0
    assert [a.get("status") for a in api.predict(samples)] == [None, 503, None]
    assert api.predict(samples[::2])[0]["batch"] == 2


def test_a_batch_that_runs_out_of_memory_is_split_and_every_request_answered(model, monkeypatch):
    from xmesh.serve.upload import Sample
    from xmesh.serve.worker import ReconstructAPI

    sizes: list = []

    def run_once(images, cameras, trace):  # memory for at most 2 samples; answers carry each sample's key
        sizes.append(len(cameras))
        if len(cameras) > 2:
            raise MemoryError(f"simulated: {len(cameras)} samples do not fit")
        key = np.asarray(images, np.float32)[:, 0, 0, :1, :]
        return key, key + cameras[:, :1, :3]

    monkeypatch.setattr(model, "_run_once", run_once)
    monkeypatch.setattr(model, "max_batch", None)
    api = ReconstructAPI.__new__(ReconstructAPI)
    api.model = model
    rng = np.random.default_rng(3)
    samples = [
        Sample(rng.integers(0, 256, (3, 224, 224, 3), dtype=np.uint8), rng.random((3, 5)).astype(np.float32))
        for _ in range(5)
    ]
    answers = api.predict(samples)
    assert sizes[0] == 5 and sum(n for n in sizes if n <= 2) == 5 and model.max_batch == 2
    for sample, answer in zip(samples, answers):
        assert answer["batch"] == 5
        np.testing.assert_array_equal(answer["coarse"], UINT8_TO_UNIT[sample.images[0, 0, :1]])


class Gate:
    """A model whose network waits at a gate: ``entered`` holds the batches (their first camera value) in
    the order the network began them; a batch leaves once ``opened`` is set. Its output: each sample's first
    pixels, as a coarse and a refined mesh would be. Views of another size fail it, as they would the network."""

    backend = get_backend("numpy")

    def __init__(self):
        self.entered: list[float] = []
        self.inside, self.opened = threading.Event(), threading.Event()

    def run(self, images, cameras):
        if images.shape[1:] != (3, 224, 224, 3):
            raise ValueError(f"simulated: the network needs (B, 3, 224, 224, 3) views, got {images.shape}")
        self.entered.append(float(cameras[0, 0, 0]))
        self.inside.set()
        assert self.opened.wait(60), "the test never opened the gate"
        return images[:, 0, 0, :4], images[:, 1, 0, :4] + cameras[:, :1, :3]


def gate_api(model):
    from xmesh.serve.worker import ReconstructAPI

    api = ReconstructAPI.__new__(ReconstructAPI)
    api.model = model
    return api


def u8_samples(seed: int, count: int, first_camera: float = 0.0):
    from xmesh.serve.upload import Sample

    rng = np.random.default_rng(seed)
    samples = [
        Sample(rng.integers(0, 256, (3, 224, 224, 3), dtype=np.uint8), rng.random((3, 5)).astype(np.float32))
        for _ in range(count)
    ]
    samples[0].rows[0, 0] = first_camera
    return samples


def test_a_batch_is_launched_while_the_one_before_is_in_the_network():
    """On the CPU the network runs in a thread of its own: launching batch 2 (its views stacked) returns
    while batch 1 is still inside the network, batch 2 runs after batch 1, and each answer is its own
    sample's output."""
    model = Gate()
    api = gate_api(model)
    first, second = u8_samples(1, 3, first_camera=1.0), u8_samples(2, 2, first_camera=2.0)
    launched_first = api.launch(first)
    assert model.inside.wait(60)
    launched_second = api.launch(second)  # returns although batch 1 is held at the gate
    assert model.entered == [1.0] and launched_second.error is None
    model.opened.set()
    answers = api.collect(launched_first) + api.collect(launched_second)
    assert model.entered == [1.0, 2.0]
    for sample, answer, size in zip(first + second, answers, [3, 3, 3, 2, 2]):
        assert answer["batch"] == size
        np.testing.assert_array_equal(answer["coarse"], UINT8_TO_UNIT[sample.images[0, 0, :4]])
        stamps = answer["stamps"]
        assert stamps["start"] <= stamps["end"] and answer["ms"] == (stamps["end"] - stamps["start"]) * 1000.0
    # batch 2 began in the network only after batch 1 had left it
    assert answers[0]["stamps"]["end"] <= answers[3]["stamps"]["start"]


def test_a_bad_sample_launched_beside_good_ones_fails_alone():
    """A sample whose views cannot be stacked with the others stops its batch's launch; the batch then runs
    sample by sample and only that request gets an error."""
    from xmesh.serve.upload import Sample

    model = Gate()
    model.opened.set()
    api = gate_api(model)
    samples = u8_samples(4, 3)
    samples.insert(1, Sample(np.zeros((3, 224, 200, 3), np.uint8), np.ones((3, 5), np.float32)))
    launched = api.launch(samples)
    assert isinstance(launched.error, ValueError)
    answers = api.collect(launched)
    assert [a.get("status") for a in answers] == [None, 500, None, None]
    for sample, answer in zip(samples[::2] + samples[3:], answers[::2] + answers[3:]):
        assert answer["batch"] == 1
        np.testing.assert_array_equal(answer["coarse"], UINT8_TO_UNIT[sample.images[0, 0, :4]])


class LoopAPI:
    """A stand-in API for the worker's loop, its requests' inputs plain numbers: records each launch and
    collect, and puts ``arrivals[(step, first number)]`` into the loop's local queue at that step, as if
    those requests arrived meanwhile. A batch holding request 13 fails when collected."""

    max_batch_size, batch_timeout, request_timeout = 4, 0.0, False

    def __init__(self, loop, arrivals: dict):
        self.loop, self.arrivals, self.events = loop, arrivals, []

    decode_request = batch = unbatch = encode_response = staticmethod(lambda x: x)

    def _step(self, step: str, numbers: list) -> None:
        self.events.append((step, numbers))
        for item in self.arrivals.get((step, numbers[0]), []):
            self.loop._arrived.put(item)

    def launch(self, numbers):
        self._step("launch", list(numbers))
        return list(numbers)

    def collect(self, numbers):
        self._step("collect", numbers)
        if 13 in numbers:
            raise RuntimeError("simulated: the batch failed")
        return [n * 10 for n in numbers]


class Sent(list):
    def send(self, item, consumer_id):
        self.append((consumer_id, item))

    def answers(self) -> dict:
        return {uid: (consumer, answer, status) for consumer, (uid, (answer, status, *_)) in self}


def request(number: int):
    return (number % 2, f"uid-{number}", time.monotonic(), number)


def run_loop(arrivals: dict, first: int):
    """The worker's batch loop over LoopAPI, from request ``first``, until the stop (the sentinel) arrives."""
    import queue

    from litserve.callbacks import CallbackRunner

    from xmesh.serve.batching import PrefetchingBatchLoop

    loop, sent = PrefetchingBatchLoop(), Sent()
    api = LoopAPI(loop, arrivals)
    loop._arrived = queue.Queue()
    loop._arrived.put(request(first))
    worker = threading.Thread(target=loop.run_batched_loop, args=(api, None, sent, CallbackRunner()), daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the loop did not stop at the sentinel"
    return api.events, sent.answers()


def test_the_worker_loop_launches_a_batch_before_it_answers_the_one_before():
    """Requests 2 and 13 arrive while batch [1] is launched: batch [2, 13] is launched before [1] is
    collected (two batches in flight); likewise [4]. With nothing waiting, the batch in flight is answered
    at once. A batch that fails answers each of its requests with the error; the others are answered."""
    from litserve.loops.base import _SENTINEL_VALUE
    from litserve.utils import LitAPIStatus

    events, answers = run_loop(
        {("launch", 1): [request(2), request(13)], ("launch", 2): [request(4)], ("collect", 4): [_SENTINEL_VALUE]},
        first=1,
    )
    assert events == [
        ("launch", [1]),
        ("launch", [2, 13]),
        ("collect", [1]),
        ("launch", [4]),
        ("collect", [2, 13]),
        ("collect", [4]),
    ]
    assert {uid: answers[uid] for uid in ("uid-1", "uid-4")} == {
        "uid-1": (1, 10, LitAPIStatus.OK),
        "uid-4": (0, 40, LitAPIStatus.OK),
    }
    for uid, consumer in (("uid-2", 0), ("uid-13", 1)):
        assert answers[uid][0] == consumer and answers[uid][2] == LitAPIStatus.ERROR
        assert "simulated: the batch failed" in str(pickle.loads(answers[uid][1]))


def test_the_worker_loop_answers_every_request_in_flight_when_it_is_stopped():
    """The stop arrives with requests 2 and 3 while batch [1] is in flight: [2, 3] still runs, and both
    batches are answered before the loop ends."""
    from litserve.loops.base import _SENTINEL_VALUE
    from litserve.utils import LitAPIStatus

    events, answers = run_loop({("launch", 1): [request(2), request(3), _SENTINEL_VALUE]}, first=1)
    assert events == [("launch", [1]), ("launch", [2, 3]), ("collect", [1]), ("collect", [2, 3])]
    assert answers == {f"uid-{n}": (n % 2, n * 10, LitAPIStatus.OK) for n in (1, 2, 3)}


def _answer_first_request(request_queue, transport) -> None:
    """A stand-in worker (spawned): answers the first request with its pixels' sum, to its server process."""
    response_queue_id, uid, _, sample = request_queue.get()
    transport.send((uid, (int(sample.images.sum(dtype=np.int64)), sample.stamps)), consumer_id=response_queue_id)


def test_requests_and_answers_cross_pipe_queues_to_a_spawned_worker_and_back():
    """The server's queues are pipe queues, not a Manager's, and work from a spawned process (as LitServe
    starts workers): a request put as the server process puts it comes back to that process's queue."""
    import asyncio
    import multiprocessing
    from multiprocessing.queues import Queue as PipeQueue

    from xmesh.serve.batching import WorkerQueues
    from xmesh.serve.server import API_PATH, PIPE_BYTES, ServeOptions, build_server, pipe_bytes
    from xmesh.serve.upload import Sample
    from xmesh.serve.worker import ModelSettings

    info = {"weights": {"description": "synthetic weights", "synthetic": True}}
    server = build_server(ModelSettings(synthetic_weights(1)), ServeOptions(), np.zeros((1, 3), np.int64), info)
    manager = server._init_manager(2)
    try:
        queues, transport = server.litapi_request_queues[API_PATH], server._transport
        assert isinstance(queues, WorkerQueues) and len(queues.queues) == 1
        requests = queues.of_worker(0)
        assert isinstance(requests, PipeQueue) and all(isinstance(q, PipeQueue) for q in transport._queues)
        if _pipes_may_grow():  # a request's views fit each pipe whole
            assert all(pipe_bytes(q) >= PIPE_BYTES for q in [requests, *transport._queues])
        worker = multiprocessing.get_context("spawn").Process(target=_answer_first_request, args=(requests, transport))
        worker.start()
        images = np.random.default_rng(5).integers(0, 256, (3, 224, 224, 3), dtype=np.uint8)
        requests.put((1, "uid-1", time.monotonic(), Sample(images, np.ones((3, 5), np.float32))))
        deadline, answer = time.monotonic() + 120, None
        while answer is None and time.monotonic() < deadline:  # LitServe's receive gives None after a second
            answer = asyncio.run(transport.areceive(consumer_id=1, timeout=60))
        uid, (total, stamps) = answer
        worker.join(60)
        assert uid == "uid-1" and total == int(images.sum(dtype=np.int64)) and stamps == {}
        assert worker.exitcode == 0
    finally:
        transport.close()
        manager.shutdown()


def _pipes_may_grow() -> bool:
    from xmesh.serve.server import PIPE_BYTES

    try:
        return os.geteuid() == 0 or int(Path("/proc/sys/fs/pipe-max-size").read_text()) >= PIPE_BYTES
    except (OSError, ValueError):
        return False


@pytest.mark.skipif(not _pipes_may_grow(), reason="this system does not let a pipe grow to 1 MB")
def test_a_pipe_queue_holds_a_request_whole_and_keeps_its_order():
    """pipe_queue's pipe holds a request's views (450 KB) in one piece, and items larger than the pipe
    still cross whole and in order (a reader in another process)."""
    import multiprocessing

    from xmesh.serve.server import PIPE_BYTES, pipe_bytes, pipe_queue

    context = multiprocessing.get_context("spawn")
    queue = pipe_queue(context)
    assert pipe_bytes(queue) >= PIPE_BYTES > 3 * 224 * 224 * 3 and pipe_bytes(context.Queue()) < PIPE_BYTES
    items = [np.full(n, n % 251, np.uint8) for n in (10, 3 * 224 * 224 * 3, 3 * PIPE_BYTES, 7)]
    back = pipe_queue(context)
    echo = context.Process(target=_echo, args=(queue, back, len(items)))
    echo.start()
    for item in items:
        queue.put(item)
    got = [back.get(timeout=60) for _ in items]
    echo.join(60)
    assert echo.exitcode == 0 and [len(g) for g in got] == [len(i) for i in items]
    assert all(np.array_equal(g, i) for g, i in zip(got, items))


def _echo(source, sink, count: int) -> None:
    for _ in range(count):
        sink.put(source.get())


def test_each_server_process_fills_the_workers_queues_in_turn():
    """With several workers each has a request queue; a server process puts its requests into them in turn,
    starting at a worker chosen by its process id, so that the server processes do not all start at one."""
    from xmesh.serve.batching import WorkerQueues

    class Box(list):
        put = list.append

    boxes = [Box() for _ in range(4)]
    queues = WorkerQueues(boxes)
    for n in range(10):
        queues.put(n)
    assert sorted(len(b) for b in boxes) == [2, 2, 3, 3] and sorted(sum(boxes, [])) == list(range(10))
    first = next(i for i, b in enumerate(boxes) if 0 in b)
    assert first == (os.getpid() + 1) % 4 and boxes[(first + 1) % 4][0] == 1
    assert queues.of_worker(2) is boxes[2]


def test_the_http_processes_run_with_the_short_switch_interval(monkeypatch):
    """serve() runs its server, whose HTTP processes fork from it, with SWITCH_INTERVAL_S and gives the
    caller's interval back."""
    from xmesh.serve import server as serve_module

    before = sys.getswitchinterval()
    assert before != serve_module.SWITCH_INTERVAL_S
    seen = []

    class Stub:
        def run(self, **kwargs):
            seen.append(sys.getswitchinterval())

    monkeypatch.setattr(serve_module, "build_server", lambda *args: Stub())
    serve_module.serve(None, serve_module.ServeOptions(), np.zeros((1, 3), np.int64), {})
    assert seen == [serve_module.SWITCH_INTERVAL_S] and sys.getswitchinterval() == before


def test_a_sample_is_shown_without_its_pixels():
    """LitServe formats every request it queues into a debug message, logged or not: a Sample's repr must
    not be NumPy's summary of 150,000 pixels."""
    from xmesh.serve.upload import Sample

    text = repr(Sample(np.zeros((3, 224, 224, 3), np.uint8), np.ones((3, 5), np.float32)))
    assert text == "Sample(images uint8[3, 224, 224, 3])"


def test_reconstruct_remote_names_an_unreachable_server():
    with pytest.raises(ServerError, match="cannot be reached"):
        reconstruct_remote(f"http://127.0.0.1:{free_port()}", [b"x"] * 3, cameras=np.ones((3, 5)))


def test_serve_load_counts_each_batch_once_in_how_busy_the_devices_were():
    """scripts/serve_load.py's device_busy: a batch of b answered requests counts 1/b of its compute time
    for each, so the devices' busy time is the batches' own, over the measured seconds and devices."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("serve_load", ROOT / "scripts" / "serve_load.py")
    serve_load = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(serve_load)
    batches = np.array([4] * 8 + [2] * 2)  # two batches of 4 (50 ms each) and one of 2 (30 ms)
    compute = np.array([50.0] * 8 + [30.0] * 2)
    assert serve_load.device_busy(batches, compute, 1.0, 1) == pytest.approx(13.0)
    assert serve_load.device_busy(batches, compute, 0.5, 2) == pytest.approx(13.0)
    assert serve_load.device_busy(np.array([64] * 64), np.full(64, 990.0), 1.0, 1) == pytest.approx(99.0)
    assert np.isnan(serve_load.device_busy(np.array([]), np.array([]), 1.0, 1))


# ------------------------------------------------------------------------------------------ errors, warnings, GLB


def ask(url: str, method: str, path: str, body: bytes | None = None, headers=None):
    """(status, headers, body) of any request, without raising on 4xx/5xx."""
    connection = http.client.HTTPConnection(url.split("//")[1], timeout=60)
    connection.request(method, path, body=body, headers=headers or {})
    response = connection.getresponse()
    answer = (response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    connection.close()
    return answer


def test_the_frameworks_refusals_and_a_cut_body_answer_the_documented_json(server, inputs):
    paths, rows = inputs["a"]
    body, kind = form(paths, cameras_field(rows))
    cases = {
        "404": (ask(server.url, "GET", "/v1/nosuch"), 404, "path", "/v1/nosuch: no such path"),
        "405": (ask(server.url, "GET", "/v1/reconstruct"), 405, "method", "GET /v1/reconstruct: method not allowed"),
        "405 on info": (ask(server.url, "POST", "/v1/info", b"x"), 405, "method", "POST /v1/info: method not allowed"),
        "415": (
            post(server.url, b"images=a.png", "application/x-www-form-urlencoded"),
            415,
            "body",
            "content type 'application/x-www-form-urlencoded'; expected multipart/form-data",
        ),
        # whole parts but the last, and one cut inside an image: not a fault of the camera fields
        "cut before its end": (post(server.url, body[:-100], kind), 400, "body", "cut short: "),
        "cut in an image": (post(server.url, body[: len(body) // 3], kind), 400, "body", "cut short: "),
    }
    for name, ((status, headers, answer), want, field, start) in cases.items():
        assert status == want and headers["content-type"] == "application/json", (name, status, answer[:200])
        detail = json.loads(answer)
        assert set(detail) == {"error", "field", "status"}, (name, detail)
        assert detail["status"] == want and detail["field"] == field, (name, detail)
        assert detail["error"].startswith(start), (name, detail)
    assert "GET" not in cases["405"][0][1]["allow"] and "POST" in cases["405"][0][1]["allow"]
    cut = json.loads(cases["cut before its end"][0][2])["error"]
    assert f"{len(body) - 100} bytes without the closing" in cut and "send the whole multipart body" in cut
    assert post(server.url, body, kind)[0] == 200  # the same body whole is answered


def wide_photo_on_black(tmp_path) -> Path:
    """A 1920x1080 JPEG of a grey disc on black: nothing like the renderings the network knows."""
    image = np.zeros((1080, 1920, 3), np.uint8)
    cv2.circle(image, (960, 540), 300, (160, 160, 160), -1)
    path = tmp_path / "wide.jpg"
    cv2.imwrite(str(path), image)
    return path


def test_the_warnings_of_xmesh_reconstruct_come_back_in_a_header_the_page_and_the_cli(server, inputs, tmp_path):
    paths, rows = inputs["a"]
    wide = wide_photo_on_black(tmp_path)
    with pytest.warns(UserWarning) as caught:  # what xmesh reconstruct says of these images here
        load_images([wide, *paths[1:]])
    local = [str(w.message) for w in caught]
    assert len(local) == 1 and local[0].startswith(f"view 1 ({wide}): it is 1920x1080, not square")
    status, headers, _ = post(server.url, *form([wide, *paths[1:]], cameras_field(rows)))
    assert status == 200
    served = json.loads(headers["x-xmesh-warnings"])
    assert served == [local[0].replace(f"view 1 ({wide})", "view 1 ('wide.jpg')")]
    status, headers, answer = post(
        server.url, *form([wide, *paths[1:]], cameras_field(rows)), "/v1/reconstruct?format=preview"
    )
    assert status == 200 and json.loads(answer)["warnings"] == served
    status, headers, answer = post(server.url, *form(paths, cameras_field(rows)), "/v1/reconstruct?format=preview")
    assert status == 200 and "x-xmesh-warnings" not in headers and json.loads(answer)["warnings"] == []
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "xmesh",
            "reconstruct",
            str(wide),
            *map(str, paths[1:]),
            "--cameras",
            str(paths[0].parent / "cameras.txt"),
            "--server",
            server.url,
            "--out",
            str(tmp_path / "m.obj"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=child_env(),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0] == f"xmesh reconstruct: warning: {served[0]}"


def test_the_page_says_the_server_runs_synthetic_weights(server):
    import re

    from xmesh.serve.page import page_html

    with urllib.request.urlopen(server.url + "/", timeout=10) as response:
        html = response.read().decode("utf-8")
    said = re.search(r'<p id="weights" class="([a-z]+)">([^<]*)</p>', html)
    assert said.group(1) == "synthetic" and said.group(2).startswith(
        "This server runs synthetic weights (recipe seed 1; random, NOT the trained Pixel2Mesh++ weights)"
    )
    trained = page_html({"weights": {"synthetic": False, "description": "weights from a <b>.npz"}})
    assert '<p id="weights" class="trained">This server runs weights from a &lt;b&gt;.npz.</p>' in trained


def test_the_cli_writes_a_glb_here_and_from_the_server(server, inputs, offline, tmp_path):
    paths, _ = inputs["a"]
    cameras = str(paths[0].parent / "cameras.txt")
    for where, extra in (("here", ["--weights", "synthetic:1"]), ("server", ["--server", server.url])):
        out = tmp_path / f"{where}.glb"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "xmesh",
                "reconstruct",
                *map(str, paths),
                "--cameras",
                cameras,
                "--out",
                str(out),
                *extra,
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=child_env(),
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
        assert done.stderr.startswith(f"wrote {out} (2466 vertices, 4928 faces)"), done.stderr
        vertices, faces = read_glb(out.read_bytes(), str(out))
        np.testing.assert_array_equal(faces, offline["a"].faces)
        assert_mostly_within(vertices, offline["a"].vertices, label=where)  # tests/tolerance.py's golden tolerance


def test_serve_on_a_port_in_use_is_one_line_and_exit_2(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "xmesh", "serve", "--weights", "synthetic:1", "--port", str(port)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=child_env(),
            timeout=120,
        )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr == (
        f"xmesh serve: error: --port {port}: 127.0.0.1:{port} is in use by another program; "
        "choose another --port, or stop what listens there\n"
    )
