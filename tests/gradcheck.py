"""The one gradient check of every backward pass: float64 central differences, like torch.autograd.gradcheck.

``check_gradients(forward, backward, inputs)`` weights the forward's outputs by a random tensor R,
so that L = sum(out * R), and compares ``backward(R)`` with central differences of L: element by
element for a random subset of each input's elements, and along random directions for the whole
input (a large tensor is checked through its random projections). It runs on NumPy and on CuPy
(pass ``xp``); inputs are float64 arrays of that library.
"""

from __future__ import annotations

import numpy as np


def _as_tuple(value):
    return value if isinstance(value, tuple) else (value,)


def check_gradients(
    forward,
    backward,
    inputs: dict,
    xp=np,
    *,
    eps: float = 1e-6,
    rtol: float = 1e-5,
    elements: int = 24,
    directions: int = 3,
    seed: int = 0,
    wrt=None,
) -> float:
    """Assert that ``backward`` is the gradient of ``forward`` and return the largest relative error.

    ``forward(**inputs)`` returns an array or a tuple of arrays; ``backward(douts)`` takes the output
    gradients (an array or a tuple, as the forward returned) and returns a dict of input gradients
    by name. ``wrt`` names the inputs to check (default: all the dict returns). An error is relative
    to the largest analytic directional derivative of that input, so a zero gradient is checked too.
    """
    rng = np.random.default_rng(seed)
    outs = _as_tuple(forward(**inputs))
    weights = tuple(xp.asarray(rng.standard_normal(o.shape)) for o in outs)

    def loss(values):
        return sum(float(xp.sum(o * r)) for o, r in zip(_as_tuple(forward(**values)), weights, strict=True))

    douts = weights if isinstance(forward(**inputs), tuple) else weights[0]
    grads = backward(douts)
    names = list(grads) if wrt is None else list(wrt)
    worst = 0.0
    for name in names:
        x = inputs[name]
        g = grads[name]
        assert tuple(g.shape) == tuple(x.shape), f"{name}: gradient shape {tuple(g.shape)} != input {tuple(x.shape)}"
        probes = []
        for _ in range(directions):
            d = rng.standard_normal(x.shape)
            probes.append(xp.asarray(d / np.linalg.norm(d)))
        flat_count = int(np.prod(x.shape))
        for index in rng.choice(flat_count, size=min(elements, flat_count), replace=False):
            d = np.zeros(flat_count)
            d[index] = 1.0
            probes.append(xp.asarray(d.reshape(x.shape)))
        analytic = [float(xp.sum(g * d)) for d in probes]
        scale = max(max(abs(a) for a in analytic), 1e-12)
        for d, a in zip(probes, analytic, strict=True):
            plus = loss({**inputs, name: x + eps * d})
            minus = loss({**inputs, name: x - eps * d})
            numeric = (plus - minus) / (2 * eps)
            error = abs(numeric - a) / scale
            worst = max(worst, error)
            assert error <= rtol, (
                f"{name}: analytic {a:.10g}, central difference {numeric:.10g} (error {error:.2e} of {scale:.3g})"
            )
    return worst


def _cuda_present() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def namespaces() -> list:
    """pytest parameters for a test body run on each array library: NumPy, and CuPy where CUDA is."""
    import pytest

    return [
        "numpy",
        pytest.param(
            "cupy", marks=[pytest.mark.gpu, pytest.mark.skipif(not _cuda_present(), reason="needs CUDA and CuPy")]
        ),
    ]


def namespace(name: str):
    """array-api-compat's namespace of ``name`` ("numpy" or "cupy")."""
    if name == "cupy":
        import array_api_compat.cupy as xp
    else:
        import array_api_compat.numpy as xp
    return xp
