"""The dense matrix products of the training passes: ``matmul(a, b)`` is ``a @ b``, or a faster
product of float32 accuracy where a backend lends one (:func:`lend`).

The CuPy backend lends its tensor-core GEMM in 3xTF32 (each operand split into two TF32 parts, three
products accumulated in float32: float32's accuracy, the inference's fp32 products) for the products
both of whose output sides are at least ``LENT_MIN`` long: the deformation blocks' and graph
convolutions' wide layers, where cuBLAS's float32 SGEMM bounds a training step.

``deformation_layer`` is a deformation block's local graph convolution, ``relu(X W0 + A1 (X W1) + b)``
over the hypothesis axis (or without the ReLU: with ``dZ``, the transposed weights and ``A1^T`` it is the
layer's input gradient), where a backend lends a kernel that does the whole layer
(:func:`lend_layer`): on Hopper, the inference's 3xTF32 layer kernel. None where none is lent or the
lent one does not take these shapes; the caller then takes the products above.

Every other product goes to the one a backend lends for any float product (:func:`lend_general`): on
CuPy, cuBLAS called directly (:mod:`xmesh.backends.cublas_gemm`), which a CUDA Graph can capture
(CuPy's own ``matmul`` refuses stream capture), so the training step on CuPy can be replayed as a
graph; ``a @ b`` where none is lent or it declines (NumPy).

``column_sums`` is a bias's gradient, the sum over the rows of a (rows, C) array: on CuPy a product
with a row of ones (cuBLAS reads the array once), as CuPy's reduction over 10^5 to 10^7 rows into a
few columns runs a block per column and takes up to a hundred times longer.
"""

from __future__ import annotations

from array_api_compat import is_cupy_namespace

LENT_MIN = 128  # a lent product's output is at least this many rows and columns

_lent = None
_lent_layer = None
_lent_general = None


def lend(product):
    """Route the large float32 products through ``product(a, b)`` (2-D a and b; None: take ``a @ b``);
    returns the product lent before."""
    global _lent
    before, _lent = _lent, product
    return before


def lend_general(product):
    """Route the products :func:`lend`'s does not take through ``product(a, b)`` (``a @ b`` with
    broadcast leading axes, or None to decline); returns the one lent before."""
    global _lent_general
    before, _lent_general = _lent_general, product
    return before


def matmul(a, b):
    """``a @ b`` for a (..., M, K) and b (..., K, N) (a 2-D b: the leading axes of a as rows)."""
    if (
        _lent is not None
        and b.ndim == 2
        and a.ndim >= 2
        and str(a.dtype) == "float32"
        and str(b.dtype) == "float32"
        and b.shape[1] >= LENT_MIN
    ):
        rows = 1
        for size in a.shape[:-1]:
            rows *= int(size)
        if rows >= LENT_MIN:
            out = _lent(a.reshape(rows, a.shape[-1]), b)
            if out is not None:
                return out.reshape(tuple(a.shape[:-1]) + (b.shape[1],))
    if _lent_general is not None:
        out = _lent_general(a, b)
        if out is not None:
            return out
    return a @ b


def lend_layer(layer):
    """Route :func:`deformation_layer` through ``layer(x, w0, w1, bias, a1, relu, support_transposed,
    residual)`` (None: no layer kernel); returns the one lent before."""
    global _lent_layer
    before, _lent_layer = _lent_layer, layer
    return before


def deformation_layer(
    x, w0, w1, bias, a1, relu: bool = True, support_transposed: bool = False, residual=None, keep_activation=False
):
    """``act(X W0 + A1 (X W1) + bias) (+ residual)`` for X (B, K, N, cin) over its hypothesis axis K,
    (cin, cout) weights and (K, K) A1 (``A1^T`` when ``support_transposed``: a long-lived A1 is named, so
    that the lent kernel keeps what it builds for it); act is the ReLU or, with ``relu=False``, none;
    ``residual`` (B, K, N, cout) is added last, in the same pass. ``keep_activation``: (that sum, act(...)
    before the residual), both written in the pass. None where no layer kernel is lent or it does not
    take these operands."""
    if _lent_layer is None or str(x.dtype) != "float32" or x.ndim != 4:
        return None
    return _lent_layer(x, w0, w1, bias, a1, relu, support_transposed, residual, keep_activation=keep_activation)


def layer_input_gradient(dz, w0, w1, a1, mask, residual=None, keep: bool = False):
    """A layer's input gradient dX = dZ W0^T + A1^T (dZ W1^T) (+ ``residual``), for dZ (B, K, N, cout), the
    forward's (cin, cout) weights and (K, K) A1, carried on through the ReLU whose output ``mask`` (B, K,
    N, cin) is the layer's input: (dy, sums, dX or None), dy = [dX' | A1^T dX'] over K and sums dX''s sums
    over K (B, N, cin), with dX' = dX where the mask is positive; dX itself with ``keep``. The layer
    before's backward then starts from them. None where no layer kernel is lent or it does not take
    these operands."""
    if _lent_layer is None or str(dz.dtype) != "float32" or dz.ndim != 4:
        return None
    return _lent_layer(dz, w0.T, w1.T, None, a1, False, True, residual, mask=mask, keep=keep)


def column_sums(xp, a):
    """The sum over the rows of a 2-D ``a`` (rows, C) -> (C,)."""
    if is_cupy_namespace(xp):
        return xp.reshape(matmul(xp.ones((1, a.shape[0]), dtype=a.dtype), a), (a.shape[1],))
    return xp.sum(a, axis=0)
