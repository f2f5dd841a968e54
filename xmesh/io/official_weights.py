"""The official Pixel2Mesh++ checkpoints, verified once and kept in the cache folder.

The authors publish their trained weights as one zip (a Google Drive folder linked from their
repository's ``data/README.md``) holding ``coarse_mvp2m/models/meshnetmvp2m.ckpt-50.*`` (stage 1)
and ``refine_p2mpp/models/meshnet.ckpt-10.*`` (stage 2), TensorFlow V2 checkpoints. xmesh ships
those checkpoints' ``.index`` files (``xmesh/data/official_index/``: every tensor's name, shape,
place in the data shard and masked CRC-32C), so a copy from anywhere can be checked tensor by
tensor before it is used. :func:`add_official_weights` takes the unpacked release, its zip or a URL,
checks it and stores one verified copy in ``$XDG_CACHE_HOME/xmesh/weights/official`` (else
``~/.cache/xmesh/weights/official``); the folder appears only once its files are whole and checked.
:func:`official_prefixes` names the two stored checkpoints for ``weights="official"``.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import shutil
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO

from xmesh.errors import ChecksumError, InputError, MissingFileError, UnwritableOutputError, XmeshError
from xmesh.io.atomic import os_error_reason
from xmesh.io.checkpoint import TensorInfo, read_index
from xmesh.io.crc32c import crc32c

__all__ = [
    "OFFICIAL",
    "CHECKPOINTS",
    "RELEASE_URL",
    "official_index_folder",
    "weights_folder",
    "official_prefixes",
    "add_official_weights",
    "compare_index",
    "verify_data_shard",
    "download",
]

#: the name that stands for the stored copy: ``weights="official"``, ``--weights official``
OFFICIAL = "official"
#: the official checkpoints' prefixes, stage 1 then stage 2
CHECKPOINTS = ("meshnetmvp2m.ckpt-50", "meshnet.ckpt-10")
#: the one data shard of each official checkpoint
SHARD_SUFFIX = ".data-00000-of-00001"
#: where the authors publish the weights (linked from github.com/walsvid/Pixel2MeshPlusPlus, data/README.md)
RELEASE_URL = "https://drive.google.com/drive/folders/1bLhqXNoBxHh5PTbjoyqMnMtBzHwflL-q"
_CHUNK = 1 << 20
_SHOWN = 3  # mismatching tensors named in a message


def official_index_folder() -> Path:
    """The ``.index`` files of the official checkpoints, shipped inside the package."""
    return Path(__file__).resolve().parent.parent / "data" / "official_index"


def weights_folder() -> Path:
    """Where the verified official checkpoints are kept: ``$XDG_CACHE_HOME/xmesh/weights/official``."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "xmesh" / "weights" / OFFICIAL


def _missing_message(folder: Path) -> str:
    return (
        f"the official Pixel2Mesh++ weights are not in {folder}: download the authors' release (the zip in "
        f"{RELEASE_URL}, linked from github.com/walsvid/Pixel2MeshPlusPlus data/README.md), then run "
        f"'xmesh weights add THE_ZIP' (or its unpacked folder, or a URL you can fetch it from), or pass both "
        f"checkpoints yourself: --weights .../{CHECKPOINTS[0]} .../{CHECKPOINTS[1]}"
    )


def official_prefixes() -> list[str]:
    """The stored official checkpoints' prefixes (stage 1, stage 2); MissingFileError with the
    release's location and the steps when they were never added."""
    folder = weights_folder()
    prefixes = [folder / name for name in CHECKPOINTS]
    if not all(Path(f"{p}.index").is_file() and Path(f"{p}{SHARD_SUFFIX}").is_file() for p in prefixes):
        raise MissingFileError(_missing_message(folder))
    return [str(p) for p in prefixes]


