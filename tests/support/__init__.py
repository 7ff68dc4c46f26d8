"""What the tests share, in one place.

- `backends`: which backends run here (Docker, gVisor), test settings for each.
- `ports`: one `free_port`.
- `server`: the real app under uvicorn in a thread (`ServerThread`), a cuttable proxy.
- `api`: executing over HTTP and reading SSE with timestamps.
- `processes`: a gateway or router as its own process (`gateway()`, `router()`), restartable.
- `jupyter`: a Jupyter Server process pointed at a gateway.
- `fake_kernel`: scripted kernels speaking the real Jupyter protocol, `FakeBackend`, and
  `fake_registry` (a started registry on them).
- `metrics`: reading a Prometheus scrape.
"""
