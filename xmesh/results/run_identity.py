"""What a run's results depend on, recorded in its output folder so that a resume cannot mix runs.

A :class:`RunIdentity` is a set of named values (strings, numbers, booleans, lists of them): for the
network, the weights' and the template's fingerprints and the settings that change its output
(:func:`model_identity`); a training run adds its own. :func:`check_or_record` writes it to
``run.json`` in a new folder, and refuses a folder that holds another run's, in one line naming each
value that differs; with ``overwrite`` the new identity replaces the old one (the caller then clears
the old results). :func:`check_identity` and :func:`record_identity` are its two halves, for a caller
that refuses early and records only once its other checks have passed. Values that only describe
(``about``: which file the weights came from) are kept beside the identity for the message, and never
compared.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import FileFormatError, InputError
from ..io.atomic import atomic_write

RUN_JSON = "run.json"
SHOWN_HEX = 12  # how much of a fingerprint a message shows


@dataclass(frozen=True)
class RunIdentity:
    """Named values (as JSON holds them) that decide a run's results, and descriptions of some of them."""

    fields: tuple[tuple[str, Any], ...]
    about: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, fields: Mapping[str, Any], about: Mapping[str, str] | None = None) -> RunIdentity:
        """An identity of ``fields`` (tuples become lists, as JSON reads them back) and ``about``."""
        plain = json.loads(json.dumps(dict(fields), sort_keys=True))
        return cls(tuple(sorted(plain.items())), tuple(sorted((about or {}).items())))

    def as_json(self) -> dict:
        return {"identity": dict(self.fields), "about": dict(self.about)}

    def differences(self, recorded: RunIdentity) -> list[str]:
        """One phrase per value that differs from ``recorded``'s: "NAME X there, Y now"."""
        ours, theirs = dict(self.fields), dict(recorded.fields)
        about_ours, about_theirs = dict(self.about), dict(recorded.about)
        phrases = []
        for name in sorted(set(ours) | set(theirs)):
            if ours.get(name) != theirs.get(name):
                there = _shown(theirs.get(name, "(not recorded)"), about_theirs.get(name))
                now = _shown(ours.get(name, "(not set)"), about_ours.get(name))
                phrases.append(f"{name} {there} there, {now} now")
        return phrases


def _shown(value: Any, about: str | None) -> str:
    if isinstance(value, str):
        text = value[:SHOWN_HEX] if len(value) == 64 else value  # a fingerprint: its start is enough
    else:
        text = json.dumps(value)
    return f"{text} ({about})" if about else text


def read_identity(folder: str | os.PathLike) -> RunIdentity | None:
    """The identity recorded in ``folder``'s run.json, or None where there is none."""
    path = Path(folder) / RUN_JSON
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return RunIdentity.of(data["identity"], data.get("about"))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FileFormatError(
            f"{path}: not a run record of xmesh ({type(exc).__name__}: {exc}); remove it, or "
            "pass --overwrite to start the folder afresh"
        ) from None


def check_identity(
    folder: str | os.PathLike, identity: RunIdentity, overwrite: bool = False, option: str = "--out"
) -> None:
    """Refuse (InputError, one line) a ``folder`` whose run.json records another identity, unless
    ``overwrite``; ``option`` names the folder as the user gave it. Reads only."""
    recorded = None if overwrite else read_identity(folder)
    differences = identity.differences(recorded) if recorded is not None else []
    if differences:
        raise InputError(
            f"{option} {folder} holds the results of another run ({RUN_JSON}): "
            f"{'; '.join(differences)}; resume it with the same settings, pass --overwrite to "
            f"start afresh, or choose another {option}"
        )


def record_identity(folder: str | os.PathLike, identity: RunIdentity) -> None:
    """Write ``identity`` to ``folder``/run.json (the folder made if needed), atomically."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    with atomic_write(Path(folder) / RUN_JSON, "w") as handle:
        json.dump(identity.as_json(), handle, indent=1, sort_keys=True)
        handle.write("\n")


def check_or_record(
    folder: str | os.PathLike, identity: RunIdentity, overwrite: bool = False, option: str = "--out"
) -> None:
    """:func:`check_identity`, then :func:`record_identity`: a new folder (or ``overwrite``) takes
    ``identity``; one holding the same is resumed; one holding another is refused."""
    check_identity(folder, identity, overwrite, option)
    record_identity(folder, identity)


def model_identity(
    weights: Mapping | str,
    template=None,
    backend: str = "numpy",
    precision: str = "fp32",
    views: Sequence[int] = (0, 6, 7),
    view_quirk: bool = True,
    weights_about: str | None = None,
    template_about: str | None = None,
) -> RunIdentity:
    """The identity of the network's outputs: ``weights`` as :func:`~xmesh.io.weights.load_weights`
    returns them (or their :func:`~xmesh.io.weights.weights_fingerprint`), ``template`` None (the
    built-in ellipsoid), a path or a Template, and the settings."""
    from ..io.template import Template, load_template, template_fingerprint
    from ..io.weights import weights_fingerprint
    from ..template_gen import generate_template

    if template is None:
        mesh, template_about = generate_template(), template_about or "built-in ellipsoid"
    elif isinstance(template, Template):
        mesh = template
    else:
        mesh, template_about = load_template(template), template_about or os.fspath(template)
    fingerprint = weights if isinstance(weights, str) else weights_fingerprint(weights)
    fields = {
        "weights": fingerprint,
        "template": template_fingerprint(mesh),
        "backend": backend,
        "precision": precision,
        "views": [int(v) for v in views],
        "view_quirk": bool(view_quirk),
    }
    about = {name: text for name, text in (("weights", weights_about), ("template", template_about)) if text}
    return RunIdentity.of(fields, about)
