"""Imported only in the loaders' forkserver (the preload list of :func:`xmesh.pipeline.loading.make_pool`).

The forkserver ends when the process that started it has gone; this module makes it end there
without the interpreter's clean-up, which with NumPy and numba loaded took a tenth of a second or
more, while a caller reading the command's output (it holds the same stdout and stderr) waited. It
writes nothing and holds no file of ours, and its children, the loaders, end on their own.
"""

import atexit
import os

atexit.register(os._exit, 0)  # atexit runs the last one registered first, before the clean-up
