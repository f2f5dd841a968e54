"""The Pixel2Mesh++ network, written once against the backend shim (``xmesh.backends``)."""
