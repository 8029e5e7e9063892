"""The demo shop: the order system the support tools call (its own database, its own HTTP API, app.py), and the
support agent that serves its customers (agent/), declared like any other agent."""
