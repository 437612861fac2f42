#!/usr/bin/env bash
# Install what `make dist` built as a user would, each into a fresh venv outside the checkout
# (never editable), and run scripts/smoke_installed.py with it: the wheel itself, then the
# sdist, from which pip builds its own wheel.
#   bash scripts/smoke_dist.sh [DIST_DIR]     (default dist; PYTHON picks the interpreter)
set -euo pipefail
dist=$(cd "${1:-dist}" && pwd)
smoke=$(cd "$(dirname "$0")" && pwd)/smoke_installed.py
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for artifact in "$dist"/*.whl "$dist"/*.tar.gz; do
    venv="$work/venv-$(basename "$artifact")"
    "${PYTHON:-python3}" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet "$artifact"
    echo "smoke: $(basename "$artifact") installed"
    # From the scratch folder, so nothing of the checkout is importable.
    (cd "$work" && "$venv/bin/python" "$smoke")
done
