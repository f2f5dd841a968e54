"""Crafted malicious pickles: the template loader and the ground-truth loader refuse them unrun.

Each payload, unpickled with plain :mod:`pickle`, would create a marker file in ``tmp_path`` (the
controls below prove that it does). Through ``xmesh.io.template.load_template``,
``xmesh.io.safe_pickle.load`` and ``xmesh render --points`` it must raise ``UnsafePickleError``
naming the file, and the marker must not exist afterwards.
"""

from __future__ import annotations

import builtins
import copyreg
import os
import pickle
import subprocess
from pathlib import Path

import numpy as np
import pytest

from xmesh.cli import main
from xmesh.errors import UnsafePickleError
from xmesh.io import safe_pickle
from xmesh.io.template import load_template, template_to_dict

PROTOCOLS = range(pickle.HIGHEST_PROTOCOL + 1)


# ------------------------------------------------------------------------------------ payloads


class OsSystem:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch '{self.marker}'",)


class BuiltinOpen:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return builtins.open, (self.marker, "w")


class SubprocessCall:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return subprocess.call, (["touch", self.marker],)


class SubprocessPopen(SubprocessCall):
    def __reduce__(self):
        return subprocess.Popen, (["touch", self.marker],)


class BuiltinExec(SubprocessCall):
    def __reduce__(self):
        return builtins.exec, (f"open({self.marker!r}, 'w').close()",)


class BuiltinEval(SubprocessCall):
    def __reduce__(self):
        return builtins.eval, (f"open({self.marker!r}, 'w')",)


class NumpyRunstring(SubprocessCall):
    """A gadget inside NumPy itself: ``numpy.testing._private.utils.runstring`` is ``exec``."""

    def __reduce__(self):
        from numpy.testing._private.utils import runstring

        return runstring, (f"open({self.marker!r}, 'w').close()", {})


PAYLOADS = {
    "os.system": OsSystem,
    "builtins.open": BuiltinOpen,
    "subprocess.call": SubprocessCall,
    "subprocess.Popen": SubprocessPopen,
    "builtins.exec": BuiltinExec,
    "builtins.eval": BuiltinEval,
    "numpy runstring": NumpyRunstring,
}


def raw_payloads(marker: Path) -> dict[str, bytes]:
    """Hand-written pickles for opcodes and tricks ``pickle.dumps`` does not produce by itself."""
    m = str(marker).encode()
    touch = b"touch '" + m + b"'"
    return {
        # protocol 0 INST opcode: module and name on the line, the call right away
        "INST posix.system": b"(S'" + touch + b"'\niposix\nsystem\n.",
        # protocol 1 OBJ opcode
        "OBJ os.system": b"(cos\nsystem\nS'" + touch + b"'\no.",
        # copyreg._reconstructor: the protocol-0/1 way to build instances, asked to build anything
        "copyreg._reconstructor": b"ccopyreg\n_reconstructor\n(cposix\nsystem\nc__builtin__\nobject\nS'"
        + touch
        + b"'\ntR.",
        "copy_reg._reconstructor": b"ccopy_reg\n_reconstructor\n(c__builtin__\nobject\nc__builtin__\nobject\nNtR.",
        # protocol 2 NEWOBJ on a class reached through a global
        "NEWOBJ subprocess.Popen": b"\x80\x02csubprocess\nPopen\n]q\x00(X\x05\x00\x00\x00touchX"
        + len(m).to_bytes(4, "little")
        + m
        + b"e\x85\x81.",
        # protocol 4 STACK_GLOBAL, the form pickle.dumps uses from protocol 4 on
        "STACK_GLOBAL posix.system": b"\x80\x04\x8c\x05posix\x8c\x06system\x93X"
        + len(touch).to_bytes(4, "little")
        + touch
        + b"\x85R.",
        # BUILD on an allowed object: __setstate__ must not become a way in
        "BUILD with a global state": b"\x80\x02}q\x00cposix\nsystem\nX"
        + len(touch).to_bytes(4, "little")
        + touch
        + b"\x85Rb.",
        # an object-dtype NumPy array, via numpy.ndarray called directly (no numpy.dtype global involved)
        "numpy.ndarray object dtype": b"\x80\x02cnumpy\nndarray\nK\x02\x85X\x01\x00\x00\x00O\x86R.",
        # numpy.frombuffer / numpy.load: real NumPy functions, but not array rebuilders
        "numpy.load": b"\x80\x02cnumpy\nload\nX" + len(m).to_bytes(4, "little") + m + b"\x85R.",
        "numpy.frombuffer": b"\x80\x02cnumpy\nfrombuffer\nC\x08xxxxxxxxX\x01\x00\x00\x00O\x86R.",
        # a text codec that is not text: _codecs.encode is allowed only for latin-1/utf-8
        "_codecs.encode zlib": b"\x80\x02c_codecs\nencode\nX\x03\x00\x00\x00abcX\x04\x00\x00\x00zlib\x86R.",
        "_codecs.encode unknown codec": b"\x80\x02c_codecs\nencode\nX\x03\x00\x00\x00abcX\x04\x00\x00\x00nope\x86R.",
        # persistent ids are refused
        "persistent id": b"\x80\x02X\x03\x00\x00\x00abcQ.",
    }


