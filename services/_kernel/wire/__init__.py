"""The wire contract: the fleet's one declaration (topology), its events, topic names, signed approvals,
fingerprints and size limits."""
