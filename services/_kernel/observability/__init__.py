"""Observability: the shape of a turn's trace, metrics, the health endpoints, the agent digest."""
