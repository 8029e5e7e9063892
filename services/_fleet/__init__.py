"""The local fleet: every part as a supervised process (`roundtrip up`, the e2e tests) and its recorded state."""
