"""The embedded broker: Apache Kafka (KRaft, one node) fetched with mvn and run with Java.

Everything lives in `roundtrip._broker.embedded` (kept import-free here so that
`python -m roundtrip._broker.embedded` runs without a double-import warning).
"""
