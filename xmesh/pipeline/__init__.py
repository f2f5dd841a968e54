"""The dataset pipeline behind ``xmesh eval`` and ``xmesh reconstruct --list``.

One loop (:func:`xmesh.pipeline.loop.run_batches`) moves whole batches through five stages, each
beside the others rather than after them:

1. ``loading``: worker processes decode the PNGs (kept as uint8), the camera rows and the ground
   truth of the next batches, a few batches ahead;
2. ``staging``: on the GPU, a batch is copied into pinned memory and uploaded on a side stream while
   the previous batch computes; the division by 255 happens on the GPU;
3. the network (``Reconstructor.run``) and the batched metrics (``xmesh.metrics.batch``) are queued
   on the compute stream, and the results come back by one asynchronous copy per batch;
4. the loop queues batch k before it waits for batch k-1's results, so the GPU always has work;
5. ``writing``: a background thread hands predicted meshes to writer processes and appends a
   batch's CSV rows (one write, one fsync) only once its mesh files are on disk.

``timing`` measures each stage, so a run reports what bounds it. ``settings``: what a run does
(:class:`~xmesh.pipeline.settings.RunSettings`); ``executor``: the interface through which a
front-end runs a dataset, and its implementation in this process (the other is the Dask cluster's,
:mod:`xmesh.cluster`).
"""
