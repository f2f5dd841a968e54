"""Panels: RGBA renders put on white, text labels and captions (OpenCV's Hershey font), layout."""

from __future__ import annotations

import cv2
import numpy as np

from xmesh.errors import InputError

TEXT_COLOR = (40, 40, 40)
FONT = cv2.FONT_HERSHEY_SIMPLEX
BACKGROUND = 255


def on_white(rgba) -> np.ndarray:
    """An RGBA uint8 image composited over white -> RGB uint8."""
    image = np.asarray(rgba)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] not in (3, 4):
        raise InputError(f"on_white: image of shape {image.shape} / dtype {image.dtype}; expected (H, W, 3|4) uint8")
    if image.shape[2] == 3:
        return image.copy()
    alpha = image[..., 3:4].astype(np.float64) / 255.0
    rgb = image[..., :3].astype(np.float64) * alpha + BACKGROUND * (1.0 - alpha)
    return np.clip(np.round(rgb), 0, 255).astype(np.uint8)


def font_scale(panel_width: int) -> float:
    """Text size for a panel: 0.45 at 224 pixels, proportional, at least 0.3."""
    return max(0.3, 0.45 * panel_width / 224.0)


def _fitting_scale(text: str, width: int, scale: float) -> float:
    (w, _), _ = cv2.getTextSize(text, FONT, scale, 1)
    margin = 8
    return scale if w <= width - margin or w == 0 else max(0.25, scale * (width - margin) / w)


def put_label(rgb, text: str, where: str = "bottom") -> np.ndarray:
    """A copy of an RGB panel with ``text`` in its top or bottom left corner, shrunk to fit the width."""
    out = np.array(rgb, dtype=np.uint8, copy=True)
    if where not in ("top", "bottom"):
        raise InputError(f"put_label: where={where!r}; expected 'top' or 'bottom'")
    h, w = out.shape[:2]
    scale = _fitting_scale(text, w, font_scale(w))
    (_, th), base = cv2.getTextSize(text, FONT, scale, 1)
    y = th + 4 if where == "top" else h - base - 3
    cv2.putText(out, text, (4, y), FONT, scale, TEXT_COLOR, 1, cv2.LINE_AA)
    return out


def caption(width: int, lines, scale: float = 0.45) -> np.ndarray:
    """A white RGB strip ``width`` pixels wide holding ``lines`` of text, each shrunk to fit."""
    lines = [str(line) for line in lines]
    heights, scales = [], []
    for line in lines:
        s = _fitting_scale(line, width, scale)
        (_, th), base = cv2.getTextSize(line, FONT, s, 1)
        scales.append(s)
        heights.append(th + base + 6)
    strip = np.full((sum(heights) + 6, int(width), 3), BACKGROUND, dtype=np.uint8)
    y = 3
    for line, s, height in zip(lines, scales, heights):
        (_, th), _ = cv2.getTextSize(line, FONT, s, 1)
        cv2.putText(strip, line, (6, y + th + 3), FONT, s, TEXT_COLOR, 1, cv2.LINE_AA)
        y += height
    return strip


def hstack(panels, gap: int = 4) -> np.ndarray:
    """RGB panels of equal height side by side with ``gap`` white pixels between them."""
    panels = [np.asarray(p) for p in panels]
    if not panels or len({p.shape[0] for p in panels}) != 1 or any(p.ndim != 3 or p.shape[2] != 3 for p in panels):
        raise InputError("hstack: expected one or more RGB panels of the same height")
    spacer = np.full((panels[0].shape[0], gap, 3), BACKGROUND, dtype=np.uint8)
    pieces = []
    for index, panel in enumerate(panels):
        if index:
            pieces.append(spacer)
        pieces.append(panel)
    return np.concatenate(pieces, axis=1)


def vstack(parts) -> np.ndarray:
    """RGB images one above the other, narrower ones padded with white on the right."""
    parts = [np.asarray(p) for p in parts]
    width = max(p.shape[1] for p in parts)
    padded = [np.pad(p, ((0, 0), (0, width - p.shape[1]), (0, 0)), constant_values=BACKGROUND) for p in parts]
    return np.concatenate(padded, axis=0)


def framed_border(rgb, color=(200, 200, 205)) -> np.ndarray:
    """A copy of a panel with a one-pixel border, so white panels stay apart on white."""
    out = np.array(rgb, dtype=np.uint8, copy=True)
    out[0, :], out[-1, :], out[:, 0], out[:, -1] = color, color, color, color
    return out
