#!/usr/bin/env bash
# Dependency floors: for each extra, a fresh venv with the lowest versions pyproject.toml allows,
# then that extra's adapter tests. `make floors` runs it; docs/install.md explains each floor.
#
# Per extra (EXTRAS, default "vision text graph"):
#   1. a venv under $FLOORS_DIR (default: a temporary directory, removed at the end unless
#      KEEP_FLOORS=1), with torch and torchvision installed by pip exactly as the Makefile does
#      ($TORCH_SPEC; pip finds them on local disk through the pip configuration), once, in a
#      base venv that each extra's venv starts as a copy of;
#   2. the extra's own requirements, read from pyproject.toml, resolved with
#      `uv pip install --resolution lowest-direct`: each requirement the extra names at the
#      lowest version its specifier allows, everything they pull in at the newest compatible
#      release (what a user who pins the floors gets), torch and torchvision held at their pins;
#   3. `pip install --no-deps -e .` and the test tools (pytest, pytest-timeout, hypothesis);
#   4. an import check of the adapter modules, then the extra's tests. A test that skips
#      because a package cannot be imported counts as a failure (importorskip must not turn a
#      broken floor into a pass).
# The versions installed are printed (`pip freeze` of the floor packages) before the tests.
# Exits 1 if any extra failed; the summary names them.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.14.1 torchvision==0.29.1}
EXTRAS=${EXTRAS:-vision text graph clip}
PYTEST_ARGS=${PYTEST_ARGS:-}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# the molecule tests read MoleculeNet files from the shared data folder (as in `make test`)
export ADAPTCL_DATA=${ADAPTCL_DATA:-$root/../shared/data}
# uv reads certificates from SSL_CERT_FILE; use pip's where it has one
if [ -z "${SSL_CERT_FILE:-}" ] && [ -n "${PIP_CERT:-}" ]; then export SSL_CERT_FILE=$PIP_CERT; fi

if [ -n "${FLOORS_DIR:-}" ]; then
  work=$FLOORS_DIR
  mkdir -p "$work"
else
  work=$(mktemp -d)
  [ "${KEEP_FLOORS:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
fi

# The extra's tests: every adapter test of its frameworks (tests/test_package.py checks that
# none is missing) and the core's parity tests against its peer.
tests_for() {
  case $1 in
    vision) echo tests/adapters/lightly/test_adapter.py tests/adapters/lightly/test_dropin.py \
                 tests/adapters/lightly/test_labels_and_dystress.py \
                 tests/adapters/lightning/test_modules.py tests/adapters/lightning/test_ddp.py \
                 tests/adapters/lightning/test_mixed_precision.py tests/plugins/test_parity.py \
                 tests/adapters/lightly/test_temperature_rules.py \
                 tests/adapters/lightning/test_temperature_rules.py \
                 tests/adapters/lightning/test_settings.py \
                 tests/adapters/lightning/test_gradient_caching.py ;;
    text) echo tests/adapters/sentence_transformers/test_adapter.py \
               tests/adapters/sentence_transformers/test_cached.py \
               tests/adapters/sentence_transformers/test_composition.py \
               tests/adapters/sentence_transformers/test_peer_parity.py \
               tests/adapters/sentence_transformers/test_directions.py \
               tests/adapters/sentence_transformers/test_labels.py \
               tests/adapters/sentence_transformers/test_cached_ddp.py \
               tests/adapters/sentence_transformers/test_distributed.py \
               tests/adapters/sentence_transformers/test_mixed_precision.py \
               tests/adapters/sentence_transformers/test_resume.py \
               tests/adapters/sentence_transformers/test_temperature_rules.py \
               tests/adapters/sentence_transformers/test_train_simcse.py ;;
    graph) echo tests/adapters/graphcl/test_devices.py tests/adapters/graphcl/test_edge_attributes.py \
                tests/adapters/graphcl/test_model.py tests/adapters/graphcl/test_train.py \
                tests/adapters/graphcl/test_transforms.py tests/adapters/graphcl/test_workers.py \
                tests/adapters/graphcl/test_molecules.py tests/adapters/graphcl/test_mixed_precision.py \
                tests/adapters/graphcl/test_lightning.py tests/adapters/graphcl/test_steps.py \
                tests/adapters/graphcl/test_temperature_rules.py ;;
    clip) echo tests/adapters/open_clip/test_losses.py tests/adapters/open_clip/test_validation.py \
               tests/adapters/open_clip/test_distributed.py tests/adapters/open_clip/test_dropin.py \
               tests/plugins/test_logit_scale.py ;;
    *) echo "unknown extra $1" >&2; return 1 ;;
  esac
}

