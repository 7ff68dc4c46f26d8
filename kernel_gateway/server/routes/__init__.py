"""HTTP endpoints: parse the request, call the pool or session, wrap the answer."""

from __future__ import annotations

from starlette.routing import Mount, Route

from kernel_gateway.server.routes import (
    e2b,
    files,
    health,
    jupyter_api,
    mcp,
    metrics,
    openapi,
    sessions,
    web,
)

routes = [
    Route("/", web.index, methods=["GET"]),
    Mount("/static", app=web.static, name="static"),
    Route("/health", health.health, methods=["GET"]),
    Route("/languages", health.languages, methods=["GET"]),
    Route("/openapi.json", openapi.openapi_json, methods=["GET"]),
    Route("/metrics", metrics.metrics, methods=["GET"]),
    Route("/execute", sessions.execute_stateless, methods=["POST"]),
    Route("/sessions", sessions.create, methods=["POST"]),
    Route("/sessions", sessions.list_all, methods=["GET"]),
    Route("/sessions/{session_id}", sessions.get, methods=["GET"]),
    Route("/sessions/{session_id}", sessions.delete, methods=["DELETE"]),
    Route("/sessions/{session_id}/execute", sessions.execute, methods=["POST"]),
    Route("/sessions/{session_id}/executions", sessions.list_executions, methods=["GET"]),
    Route(
        "/sessions/{session_id}/executions/{execution_id}/events",
        sessions.execution_events,
        methods=["GET"],
    ),
    Route("/sessions/{session_id}/interrupt", sessions.interrupt, methods=["POST"]),
    Route("/sessions/{session_id}/restart", sessions.restart, methods=["POST"]),
    Route("/sessions/{session_id}/hibernate", sessions.hibernate, methods=["POST"]),
    Route("/sessions/{session_id}/resume", sessions.resume, methods=["POST"]),
    Route("/sessions/{session_id}/files", files.list_files, methods=["GET"]),
    Route("/sessions/{session_id}/files/{path:path}", files.download, methods=["GET"]),
    Route("/sessions/{session_id}/files/{path:path}", files.upload, methods=["PUT"]),
    Route("/sessions/{session_id}/files/{path:path}", files.delete, methods=["DELETE"]),
    *mcp.routes,
    *e2b.routes,
    *jupyter_api.routes,
]
