"""Request bodies: read with a size limit and parsed as a JSON object; every problem is a 4xx.

Checked here, before a method sees the body: body size (413), empty body or malformed JSON
(400), a body that is not a JSON object (422). The fields are then checked by the method's own
``parse`` (``ember.tasks.inference.methods``; validators in ``ember.tasks.inference.requests``), the same code the
Python API uses.
"""

from __future__ import annotations

import json

from ember.errors import RequestError
from ember.tasks.inference.requests import Limits

__all__ = ["Limits", "RequestError", "read_json"]


async def read_json(request, limits: Limits) -> dict:
    """The request body as a JSON object, read incrementally so a huge body is refused early."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            declared_bytes = int(declared)
        except ValueError:
            raise RequestError(400, f"bad Content-Length header {declared!r}") from None
        if declared_bytes > limits.max_body_bytes:
            raise RequestError(413, f"request body of {declared_bytes} bytes exceeds the limit of "
                               f"{limits.max_body_bytes}; send fewer or shorter texts")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limits.max_body_bytes:
            raise RequestError(413, f"request body exceeds the limit of {limits.max_body_bytes} bytes; "
                               "send fewer or shorter texts")
    if not body.strip():
        raise RequestError(400, 'empty request body; send a JSON object, e.g. {"text": "a fine film"}')
    try:
        data = json.loads(bytes(body))
    except (ValueError, RecursionError) as exc:
        raise RequestError(400, f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RequestError(422, f"the body must be a JSON object, not {type(data).__name__}")
    return data