def _progress(total: int | None, desc: str, initial: int = 0, enabled: bool = True):
    """A byte-counting tqdm bar on stderr; silent with ``enabled=False`` or off a terminal."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=sys.stderr,
        disable=True if not enabled else None,
        leave=False,
    )


def _listed(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def compare_index(given: Mapping[str, TensorInfo], reference: Mapping[str, TensorInfo], where: str) -> None:
    """``given`` (a release's ``.index``) must list the reference's tensors with their shapes, dtypes,
    places and CRC-32Cs; ChecksumError naming the first few that differ, and how many."""
    missing = [n for n in reference if n not in given]
    extra = [n for n in given if n not in reference]
    shapes = [n for n in reference if n in given and given[n].shape != reference[n].shape]
    other = [
        n
        for n in reference
        if n in given
        and n not in shapes
        and (given[n].tf_dtype, given[n].offset, given[n].size, given[n].crc)
        != (reference[n].tf_dtype, reference[n].offset, reference[n].size, reference[n].crc)
    ]
    problems = []
    if missing:
        problems.append(f"{len(missing)} official tensor(s) missing: {_listed(missing)}")
    if extra:
        problems.append(f"{len(extra)} tensor(s) the official checkpoint does not have: {_listed(extra)}")
    if shapes:
        n = shapes[0]
        problems.append(
            f"{len(shapes)} tensor(s) of another shape: {_listed(shapes)} (e.g. {n!r} is "
            f"{given[n].shape}, officially {reference[n].shape})"
        )
    if other:
        problems.append(f"{len(other)} tensor(s) whose recorded CRC-32C, dtype or place differ: {_listed(other)}")
    if problems:
        raise ChecksumError(f"{where}: not the official checkpoint: {'; '.join(problems)}")


def verify_data_shard(shard: Path, reference: Mapping[str, TensorInfo], where: str, progress: bool = True) -> None:
    """Check every tensor's bytes in ``shard`` against the CRC-32C its official index records, and the
    shard's size. ChecksumError naming the first few corrupt tensors and how many there are."""
    need = max(info.offset + info.size for info in reference.values())
    size = shard.stat().st_size
    if size != need:
        raise ChecksumError(
            f"{where}: the data shard is {size} bytes, the official one {need}; the file is "
            f"{'truncated' if size < need else 'another checkpoint'}: get the release again"
        )
    corrupt = []
    ordered = sorted(reference.items(), key=lambda item: item[1].offset)
    with open(shard, "rb") as handle, _progress(need, f"checking {shard.name}", enabled=progress) as bar:
        for name, info in ordered:
            handle.seek(info.offset)
            if crc32c(handle.read(info.size)) != info.crc:
                corrupt.append(name)
            bar.update(info.size)
    if corrupt:
        first = reference[corrupt[0]]
        raise ChecksumError(
            f"{where}: {len(corrupt)} tensor(s) do not match the CRC-32C of the official index: {_listed(corrupt)} "
            f"(the first at bytes {first.offset}..{first.offset + first.size}); the copy is corrupt: get the release "
            "again"
        )


def _release_files(source: Path) -> dict[str, Path]:
    """A release folder's files of the two checkpoints (``.index`` and data shard), by file name."""
    wanted = {f"{name}{suffix}" for name in CHECKPOINTS for suffix in (".index", SHARD_SUFFIX)}
    found: dict[str, list[Path]] = {}
    for path in source.rglob("*"):
        if path.name in wanted and path.is_file():
            found.setdefault(path.name, []).append(path)
    _check_found(found, wanted, source)
    return {name: paths[0] for name, paths in found.items()}


def _check_found(found: Mapping[str, list], wanted: set[str], source: Path) -> None:
    absent = sorted(wanted - set(found))
    if absent:
        raise InputError(
            f"{source}: the official release's {', '.join(absent)} not found in it; expected the "
            f"authors' zip or its unpacked folder (coarse_mvp2m/models/{CHECKPOINTS[0]}.* and "
            f"refine_p2mpp/models/{CHECKPOINTS[1]}.*)"
        )
    twice = sorted(name for name, paths in found.items() if len(paths) > 1)
    if twice:
        copies = found[twice[0]]
        raise InputError(
            f"{source}: {twice[0]} is in it {len(copies)} times ({', '.join(map(str, copies))}); "
            "expected one copy of each checkpoint"
        )


def _copy(read: IO[bytes], target: Path, total: int | None, progress: bool) -> None:
    with open(target, "wb") as out, _progress(total, f"copying {target.name}", enabled=progress) as bar:
        while chunk := read.read(_CHUNK):
            out.write(chunk)
            bar.update(len(chunk))
        out.flush()
        os.fsync(out.fileno())


def _unpack(source: Path, staging: Path, progress: bool) -> None:
    """The release's four files (from its folder or its zip) copied into ``staging``."""
    if source.is_dir():
        for name, path in _release_files(source).items():
            with open(path, "rb") as read:
                _copy(read, staging / name, path.stat().st_size, progress)
        return
    wanted = {f"{name}{suffix}" for name in CHECKPOINTS for suffix in (".index", SHARD_SUFFIX)}
    try:
        with zipfile.ZipFile(source) as archive:
            found: dict[str, list] = {}
            for member in archive.infolist():
                base = member.filename.rstrip("/").rsplit("/", 1)[-1]
                if base in wanted and not member.is_dir():
                    found.setdefault(base, []).append(member)
            _check_found({k: [m.filename for m in v] for k, v in found.items()}, wanted, source)
            for name, (member,) in found.items():
                with archive.open(member) as read:
                    _copy(read, staging / name, member.file_size, progress)
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise InputError(
            f"{source}: not a whole zip archive ({exc}); a download cut short or another file: get the release again"
        ) from None


@contextlib.contextmanager
def _staging(folder: Path) -> Iterator[Path]:
    """A fresh folder beside ``folder``, removed unless the body moved it into place."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _replace_folder(staging: Path, folder: Path) -> None:
    """Put ``staging`` at ``folder`` in one rename; a previous copy is moved aside first, then deleted."""
    old = None
    if folder.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old.", dir=folder.parent))
        os.replace(folder, old / folder.name)
    os.replace(staging, folder)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _is_url(source: str) -> bool:
    return urllib.parse.urlsplit(source).scheme in ("http", "https")


def add_official_weights(
    source: str | os.PathLike,
    reference: Path | None = None,
    progress: bool = True,
    say: Callable[[str], None] | None = None,
) -> Path:
    """Check the official release at ``source`` (its unpacked folder, its zip, or an http/https URL of
    the zip) against the official ``.index`` files and store one verified copy in :func:`weights_folder`.

    Every tensor of both checkpoints is checked: the release's own ``.index`` must list the official
    names, shapes, dtypes, places and CRC-32Cs, and the data shard's bytes must match those CRC-32Cs.
    ``reference``: another folder of ``.index`` files to check against (default: the shipped ones).
    A URL is downloaded into the cache's ``downloads/`` folder (resumed from a kept ``.part`` file)
    and removed once checked. Returns the folder of the stored copy. Raises XmeshError subclasses with
    one-line messages."""
    reference = Path(reference) if reference is not None else official_index_folder()
    say = say or (lambda line: print(line, file=sys.stderr))
    folder = weights_folder()
    try:
        return _add(source, reference, folder, progress, say)
    except OSError as exc:
        if isinstance(exc, XmeshError):
            raise
        where = exc.filename or folder
        raise UnwritableOutputError(
            f"{where}: {os_error_reason(exc)}; 'xmesh weights add' reads the release and writes its checked copy "
            f"(about 131 MB) in {folder.parent}: expected a readable release and a writable cache folder with room "
            "(XDG_CACHE_HOME moves it)"
        ) from None


def _add(source: str | os.PathLike, reference: Path, folder: Path, progress: bool, say: Callable[[str], None]) -> Path:
    downloaded = None
    text = os.fspath(source)
    if _is_url(text):
        name = Path(urllib.parse.urlsplit(text).path).name or "p2mpp-release.zip"
        downloaded = download(text, folder.parent / "downloads" / name, progress=progress, say=say)
        path = downloaded
    else:
        path = Path(text)
        if not path.exists():
            raise MissingFileError(
                f"{path}: not found; expected the official release's zip, its unpacked folder "
                "or an http(s) URL of the zip"
            )
    try:
        with _staging(folder) as staging:
            _unpack(path, staging, progress)
            for name in CHECKPOINTS:
                official = read_index(reference / f"{name}.index")
                compare_index(read_index(staging / f"{name}.index"), official, f"{text}: {name}.index")
                verify_data_shard(
                    staging / f"{name}{SHARD_SUFFIX}", official, f"{text}: {name}{SHARD_SUFFIX}", progress
                )
                shutil.copyfile(reference / f"{name}.index", staging / f"{name}.index")
                say(f"xmesh weights: {name}: {len(official)} tensors match the official index")
            _replace_folder(staging, folder)
    finally:
        if downloaded is not None:
            downloaded.unlink(missing_ok=True)
    return folder


def _total_from_range(header: str | None) -> tuple[int | None, int | None]:
    """(start, total) of a ``Content-Range: bytes START-END/TOTAL`` (or ``bytes */TOTAL``) header."""
    match = re.fullmatch(r"bytes\s+(?:(\d+)-\d+|\*)/(\d+|\*)", (header or "").strip())
    if not match:
        return None, None
    start = int(match.group(1)) if match.group(1) is not None else None
    return start, (int(match.group(2)) if match.group(2) != "*" else None)


def download(
    url: str, target: Path, progress: bool = True, say: Callable[[str], None] | None = None, timeout: float = 60.0
) -> Path:
    """Download ``url`` to ``target``. The bytes go to ``TARGET.part`` first, renamed to ``target`` only
    once the server's whole length has arrived; a ``.part`` left by an interrupted run is resumed with
    a Range request (or started again where the server ignores ranges). InputError, with the ``.part``
    kept, when the connection ends early."""
    say = say or (lambda line: print(line, file=sys.stderr))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)  # only the .part is ever resumed: a whole file is never reused unchecked
    part = target.with_name(target.name + ".part")
    have = part.stat().st_size if part.is_file() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        _, total = _total_from_range(exc.headers.get("Content-Range") if exc.headers else None)
        if exc.code == 416 and have and total == have:  # the .part already holds the whole file
            os.replace(part, target)
            return target
        raise InputError(
            f"{url}: the server answered HTTP {exc.code} ({exc.reason}); expected the release's zip"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise InputError(
            f"{url}: cannot download ({reason}); check the address and the network, or download the zip "
            "yourself and give its path"
        ) from None
    with response:
        start, total = _total_from_range(response.headers.get("Content-Range"))
        if have and response.status == 206 and start == have:
            mode = "ab"
            say(f"xmesh weights: resuming {url} at {have} of {total or '?'} bytes")
        else:
            have, mode = 0, "wb"
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
        try:
            with open(part, mode) as out, _progress(total, f"downloading {target.name}", have, progress) as bar:
                while chunk := response.read(_CHUNK):
                    out.write(chunk)
                    have += len(chunk)
                    bar.update(len(chunk))
                out.flush()
                os.fsync(out.fileno())
        except (OSError, http.client.HTTPException) as exc:
            if part.is_file():
                have = part.stat().st_size
            raise InputError(
                f"{url}: the download stopped at {have} of {total or '?'} bytes ({exc}); the part is kept "
                f"in {part}: run the same command again to resume"
            ) from None
    if total is not None and have != total:
        raise InputError(
            f"{url}: the download stopped at {have} of {total} bytes; the part is kept in {part}: run the "
            "same command again to resume"
        )
    os.replace(part, target)
    return target
