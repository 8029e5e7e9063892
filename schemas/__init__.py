"""The JSON Schemas, installed as `roundtrip.schemas`: events/ (every event on the wire, generated from the pydantic
models), tool.json (what a tool document must be) and tools/ (the demo shop agent's tool pack)."""
