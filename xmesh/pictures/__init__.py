"""Pictures xmesh writes for people: labelled panels on white, framed mesh views, the demo's picture.

``panels``: compositing, labels, captions and layout (OpenCV text, no plotting library);
``views``: one panel of a mesh, a point set or an input image, framed to fit (or from the camera),
and a mesh file's three views (``xmesh render``);
``demo``: the demo's picture, the input views beside the coarse and refined meshes.
"""
