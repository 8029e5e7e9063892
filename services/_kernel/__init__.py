"""The kernel: what two services share, once (private to roundtrip). Its rooms: wire (the contract on the topics),
kafka (every client, the consumer, dead letters), storage (databases, the turn table and fence), migrations,
observability (traces, metrics, health), settings; it imports no other room of the package."""
