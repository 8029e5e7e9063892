"""`python -m roundtrip`: the `roundtrip` command, for a venv whose bin folder is not on PATH."""

from roundtrip._cli import entry

if __name__ == "__main__":
    entry()
