"""Your own photos: posed photos (COLMAP, or camera-to-world matrices) -> the network's cameras and views.

``intrinsics``: pinhole and distortion models; ``colmap``: the text sparse model, read and written;
``frame``: object sphere, up direction and the network's world frame; ``posed``: one posed photo
(:class:`PhotoView`); ``prepare``: photos resampled into the network's views on white; ``views``:
the conversion to camera rows (:class:`PhotoCameras`); ``sources``: :func:`from_colmap` and
:func:`from_poses`. Public entry point: :mod:`xmesh.cameras`.
"""