RAW_WHAT = {
    "INST posix.system": "posix.system",
    "OBJ os.system": "os.system",
    "copyreg._reconstructor": "copyreg._reconstructor",
    "copy_reg._reconstructor": "copy_reg._reconstructor",
    "NEWOBJ subprocess.Popen": "subprocess.Popen",
    "STACK_GLOBAL posix.system": "posix.system",
    "BUILD with a global state": "posix.system",
    "numpy.ndarray object dtype": "object dtype",
    "numpy.load": "numpy.load",
    "numpy.frombuffer": "numpy.frombuffer",
    "_codecs.encode zlib": "zlib",
    "_codecs.encode unknown codec": "'nope'",
    "persistent id": "persistent object",
}


# ------------------------------------------------------------------------------------ controls


@pytest.mark.parametrize("name", ["os.system", "builtins.open", "subprocess.call"])
def test_payloads_are_real(name, tmp_path):
    """Control: plain pickle runs these payloads, so their refusal below means something."""
    marker = tmp_path / "marker"
    result = pickle.loads(pickle.dumps(PAYLOADS[name](marker), protocol=2))
    if hasattr(result, "close"):
        result.close()
    assert marker.exists()


def test_raw_payload_is_real(tmp_path):
    marker = tmp_path / "marker"
    pickle.loads(raw_payloads(marker)["STACK_GLOBAL posix.system"])
    assert marker.exists()


# ------------------------------------------------------------------------------------ refusals


def _refused(loader, path: Path, marker: Path, what: str) -> None:
    with pytest.raises(UnsafePickleError) as info:
        loader(path)
    message = str(info.value)
    assert str(path) in message, message
    assert what in message, message
    assert "nothing in it was run" in message or "refused" in message, message
    assert not marker.exists(), "the payload ran"


LOADERS = {"template": load_template, "ground_truth": lambda p: safe_pickle.load(p, what="ground-truth points")}


def _callable_name(name: str) -> str:
    """The last part of the global the payload asks for (its module differs by protocol and platform)."""
    return name.split(".")[-1].split(" ")[-1]


@pytest.mark.parametrize("loader", sorted(LOADERS))
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_reduce_payload_refused(name, protocol, loader, tmp_path):
    marker = tmp_path / "marker"
    path = tmp_path / "evil.dat"
    path.write_bytes(pickle.dumps(PAYLOADS[name](marker), protocol=protocol))
    _refused(LOADERS[loader], path, marker, _callable_name(name) + "'")


@pytest.mark.parametrize("loader", sorted(LOADERS))
@pytest.mark.parametrize("name", sorted(RAW_WHAT))
def test_raw_payload_refused(name, loader, tmp_path):
    marker = tmp_path / "marker"
    path = tmp_path / "evil.dat"
    path.write_bytes(raw_payloads(marker)[name])
    _refused(LOADERS[loader], path, marker, RAW_WHAT[name])


def test_extension_registry_refused(tmp_path, monkeypatch):
    """EXT1 opcodes look the global up in copyreg's registry; that lookup goes through find_class too."""
    code = 0xF0
    monkeypatch.setitem(copyreg._inverted_registry, code, ("posix", "system"))
    marker = tmp_path / "marker"
    path = tmp_path / "evil.dat"
    touch = f"touch '{marker}'".encode()
    path.write_bytes(b"\x80\x02\x82" + bytes([code]) + b"X" + len(touch).to_bytes(4, "little") + touch + b"\x85R.")
    for loader in LOADERS.values():
        _refused(loader, path, marker, "posix.system")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_object_dtype_array_refused(protocol, tmp_path):
    marker = tmp_path / "marker"
    path = tmp_path / "objects.dat"
    path.write_bytes(pickle.dumps(np.array([1, "two", None], dtype=object), protocol=protocol))
    for loader in LOADERS.values():
        _refused(loader, path, marker, "object dtype")


