"""The HTTP side of ``xmesh serve`` (FastAPI, in LitServe's server processes): ``GET /``, ``GET /v1/info``
and ``POST /v1/reconstruct``.

A reconstruction request is admitted only while fewer than ``max_queue`` are in the server (503 with
Retry-After otherwise, counted across all server processes); its body is read with a size limit and
a time limit per chunk and one for the whole body (a slow, trickling or vanished client costs one
connection for a bounded time, nothing else), parsed, checked and prepared (:mod:`xmesh.serve.upload`,
its images decoded in threads) and only then handed to LitServe's queue. Every refusal is a JSON
body ``{"error", "field", "status"}``. An answer's ``Server-Timing`` header gives the milliseconds of
each step (:data:`PHASES`), from ``time.monotonic()`` stamps taken in the HTTP process and the worker
(one clock for all processes of a machine).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from python_multipart.multipart import parse_options_header
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect

from xmesh.mesh import Mesh
from xmesh.serve.client import WARNINGS_HEADER
from xmesh.serve.formats import MEDIA_TYPES, QUICK_FORMATS, answer, choose_format
from xmesh.serve.page import page_html
from xmesh.serve.upload import Sample, UploadError, prepare

BATCH_HEADER = "X-Xmesh-Batch-Size"
SERVER_MS_HEADER = "X-Xmesh-Server-Ms"
COMPUTE_MS_HEADER = "X-Xmesh-Compute-Ms"
TIMING_HEADER = "Server-Timing"
# (name, from stamp, to stamp, what it is) of each step of an answered request
PHASES = (
    ("read", "arrived", "read", "the body read and its multipart fields parsed"),
    ("decode", "read", "prepared", "the images decoded and the fields checked"),
    ("queue", "prepared", "received", "to the worker through the request queue"),
    (
        "wait",
        "received",
        "start",
        "in the worker until its batch begins on the device: the batch "
        "gathered, its views stacked and uploaded, the batch before it done",
    ),
    ("compute", "start", "end", "the batch on the device: its network and the results' copy back"),
    ("back", "end", "answered", "the answer back to the HTTP process, from its results on the host"),
    ("format", "answered", "formatted", "the mesh written as the answer's file"),
    ("total", "arrived", "formatted", "all of it: X-Xmesh-Server-Ms"),
)
FIELDS = ("images", "cameras", "poses")
ROUTES_SERVED = "the server answers GET / (a page), GET /v1/info, GET /health and POST /v1/reconstruct"
MAX_PARTS = 16
RETRY_AFTER_S = 1


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int
    read_timeout_s: float  # the longest pause between two chunks of a body
    max_queue: int
    body_timeout_s: float  # the longest a whole body may take to arrive


class Admission:
    """How many reconstruction requests are in the server, shared by its processes (created before they
    fork): ``enter`` admits one unless ``limit`` are in already."""

    def __init__(self, limit: int):
        self.limit = limit
        self.count = multiprocessing.Value("i", 0)

    def enter(self) -> bool:
        with self.count.get_lock():
            if self.count.value >= self.limit:
                return False
            self.count.value += 1
            return True

    def leave(self) -> None:
        with self.count.get_lock():
            self.count.value -= 1


def server_timing(stamps: dict[str, float]) -> str:
    """The Server-Timing header of ``PHASES`` from their stamps (seconds)."""
    return ", ".join(f"{name};dur={(stamps[end] - stamps[begin]) * 1000.0:.3f}" for name, begin, end, _ in PHASES)


def parse_server_timing(header: str) -> dict[str, float]:
    """{name: ms} of a Server-Timing header ("read;dur=0.412, decode;dur=1.200, ..."), in its order."""
    steps = {}
    for item in header.split(","):
        name, _, duration = item.strip().partition(";dur=")
        if duration:
            steps[name] = float(duration)
    return steps


def refusal(field: str | None, message: str, status: int, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "field": field, "status": status}, status_code=status, headers=headers)


def _too_large(size: str, limits: Limits) -> UploadError:
    return UploadError(
        "body",
        f"{size}over the {limits.max_body_bytes // 2**20} MiB limit; send smaller photos (the server's --max-body-mb)",
        status=413,
    )


async def _bounded_body(request: Request, limits: Limits):
    """The body's chunks; UploadError once it passes the size limit, a chunk takes longer than
    ``read_timeout_s`` or the whole body longer than ``body_timeout_s``."""
    received = 0
    deadline = time.monotonic() + limits.body_timeout_s
    chunks = request.stream().__aiter__()
    while True:
        left = deadline - time.monotonic()
        try:
            chunk = await asyncio.wait_for(chunks.__anext__(), min(limits.read_timeout_s, max(left, 0.0)))
        except StopAsyncIteration:
            return
        except asyncio.TimeoutError:
            if left <= limits.read_timeout_s:
                raise UploadError(
                    "body",
                    f"not whole after {limits.body_timeout_s:g} s ({received} bytes); "
                    "send the request body at a steady pace (the server's --body-timeout-s)",
                    status=408,
                ) from None
            raise UploadError(
                "body",
                f"no data for {limits.read_timeout_s:g} s after {received} bytes; "
                "send the request body without pausing",
                status=408,
            ) from None
        received += len(chunk)
        if received > limits.max_body_bytes:
            raise _too_large("", limits)
        yield chunk


class CloseWatch:
    """Whether a multipart body's close delimiter (``--BOUNDARY--``) has gone by in its chunks: a body
    cut short parses as whole parts less the missing ones, which would be blamed on the fields."""

    def __init__(self, content_type: str):
        _, options = parse_options_header(content_type)
        boundary = options.get(b"boundary", b"")
        self.delimiter = b"--" + boundary + b"--" if boundary else b""
        self.closed, self.received, self._tail = not boundary, 0, b""

    async def watch(self, chunks):
        async for chunk in chunks:
            self.received += len(chunk)
            if not self.closed:
                seen = self._tail + chunk
                self.closed = self.delimiter in seen
                self._tail = seen[-len(self.delimiter) :]
            yield chunk


async def read_fields(request: Request, limits: Limits) -> tuple[list[tuple[str, bytes]], str | None, str | None]:
    """(images as (file name, bytes), cameras text, poses text) of a multipart/form-data body."""
    if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        raise UploadError(
            "body",
            f"content type {request.headers.get('content-type')!r}; expected multipart/form-data "
            "with the fields images (3 files) and cameras or poses",
            status=415,
        )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise _too_large(f"{int(declared)} bytes, ", limits)
    close = CloseWatch(request.headers.get("content-type", ""))
    parser = MultiPartParser(
        request.headers,
        close.watch(_bounded_body(request, limits)),
        max_files=MAX_PARTS,
        max_fields=MAX_PARTS,
        max_part_size=1 << 20,
    )
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise UploadError("body", f"malformed multipart/form-data ({exc.message})") from None
    try:
        if not close.closed:
            raise UploadError(
                "body",
                f"cut short: {close.received} bytes without the closing "
                f"{close.delimiter.decode('latin-1')!r} line; send the whole multipart body",
            )
        unknown = sorted(set(form.keys()) - set(FIELDS))
        if unknown:
            raise UploadError(unknown[0], f"unknown field; expected {', '.join(FIELDS)}")
        files = []
        for item in form.getlist("images"):
            if isinstance(item, str):
                raise UploadError("images", "a text value; expected three files (PNG or JPEG)")
            files.append((item.filename or "", await item.read()))
        texts = []
        for name in ("cameras", "poses"):
            values = form.getlist(name)
            if len(values) > 1:
                raise UploadError(name, f"given {len(values)} times; expected once")
            value = values[0] if values else None
            if value is not None and not isinstance(value, str):
                try:
                    value = (await value.read()).decode("utf-8")
                except UnicodeDecodeError:
                    raise UploadError(name, "a file that is not UTF-8 text; expected JSON") from None
            texts.append(value)
        return files, texts[0], texts[1]
    finally:
        await form.close()


def add_routes(
    app: FastAPI,
    submit: Callable[[Sample], Awaitable[dict]],
    faces: np.ndarray,
    info: dict,
    limits: Limits,
    admission: Admission,
) -> None:
    """Register the page, /v1/info and /v1/reconstruct on ``app``; ``submit`` queues a prepared sample
    for a worker and returns its answer."""
    weights_line = info["weights"]["description"]

    @app.exception_handler(StarletteHTTPException)
    async def http_refusal(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """404, 405 and any other refusal of the framework's in the JSON of every refusal."""
        if exc.status_code == 404:
            field, message = "path", f"{request.url.path}: no such path; {ROUTES_SERVED}"
        elif exc.status_code == 405:
            field, message = "method", f"{request.method} {request.url.path}: method not allowed; {ROUTES_SERVED}"
        else:
            field, message = None, str(exc.detail)
        return refusal(field, message, exc.status_code, getattr(exc, "headers", None))

    html = page_html(info)

    @app.get("/", response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse(html)

    @app.get("/v1/info")
    async def about() -> JSONResponse:
        return JSONResponse({**info, "in_server": admission.count.value})

    @app.post("/v1/reconstruct")
    async def reconstruct(request: Request) -> Response:
        stamps = {"arrived": time.monotonic()}
        if not admission.enter():
            return refusal(
                None,
                f"the server holds {limits.max_queue} requests already (its --max-queue); "
                f"retry after {RETRY_AFTER_S} s",
                503,
                {"Retry-After": str(RETRY_AFTER_S)},
            )
        try:
            fmt = choose_format(request.query_params.get("format"), request.headers.get("accept"))
            files, cameras, poses = await read_fields(request, limits)
            stamps["read"] = time.monotonic()
            sample = await prepare(files, cameras, poses)
            stamps["prepared"] = time.monotonic()
            result = await submit(sample)
            stamps["answered"] = time.monotonic()
            if "error" in result:
                return refusal(None, result["error"], result["status"])
            mesh = Mesh(result["refined"], faces, result["coarse"])
            if fmt in QUICK_FORMATS:  # quicker than the hop to a thread and back
                body = answer(fmt, sample, mesh, weights_line)
            else:
                body = await run_in_threadpool(answer, fmt, sample, mesh, weights_line)
            stamps.update(result["stamps"], formatted=time.monotonic())
            headers = {
                BATCH_HEADER: str(result["batch"]),
                COMPUTE_MS_HEADER: f"{result['ms']:.3f}",
                SERVER_MS_HEADER: f"{(stamps['formatted'] - stamps['arrived']) * 1000.0:.3f}",
                TIMING_HEADER: server_timing(stamps),
            }
            if sample.warnings:
                headers[WARNINGS_HEADER] = json.dumps(sample.warnings)
            return Response(body, media_type=MEDIA_TYPES[fmt], headers=headers)
        except UploadError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        except ClientDisconnect:
            return Response(status_code=400)  # the client is gone: nobody reads this
        except HTTPException as exc:  # from LitServe's queue, e.g. a worker that died
            return refusal(None, str(exc.detail), exc.status_code)
        finally:
            admission.leave()
