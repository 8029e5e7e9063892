"""The embedded broker: Apache Kafka (KRaft, one node) fetched with mvn and run with Java.

Everything lives in `services.broker.embedded` (kept import-free here so that
`python -m services.broker.embedded` runs without a double-import warning).
"""
