"""``xmesh serve``: reconstruction as an HTTP service that batches concurrent requests (LitServe).

``upload`` (a request's fields -> checked network inputs), ``worker`` (the LitServe API: one
Reconstructor per device), ``formats`` (OBJ / PLY / GLB answers, the page's preview), ``routes``
(the HTTP endpoints), ``page`` (``GET /``), ``server`` (assembly, shutdown), ``client`` (the same
request from Python or ``xmesh reconstruct --server``; standard library only). Only ``client`` is
importable without the ``serve`` extra.
"""
