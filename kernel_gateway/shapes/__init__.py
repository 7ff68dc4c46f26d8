"""The API's shapes, each defined once: request bodies, responses, events and the error body.

- `responses.py` and `events.py`: what the gateway answers, as TypedDicts its producers
  return (mypy checks every field where the dict is built); plain typing, no pydantic;
- `requests.py`: what clients send, as strict pydantic models, and the one place that words
  a refused body's error;
- `schema.py`: the JSON Schemas of all of them (OpenAPI's components, MCP's input schemas);
- `paths.py`: a file path as the API takes it;
- `meta.py`: the markers that carry a field's description and bounds without pydantic.

A bottom layer: it imports only `errors` and `types`, so every layer above (kernels,
sessions, protocols, the server, the cluster router) can name the shapes it produces.
"""
