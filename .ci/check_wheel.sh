#!/usr/bin/env bash
# Build the sdist and the wheel, install the wheel into a fresh virtualenv that has only torch,
# and check it there (.ci/check_wheel.py). Needs the project venv (`make setup`) for `build`.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
PYTHON=${PYTHON:-python3}
TORCH_PIN=${TORCH_PIN:-torch==2.14.1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

.venv/bin/python -m build --no-isolation --sdist --wheel --outdir "$work/dist" . > "$work/build.log" 2>&1 \
  || { cat "$work/build.log"; exit 1; }
sdist=$(ls "$work"/dist/adaptcl-*.tar.gz)
wheel=$(ls "$work"/dist/adaptcl-*.whl)
members=$(tar -tzf "$sdist")  # listed once: `tar | grep -q` would fail on SIGPIPE under pipefail
for member in LICENSE src/adaptcl/py.typed; do
  grep -q "/$member\$" <<< "$members" || { echo "sdist lacks $member" >&2; exit 1; }
done
echo "built $(basename "$sdist") and $(basename "$wheel")"

"$PYTHON" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$TORCH_PIN" 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" || true
"$work/venv/bin/python" -c "import torch" || { echo "could not install $TORCH_PIN" >&2; exit 1; }
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel" 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" || true
version=$(.venv/bin/python -c "import tomllib; print(tomllib.load(open('pyproject.toml', 'rb'))['project']['version'])")
# run from outside the checkout so that only the installed wheel can be imported
(cd "$work" && "$work/venv/bin/python" "$root/.ci/check_wheel.py" "$version")
