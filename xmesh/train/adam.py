"""Adam as TensorFlow 1's ``AdamOptimizer`` applies it, in the variables' own dtype.

Per step t (from 1), with beta powers b1^t and b2^t kept as float32 products of the betas as TF
keeps them: ``alpha = lr * sqrt(1 - b2^t) / (1 - b1^t)``, then for every variable with a gradient
``m += (g - m) (1 - b1)``, ``v += (g^2 - v) (1 - b2)`` and ``var -= m alpha / (sqrt(v) + eps)``,
epsilon outside the square root (the kernel's arithmetic, ``training_ops.cc``). A variable without
a gradient keeps its value and its moments. The original trains with lr 1e-5 and TF's defaults
otherwise: beta1 0.9, beta2 0.999, epsilon 1e-8.

The state is plain arrays (:meth:`AdamState.arrays`), so a checkpoint stores and restores it exactly.
On CuPy a float32 variable's update is one kernel (``_cupy_update``) in the same order of float32
operations, each rounded on its own (no fused multiply-add), so it equals the array-API code's bit for bit;
:mod:`xmesh.train.adam_cupy` makes the same updates of a whole stage in one launch.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from array_api_compat import is_cupy_namespace


@dataclass(frozen=True)
class AdamConfig:
    learning_rate: float = 1e-5
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8


@dataclass
class AdamState:
    """The moments by variable name (``xp`` arrays, created at a variable's first gradient as TF's
    zero slots), the beta powers b1^(t+1) and b2^(t+1) the next step reads, and the steps taken."""

    config: AdamConfig = field(default_factory=AdamConfig)
    m: dict = field(default_factory=dict)
    v: dict = field(default_factory=dict)
    beta1_power: np.float32 = None
    beta2_power: np.float32 = None
    step: int = 0

    def __post_init__(self):
        if self.beta1_power is None:
            self.beta1_power = np.float32(self.config.beta1)
        if self.beta2_power is None:
            self.beta2_power = np.float32(self.config.beta2)

    def arrays(self, to_numpy=np.asarray) -> dict[str, np.ndarray]:
        """Everything as host arrays by key ('m/NAME', 'v/NAME', 'beta1_power', 'beta2_power', 'step',
        and the configuration's 'learning_rate', 'beta1', 'beta2', 'epsilon'); ``to_numpy`` brings a
        moment to the host (a backend's ``to_numpy`` for device arrays)."""
        out = {f"m/{name}": to_numpy(value) for name, value in self.m.items()}
        out.update({f"v/{name}": to_numpy(value) for name, value in self.v.items()})
        out["beta1_power"] = np.asarray(self.beta1_power, dtype=np.float32)
        out["beta2_power"] = np.asarray(self.beta2_power, dtype=np.float32)
        out["step"] = np.asarray(self.step, dtype=np.int64)
        for key in ("learning_rate", "beta1", "beta2", "epsilon"):
            out[key] = np.asarray(getattr(self.config, key), dtype=np.float64)
        return out

    @classmethod
    def from_arrays(cls, arrays: Mapping, asarray=np.asarray) -> AdamState:
        """The state :meth:`arrays` returned; ``asarray`` moves each moment to the training's device."""
        config = AdamConfig(*(float(arrays[key]) for key in ("learning_rate", "beta1", "beta2", "epsilon")))
        return cls(
            config,
            m={key[2:]: asarray(value) for key, value in arrays.items() if key.startswith("m/")},
            v={key[2:]: asarray(value) for key, value in arrays.items() if key.startswith("v/")},
            beta1_power=np.float32(arrays["beta1_power"]),
            beta2_power=np.float32(arrays["beta2_power"]),
            step=int(arrays["step"]),
        )


@functools.cache
def _cupy_update():
    """m, v and the variable updated in place in one launch: the array-API lines of :func:`adam_step`."""
    import cupy

    return cupy.ElementwiseKernel(
        "float32 grad, float32 keep1, float32 keep2, float32 alpha, float32 eps",
        "float32 var, float32 m, float32 v",
        """
        m = __fadd_rn(m, __fmul_rn(__fsub_rn(grad, m), keep1));
        v = __fadd_rn(v, __fmul_rn(__fsub_rn(__fmul_rn(grad, grad), v), keep2));
        var = __fsub_rn(var, __fdiv_rn(__fmul_rn(m, alpha), __fadd_rn(__fsqrt_rn(v), eps)));
        """,
        "xmesh_adam_update",
    )


def step_factor(state: AdamState) -> np.float32:
    """The coming step's ``alpha = lr * sqrt(1 - b2^t) / (1 - b1^t)``, in float32 as TF computes it."""
    c = state.config
    one = np.float32(1)
    return np.float32(np.float32(c.learning_rate) * np.sqrt(one - state.beta2_power) / (one - state.beta1_power))


def ensure_moments(xp, variables: Mapping, names, state: AdamState) -> None:
    """Zero moments (TF's slots) for each of ``names`` that has none yet, shaped as its variable."""
    for name in names:
        if name not in state.m:
            state.m[name] = xp.zeros_like(variables[name])
            state.v[name] = xp.zeros_like(variables[name])


def apply_updates(xp, variables: dict, gradients: Mapping, state: AdamState, alpha) -> None:
    """The moments and every variable of ``variables`` (name -> ``xp`` array) that has a gradient,
    updated in place with the factor ``alpha`` (:func:`step_factor`'s float32, or a 0-d float32 CuPy
    array holding it, which a captured CUDA Graph reads at each replay); the state does not advance."""
    c = state.config
    one = np.float32(1)
    beta1, beta2, eps = (np.float32(x) for x in (c.beta1, c.beta2, c.epsilon))
    for name, grad in gradients.items():
        var = variables[name]
        grad = xp.asarray(grad, dtype=var.dtype)
        ensure_moments(xp, variables, (name,), state)
        m, v = state.m[name], state.v[name]
        if is_cupy_namespace(xp) and var.dtype == xp.float32:
            _cupy_update()(grad, one - beta1, one - beta2, alpha, eps, var, m, v)
            continue
        m += (grad - m) * (one - beta1)
        v += (grad * grad - v) * (one - beta2)
        var -= (m * alpha) / (xp.sqrt(v) + eps)


def advance(state: AdamState) -> None:
    """The beta powers and the step count after a step."""
    c = state.config
    state.beta1_power = np.float32(state.beta1_power * np.float32(c.beta1))
    state.beta2_power = np.float32(state.beta2_power * np.float32(c.beta2))
    state.step += 1


def adam_step(xp, variables: dict, gradients: Mapping, state: AdamState) -> None:
    """One Adam step: every variable of ``variables`` (name -> ``xp`` array) that has a gradient is
    updated in place, and ``state`` advances."""
    apply_updates(xp, variables, gradients, state, step_factor(state))
    advance(state)
