"""The `roundtrip` command line (main.py) and what its commands do in a terminal (private to roundtrip)."""