# What the adapter needs at import time: a floor that cannot even be imported fails here.
imports_for() {
  case $1 in
    vision) echo "import adaptcl.adapters.lightly, adaptcl.adapters.lightning.modules, adaptcl.adapters.lightning.factory, lightly, pytorch_lightning" ;;
    text) echo "import adaptcl.adapters.sentence_transformers.losses, adaptcl.adapters.sentence_transformers.simcse, adaptcl.adapters.sentence_transformers.callbacks, sentence_transformers, transformers, datasets, accelerate" ;;
    graph) echo "import adaptcl.adapters.graphcl, adaptcl.adapters.graphcl.molecules, adaptcl.adapters.graphcl.lightning, torch_geometric, ogb, rdkit, pytorch_lightning" ;;
    clip) echo "import adaptcl.adapters.open_clip.factory, open_clip, open_clip_train.train" ;;
  esac
}

# The extra's own modules: a test skipped because one of them cannot be imported is a failure.
modules_for() {
  case $1 in
    vision) echo "lightly|pytorch_lightning|torchvision" ;;
    text) echo "sentence_transformers|transformers|datasets|accelerate|tokenizers|huggingface_hub" ;;
    graph) echo "torch_geometric|ogb|rdkit|pytorch_lightning" ;;
    clip) echo "open_clip|open_clip_train" ;;
  esac
}

# Requirement names of an extra, without torch/torchvision (pinned by TORCH_SPEC).
requirements_for() {
  "$PYTHON" - "$1" <<'EOF'
import re, sys, tomllib
extra = sys.argv[1]
reqs = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"][extra]
for req in reqs:
    name = re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower()
    if name not in ("torch", "torchvision") and not name.startswith("adaptcl"):
        print(req)
EOF
}

uv=${UV:-}
if [ -z "$uv" ]; then
  "$PYTHON" -m venv "$work/uv-venv" && "$work/uv-venv/bin/python" -m pip install --quiet uv 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory"
  uv=$work/uv-venv/bin/uv
fi
"$uv" --version || { echo "no uv (set UV=/path/to/uv)" >&2; exit 1; }

failed=()
for extra in $EXTRAS; do
  start=$SECONDS
  echo "=== floors: [$extra]"
  venv=$work/$extra
  rm -rf "$venv"
  mapfile -t reqs < <(requirements_for "$extra")
  echo "requirements: ${reqs[*]}"
  constraints=$work/$extra-constraints.txt
  tr ' ' '\n' <<< "$TORCH_SPEC" > "$constraints"
  # torch and torchvision are installed once (in $work/base) and the venv copied per extra
  if [ ! -f "$work/base/.torch-installed" ]; then
    rm -rf "$work/base"
    # shellcheck disable=SC2086
    "$PYTHON" -m venv "$work/base" \
      && "$work/base/bin/python" -m pip install --quiet $TORCH_SPEC 2>&1 \
         | grep -v "is ignored: it is neither a file nor a directory"
    "$work/base/bin/python" -c "import torch, torchvision" && touch "$work/base/.torch-installed"
  fi
  # a copied venv works when run as venv/bin/python (sys.prefix follows pyvenv.cfg)
  if ! { cp -a "$work/base" "$venv" && "$venv/bin/python" -c "import torch, torchvision"; }; then
    failed+=("$extra (torch)"); continue
  fi
  if ! "$uv" pip install --python "$venv/bin/python" --resolution lowest-direct \
         --constraint "$constraints" "${reqs[@]}"; then
    failed+=("$extra (no lowest-direct resolution)"); continue
  fi
  "$venv/bin/python" -m pip install --quiet --no-deps -e . 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory"
  "$uv" pip install --python "$venv/bin/python" --quiet --constraint "$constraints" \
    "pytest>=8" "pytest-timeout>=2.2" "hypothesis>=6.90" || { failed+=("$extra (test tools)"); continue; }
  echo "--- installed floors of [$extra]:"
  names=$(printf '%s\n' "${reqs[@]}" | sed -E 's/[<>=!~ ;].*//' | tr 'A-Z_' 'a-z-')
  "$venv/bin/python" -m pip list --format=freeze 2>/dev/null | tr 'A-Z_' 'a-z-' \
    | grep -E "^($(paste -sd'|' <<< "$names")|torch|torchvision|tokenizers|huggingface-hub|numpy|pyarrow|setuptools)==" \
    | sort
  if ! "$venv/bin/python" -c "$(imports_for "$extra")"; then
    failed+=("$extra (import)"); echo "[$extra] import failed after $((SECONDS - start)) s"; continue
  fi
  log=$work/$extra-pytest.log
  # shellcheck disable=SC2046,SC2086
  "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider $(tests_for "$extra") $PYTEST_ARGS 2>&1 \
    | tee "$log"
  status=${PIPESTATUS[0]}
  if grep -qE "could not import '($(modules_for "$extra"))[.']" "$log"; then
    failed+=("$extra (a test module skipped on an import error)")
  elif [ "$status" -ne 0 ]; then
    failed+=("$extra (pytest exit $status)")
  fi
  echo "[$extra] done in $((SECONDS - start)) s"
done

if [ "${#failed[@]}" -ne 0 ]; then
  printf 'floors failed: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "floors: every extra passed its tests at its lowest allowed versions ($EXTRAS)"
