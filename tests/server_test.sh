#!/usr/bin/env bash
# Runs tests/server_test.py with the official openai client, installed from PyPI into a
# throw-away virtual environment in the build tree (made once, reused).
#   server_test.sh SQUEEZEKV_BINARY VENV_DIR
set -euo pipefail
bin="$1"; venv="$2"
here="$(cd "$(dirname "$0")" && pwd)"
openai_version=3.57.0
if ! "$venv/bin/python" -c "import openai, sys; sys.exit(openai.__version__ != '$openai_version')" 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "openai==$openai_version"
fi
exec "$venv/bin/python" "$here/server_test.py" "$bin"
