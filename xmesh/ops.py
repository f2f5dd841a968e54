"""The fast paths: the operations a backend may run with its own kernels instead of the model's code.

The model (``xmesh/model``) is written once against the array API. At ten places it first offers the
work to the backend through one of the methods of :class:`FastPaths`, which every backend inherits:
the method returns the result, or None where the backend has no kernel for these arguments, and the
model then runs its own array-API code, the op's reference implementation (:data:`REFERENCES`). A
fast path must compute the same function as its reference (to float32 rounding; tests compare them).

Adding one: declare it here with its reference, call it from that reference, override it in the
backend, and add its row to the GPU's routing table (``xmesh/backends/plan.py``).
"""

from __future__ import annotations

#: op -> the model function that is its reference implementation (module path, function name); the
#: reference takes ``backend`` first, then the op's arguments.
REFERENCES = {
    "graph_projection": ("xmesh.model.projection", "graph_projection"),
    "local_projection": ("xmesh.model.projection", "local_projection"),
    "graph_conv": ("xmesh.model.graph", "graph_conv"),
    "unpool": ("xmesh.model.graph", "unpool"),
    "local_gconv": ("xmesh.model.deformation", "local_gconv"),
    "drb_block_tail": ("xmesh.model.deformation", "block_tail"),
    "drb_block_layers": ("xmesh.model.deformation", "block_tail"),  # its five wide layers
    "drb_last_layer_score": ("xmesh.model.deformation", "last_layer_and_score"),
    "score_update": ("xmesh.model.deformation", "score_update"),
    "hypothesis_update": ("xmesh.model.deformation", "hypothesis_update"),
}


class FastPaths:
    """The fast-path interface. Each ``op_<name>`` returns None here (no kernel: the model's reference
    runs); a backend overrides those it has kernels for, with the same parameters."""

    def op_graph_projection(self, coords, maps, tf, view_quirk=True, carried=None, map_views=None):
        """Stage 1's projection, coords (B,N,3) -> (B,N,3+3*sum(C)) pooled features followed by
        ``carried``'s columns; ``map_views``: views per sample in ``maps``, which the model has checked
        (projection.stage1_map_views)."""
        return None

    def op_local_projection(self, points, maps, tf):
        """Stage 2's projection of the hypothesis points (B,N,3) on the padded maps -> (B,N,3+3*sum(C))."""
        return None

    def op_graph_conv(self, layer, x, supports, residual=None, pool_idx=None):
        """A stage-1 graph convolution, with the residual averaging and the deferred unpooling."""
        return None

    def op_unpool(self, x, pool_idx):
        """x (B,N,C) followed by the midpoints of ``pool_idx``'s edges."""
        return None

    def op_local_gconv(self, layer, x, cheb1, cheb0=None, residual=None):
        """relu(A_0 X W0 + A_1 X W1 + b) (+ residual) over the hypothesis axis of x (B,K,N,cin)."""
        return None

    def op_drb_block_tail(self, layers, x, cheb1, cheb0, centers, offsets):
        """A deformation block's six layers and vertex update, projected features -> moved centers."""
        return None

    def op_drb_block_layers(self, layers, x, cheb1, cheb0=None):
        """A deformation block's five wide layers, projected features x -> x5."""
        return None

    def op_drb_last_layer_score(self, layer, score, x, residual, cheb1, cheb0, centers, offsets):
        """A block's last wide layer x5 = lc5(x4) + x3, its score layer and the vertex update."""
        return None

    def op_score_update(self, layer, x, cheb1, cheb0, centers, offsets):
        """A block's score layer (x -> scores (B,K,N)) and the vertex update."""
        return None

    def op_hypothesis_update(self, centers, score, offsets):
        """centers (B,N,3) + sum_k softmax_k(score (B,K,N)) offsets[k]."""
        return None


class ReferenceOnly(FastPaths):
    """A backend with every fast path off: the model's reference code on its arrays (for comparing a
    backend's kernels with it). Everything but the fast paths is the wrapped backend's."""

    def __init__(self, backend):
        self.backend = backend

    def __getattr__(self, name):
        return getattr(self.backend, name)
