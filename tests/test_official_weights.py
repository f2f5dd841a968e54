"""`xmesh weights add`: the official release checked tensor by tensor against the shipped `.index` files,
from a folder, a zip or a local HTTP server (corrupt tensor, truncated file, interrupted download resumed),
and `weights="official"` resolved from the stored copy.

The official data shards are not available here, so the release is made locally: the synthetic recipe's
arrays under the official names and shapes, written as TensorFlow V2 checkpoints. Their `.index` files
then list exactly the official tensors, shapes, dtypes and places (checked against the shipped ones), with
their own CRC-32Cs: the checks run against those `.index` files (``reference=``), and against the shipped
ones they must fail on every tensor's CRC.
"""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest

from xmesh.errors import ChecksumError, InputError, MissingFileError
from xmesh.io.checkpoint import read_index
from xmesh.io.official_weights import (
    CHECKPOINTS,
    RELEASE_URL,
    SHARD_SUFFIX,
    add_official_weights,
    official_index_folder,
    official_prefixes,
    weights_folder,
)
from xmesh.io.tf_checkpoint_writer import write_checkpoint
from xmesh.io.weight_sources import describe_weights, resolve_weights
from xmesh.io.weights import STAGE_PREFIXES, load_weights, synthetic_weights
from xmesh.reconstruct import ModelSpec

ROOT = Path(__file__).resolve().parents[1]
SHARED_INDEX = ROOT.parent / "shared" / "official_index"
FOLDERS = {CHECKPOINTS[0]: "coarse_mvp2m/models", CHECKPOINTS[1]: "refine_p2mpp/models"}  # the release's layout


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """The release made locally: its folder (the authors' layout), its zip, the `.index` files to check
    against, and the arrays written."""
    root = tmp_path_factory.mktemp("release")
    arrays = synthetic_weights(3)
    folder, reference = root / "results", root / "reference"
    reference.mkdir()
    for stage, name in enumerate(CHECKPOINTS, start=1):
        where = folder / FOLDERS[name]
        where.mkdir(parents=True)
        write_checkpoint(where / name, {k: v for k, v in arrays.items() if k.startswith(STAGE_PREFIXES[stage])})
        shutil.copyfile(where / f"{name}.index", reference / f"{name}.index")
    archive = root / "p2mpp_models.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as out:
        for path in sorted(folder.rglob("*")):
            out.write(path, path.relative_to(root).as_posix())
    return {"folder": folder, "zip": archive, "reference": reference, "arrays": arrays}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


def _handler(body_of, log):
    """Serves ``body_of()``'s bytes at any path, honouring ``Range: bytes=N-``; ``log`` gets each
    request's Range header and the bytes sent; ``log["cut_after"]`` drops the connection once after
    that many bytes of the body."""

    class Handler(http.server.BaseHTTPRequestHandler):
        timeout = 10

        def do_GET(self):
            body = body_of()
            start = 0
            wanted = self.headers.get("Range")
            log["ranges"].append(wanted)
            if wanted and not log.get("no_ranges"):
                start = int(wanted.split("=", 1)[1].split("-", 1)[0])
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(len(body) - start))
            self.end_headers()
            end = len(body)
            cut = log.pop("cut_after", None)
            if cut is not None:
                end = start + cut
            view = memoryview(body)
            for at in range(start, end, 1 << 20):
                self.wfile.write(view[at : min(end, at + (1 << 20))])
            log["sent"].append(end - start)
            if cut is not None:
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True

        def log_message(self, *args):
            pass

    return Handler


@pytest.fixture
def server(release):
    """A local HTTP server on 127.0.0.1 serving the release's zip (``state["body"]`` replaces it); it
    stops when the test ends, and by itself after 60 s."""
    state = {"body": release["zip"].read_bytes(), "ranges": [], "sent": []}
    httpd = _Server(("127.0.0.1", 0), _handler(lambda: state["body"], state))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    watchdog = threading.Timer(60, httpd.shutdown)
    watchdog.start()
    state["url"] = f"http://127.0.0.1:{httpd.server_address[1]}/p2mpp_models.zip"
    yield state
    watchdog.cancel()
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


def _stored_equal(arrays):
    loaded = load_weights(resolve_weights("official"))
    assert sorted(loaded) == sorted(arrays)
    for name, value in arrays.items():
        np.testing.assert_array_equal(loaded[name], value, err_msg=name)  # stored bytes, no arithmetic


