#!/usr/bin/env bash
# Mutation testing of the data-protecting modules, by area (not part of CI: slow).
#   scripts/mutation.sh [AREA...] [--jobs N] [--report-only]
# Needs mutmut 3 importable by $PYTHON (default: python), either installed in
# that environment or in a separate one named by MUTMUT_SITE (its site-packages
# folder), e.g.  python -m venv /tmp/mut && /tmp/mut/bin/pip install 'mutmut==3.8.1'
#   MUTMUT_SITE=/tmp/mut/lib/python3.11/site-packages scripts/mutation.sh
# Prints the kill rate per area; exits 1 when an area is below 90%.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-python}"
if ! PYTHONPATH="${MUTMUT_SITE:-}" "$py" -c "import mutmut" 2>/dev/null; then
  echo "mutmut is not importable by $py; install mutmut 3 (see the header of $0)" >&2
  exit 2
fi
exec "$py" "$root/scripts/mutation.py" "$@"
