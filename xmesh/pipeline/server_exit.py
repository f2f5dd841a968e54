"""Imported only in a forkserver: the loaders' (the preload list of :func:`xmesh.pipeline.loading.make_pool`)
and the one a local cluster's workers are forked from (:mod:`xmesh.cluster.forkserver`).

The forkserver ends when the process that started it has gone; this module makes it end there
without the interpreter's clean-up, which with NumPy and numba loaded took a tenth of a second or
more, while a caller reading the command's output (it holds the same stdout and stderr) waited. It
writes nothing and holds no file of ours, and its children (loaders, workers) end on their own;
they end with ``os._exit`` as every forkserver child does, so this registration does not reach them.
"""
import atexit
import os

atexit.register(os._exit, 0)   # atexit runs the last one registered first, before the clean-up