def test_shipped_index_files_are_the_official_ones_and_package_data():
    for name in (*[f"{c}.index" for c in CHECKPOINTS], "manifest.json"):
        assert (official_index_folder() / name).read_bytes() == (SHARED_INDEX / name).read_bytes()
    text = (ROOT / "pyproject.toml").read_text()
    assert '"data/official_index/*"' in text  # package data: installed with xmesh


def test_the_local_release_has_the_official_tensors_shapes_and_places(release):
    for name in CHECKPOINTS:
        ours = read_index(release["reference"] / f"{name}.index")
        official = read_index(official_index_folder() / f"{name}.index")
        assert sorted(ours) == sorted(official)
        for key, info in official.items():
            assert (ours[key].shape, ours[key].tf_dtype, ours[key].offset, ours[key].size) == (
                info.shape,
                info.tf_dtype,
                info.offset,
                info.size,
            ), key
        assert all(ours[key].crc != info.crc for key, info in official.items())  # not the official bytes


def test_add_from_folder_then_official_resolves_everywhere(release, cache):
    folder = add_official_weights(release["folder"], reference=release["reference"], progress=False, say=lambda s: None)
    assert folder == weights_folder() == cache / "xmesh" / "weights" / "official"
    files = sorted(f"{c}{s}" for c in CHECKPOINTS for s in (".index", SHARD_SUFFIX))
    assert sorted(p.name for p in folder.iterdir()) == files
    assert official_prefixes() == [str(folder / c) for c in CHECKPOINTS]
    assert resolve_weights(["official"]) == official_prefixes()
    assert "official Pixel2Mesh++ weights" in describe_weights(["official"])
    assert ModelSpec.of(["official"]).weights == "official"  # each worker resolves it in its own cache
    _stored_equal(release["arrays"])
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no staging left


def test_add_from_url_downloads_checks_and_removes_the_zip(release, cache, server):
    lines = []
    add_official_weights(server["url"], reference=release["reference"], progress=False, say=lines.append)
    assert server["ranges"] == [None] and server["sent"] == [release["zip"].stat().st_size]
    assert lines == [
        f"xmesh weights: {c}: {n} tensors match the official index" for c, n in zip(CHECKPOINTS, (165, 72), strict=True)
    ]
    _stored_equal(release["arrays"])
    assert list((cache / "xmesh" / "weights" / "downloads").iterdir()) == []  # one copy: the checked one


