#!/usr/bin/env bash
# The gates scripts/test.sh runs before pytest (docs/contributing.md, "The gates"): ruff's lint and its format check on
# the whole tree, mypy in strict mode on the package `roundtrip` and on the example agent. Any finding fails.
# Usage: bash scripts/gates.sh          (after scripts/setup.sh; quick: about a minute cold, seconds warm)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

echo "==> ruff check: lint (F, E, I, B, UP, BLE, SIM, RUF with RUF100; pyproject.toml [tool.ruff])"
.venv/bin/ruff check --quiet .
echo "==> ruff format --check"
.venv/bin/ruff format --check --quiet .

# mypy finds a package by its folder, and the editable install maps services/ to `roundtrip` with an import hook that
# mypy does not run: it reads the package through a tree of links named as installed (roundtrip/, roundtrip/schemas/).
tree=.venv/mypy-path
rm -rf "$tree" && mkdir -p "$tree/roundtrip"
for entry in services/*; do ln -s "../../../$entry" "$tree/roundtrip/${entry#services/}"; done
ln -s ../../../schemas "$tree/roundtrip/schemas"
echo "==> mypy --strict: roundtrip and the example agent (pyproject.toml [tool.mypy])"
MYPYPATH=$tree:examples/telecom-agent .venv/bin/mypy -p roundtrip -p telecom_agent
