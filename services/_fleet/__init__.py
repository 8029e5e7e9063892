"""The local fleet: every part as a supervised process (`roundtrip up`) and its recorded state."""
