"""The embedded broker: kept import-free so that `python -m roundtrip._broker.embedded` runs without a double-import
warning."""
