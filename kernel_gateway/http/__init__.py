"""HTTP for every app of ours: the gateway, its protocol front doors and the cluster router.

- `bodies.py`: request bodies read with a cap, as JSON or as a request model;
- `responses.py`: JSON responses and an error's response;
- `errors.py`: the exception handlers (every error is `{"error": {"type", "message"}}`);
- `auth.py`: the bearer token and the loopback Host guard;
- `middleware.py`: request ids, the access log, request metrics;
- `sse.py`: server-sent events and the collected JSON document;
- `operations.py`: an endpoint declared once (path, method, handler, shapes, errors), from
  which both its route and its OpenAPI operation are built.

Low in the tree (above `settings`, `shapes` and the foundation): it imports no kernel,
session or protocol machinery, so the router uses it as the gateway does.
"""