def test_interrupted_download_is_resumed_with_a_range_request(release, cache, server):
    size = release["zip"].stat().st_size
    server["cut_after"] = size // 3
    with pytest.raises(InputError, match=rf"stopped at {size // 3} of {size} bytes.*run the same command again"):
        add_official_weights(server["url"], reference=release["reference"], progress=False, say=lambda s: None)
    part = cache / "xmesh" / "weights" / "downloads" / "p2mpp_models.zip.part"
    assert part.stat().st_size == size // 3
    assert not weights_folder().exists() and not (part.parent / "p2mpp_models.zip").exists()
    lines = []
    add_official_weights(server["url"], reference=release["reference"], progress=False, say=lines.append)
    assert server["ranges"] == [None, f"bytes={size // 3}-"]
    assert server["sent"] == [size // 3, size - size // 3]
    assert lines[0].startswith(f"xmesh weights: resuming {server['url']} at {size // 3} of {size} bytes")
    _stored_equal(release["arrays"])
    assert not part.exists()


def test_a_part_is_started_again_where_the_server_ignores_ranges(release, cache, server):
    part = cache / "xmesh" / "weights" / "downloads" / "p2mpp_models.zip.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"not the start of the zip" * 1000)
    server["no_ranges"] = True
    add_official_weights(server["url"], reference=release["reference"], progress=False, say=lambda s: None)
    assert server["sent"] == [release["zip"].stat().st_size]
    _stored_equal(release["arrays"])


def test_a_truncated_zip_is_refused_and_nothing_stored(release, cache, server):
    server["body"] = server["body"][: len(server["body"]) // 2]  # the server's file itself is cut short
    with pytest.raises(InputError, match=r"not a whole zip archive"):
        add_official_weights(server["url"], reference=release["reference"], progress=False, say=lambda s: None)
    assert not weights_folder().exists()
    assert list((cache / "xmesh" / "weights" / "downloads").iterdir()) == []


def test_a_corrupt_tensor_is_named_and_nothing_stored(release, cache, tmp_path):
    corrupt = tmp_path / "corrupt"
    shutil.copytree(release["folder"], corrupt, copy_function=os.symlink)  # links to the good files ...
    name = CHECKPOINTS[1]
    shard = corrupt / FOLDERS[name] / f"{name}{SHARD_SUFFIX}"
    shard.unlink()
    data = bytearray((release["folder"] / FOLDERS[name] / f"{name}{SHARD_SUFFIX}").read_bytes())
    victim = "meshnet/pixel2mesh/graph_drb_blk1_layer_2/localgconv_3_vars/weights_1:0"
    info = read_index(release["reference"] / f"{name}.index")[victim]
    data[info.offset + info.size // 2] ^= 0x40  # ... but one flipped bit in one tensor of stage 2's shard
    shard.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match=rf"1 tensor\(s\) do not match the CRC-32C .*'{victim}'"):
        add_official_weights(corrupt, reference=release["reference"], progress=False, say=lambda s: None)
    assert not weights_folder().exists()
    assert not [p for p in weights_folder().parent.iterdir() if p.name.startswith(".")]  # staging removed


def test_command_checks_against_the_shipped_index_in_one_line(release, tmp_path):
    """The command line checks against the official `.index` files: the locally made release (other bytes)
    is refused on every tensor's CRC, in one line with exit 2, and nothing is stored."""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "xmesh", "weights", "add", str(release["zip"]), "--no-progress"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xmesh weights: error: ")
    assert "165 tensor(s) whose recorded CRC-32C" in lines[0] and "'meshnetmvp2m/cnn/conv2d_1/W:0'" in lines[0]
    assert not (tmp_path / "cache" / "xmesh" / "weights" / "official").exists()


def test_official_weights_never_added_say_where_to_get_them(cache, tmp_path):
    with pytest.raises(MissingFileError) as caught:
        resolve_weights("official")
    message = str(caught.value)
    assert "\n" not in message and RELEASE_URL in message and "xmesh weights add" in message
    env = dict(os.environ, XDG_CACHE_HOME=str(cache), PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "xmesh", "demo", "--weights", "official", "--out", str(tmp_path / "d")]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("xmesh demo: error: the official Pixel2Mesh++ weights are not in")
    assert RELEASE_URL in done.stderr


def test_convert_takes_both_checkpoints_for_one_npz_the_reconstructor_takes(release, tmp_path, capsys):
    from xmesh import Reconstructor
    from xmesh.cli import main

    prefixes = [str(release["folder"] / FOLDERS[name] / name) for name in CHECKPOINTS]
    out = tmp_path / "p2mpp.npz"
    assert main(["convert", *prefixes, str(out)]) == 0
    assert capsys.readouterr().err.strip() == f"wrote {out}: 237 variables from 2 checkpoint(s)"
    model = Reconstructor(weights=str(out))  # both stages from the one file
    assert model.spec.weights == str(out)
    loaded = load_weights(str(out))
    assert sorted(loaded) == sorted(release["arrays"])
    for name, value in release["arrays"].items():
        np.testing.assert_array_equal(loaded[name], value, err_msg=name)
    assert main(["convert", prefixes[1], prefixes[1], str(tmp_path / "twice.npz")]) == 2
    message = capsys.readouterr().err
    assert message.count("\n") == 1 and "variable 'meshnet/cnn/conv2d_1/W:0' is also in" in message
    assert not (tmp_path / "twice.npz").exists()


def test_convert_official_after_weights_add(release, cache, tmp_path, capsys):
    from xmesh.cli import main

    add_official_weights(release["folder"], reference=release["reference"], progress=False, say=lambda s: None)
    out = tmp_path / "official.npz"
    assert main(["convert", "official", str(out)]) == 0
    with np.load(out) as npz:
        assert len(npz.files) == 237
        np.testing.assert_array_equal(npz["meshnet/cnn/conv2d_1/W:0"], release["arrays"]["meshnet/cnn/conv2d_1/W:0"])


def test_an_unwritable_cache_folder_is_one_line(release, tmp_path):
    (tmp_path / "a_file").write_text("not a folder")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "a_file"), PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "xmesh", "weights", "add", str(release["zip"]), "--no-progress"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"xmesh weights: error: {tmp_path / 'a_file'}")
    assert "expected a readable release and a writable cache folder" in done.stderr