@pytest.fixture(scope="module")
def template_data(golden_dir):
    return safe_pickle.load(golden_dir / "template.dat")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_clean_template_loads_at_every_protocol(protocol, template_data, tmp_path):
    """Control: the same dict without a payload loads at every protocol, arrays intact."""
    path = tmp_path / "clean.dat"
    path.write_bytes(pickle.dumps(template_data, protocol=protocol))
    template = load_template(path)
    assert template.num_vertices == (156, 618, 2466)
    np.testing.assert_array_equal(template.coord, template_data["coord"])
    again = template_to_dict(template)
    np.testing.assert_array_equal(again["pool_idx"][1], template_data["pool_idx"][1])
    np.testing.assert_array_equal(again["sample_cheb_dense"][1], template_data["sample_cheb_dense"][1])


NESTED_SPOTS = ("extra_key", "coord", "stage2_values", "pool_list", "cheb_list")


def _nest(data: dict, spot: str, payload) -> dict:
    bad = dict(data)
    if spot == "extra_key":
        bad["comment"] = payload
    elif spot == "coord":
        bad["coord"] = payload
    elif spot == "stage2_values":
        coords, _, shape = data["stage2"][1]
        bad["stage2"] = [data["stage2"][0], (coords, payload, shape)]
    elif spot == "pool_list":
        bad["pool_idx"] = [data["pool_idx"][0], [data["pool_idx"][1], payload]]
    else:
        bad["sample_cheb_dense"] = [data["sample_cheb_dense"][0], {"x": [payload]}]
    return bad


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("spot", NESTED_SPOTS)
@pytest.mark.parametrize("name", ["os.system", "builtins.open", "subprocess.Popen"])
def test_payload_nested_in_valid_template(name, spot, protocol, template_data, tmp_path):
    marker = tmp_path / "marker"
    path = tmp_path / "iccv_p2mpp.dat"
    path.write_bytes(pickle.dumps(_nest(template_data, spot, PAYLOADS[name](marker)), protocol=protocol))
    _refused(load_template, path, marker, _callable_name(name) + "'")


@pytest.mark.parametrize("protocol", [0, 2, 5])
def test_object_array_nested_in_valid_template(protocol, template_data, tmp_path):
    marker = tmp_path / "marker"
    path = tmp_path / "iccv_p2mpp.dat"
    bad = dict(template_data, sample_coord=np.array([[0.0, 0.0, 0.0]] * 43, dtype=object))
    path.write_bytes(pickle.dumps(bad, protocol=protocol))
    _refused(load_template, path, marker, "object dtype")


def test_ground_truth_tuple_with_payload(tmp_path):
    """A ground-truth file as the original writes it, (image, points), with a payload as the image."""
    marker = tmp_path / "marker"
    path = tmp_path / "gt.dat"
    points = np.random.default_rng(0).standard_normal((100, 6)).astype(np.float32)
    path.write_bytes(pickle.dumps((OsSystem(marker), points), protocol=2))
    _refused(LOADERS["ground_truth"], path, marker, "system")
    path.write_bytes(pickle.dumps((np.zeros((4, 4, 3), np.uint8), points), protocol=2))  # control
    image, got = safe_pickle.load(path)
    np.testing.assert_array_equal(got, points)


@pytest.mark.parametrize("name", ["os.system", "subprocess.call"])
def test_render_points_payload_refused_by_cli(name, demo_dir, tmp_path, capsys):
    marker = tmp_path / "marker"
    path = tmp_path / "gt.dat"
    path.write_bytes(pickle.dumps((np.zeros(3), PAYLOADS[name](marker)), protocol=2))
    rc = main(
        [
            "render",
            str(demo_dir / "predict.obj"),
            "--cameras",
            str(demo_dir / "cameras.txt"),
            "--out",
            str(tmp_path / "r.png"),
            "--points",
            str(path),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert f"xmesh render: error: {path}: the pickle asks for" in err
    assert not marker.exists() and not (tmp_path / "r.png").exists()


def test_reconstruct_template_payload_refused_by_cli(demo_dir, tmp_path, capsys, template_data):
    marker = tmp_path / "marker"
    path = tmp_path / "iccv_p2mpp.dat"
    path.write_bytes(pickle.dumps(_nest(template_data, "extra_key", OsSystem(marker)), protocol=2))
    rc = main(
        [
            "reconstruct",
            *(str(demo_dir / f"plane{i}.png") for i in (1, 2, 3)),
            "--cameras",
            str(demo_dir / "cameras.txt"),
            "--out",
            str(tmp_path / "m.obj"),
            "--weights",
            "/nonexistent.npz",
            "--template",
            str(path),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert f"xmesh reconstruct: error: {path}: the pickle asks for '{os.system.__module__}.system'" in err
    assert not marker.exists() and not (tmp_path / "m.obj").exists()
