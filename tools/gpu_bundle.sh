#!/usr/bin/env bash
# Build, here, the two folders a bare CUDA machine needs for `make gpu-check` (docs/gpu.md):
#
#   .gpu-data/    the subset of the benchmark data the check reads (~16 MB): tu/MUTAG,
#                 the CIFAR-10 lossless npz (train 4,000 / test 1,000), moleculenet/bbbp,
#                 the first ZINC SMILES, the first wiki sentences, SentEval's STS-B
#   .gpu-wheels/  the packages such a machine lacks, for CPython 3.12 on x86-64 (~35 MB,
#                 rdkit alone 32 MB), inf-cl among them: bench_gpu.py's peer of the tiled loss
#
# Both are git-ignored; carry them (the device tool's `carry`), then on the GPU machine:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu-wheels/*.whl
#   PYTHONPATH=/tmp/site python3 tools/gpu_check.py --data-root .gpu-data --out "$OUT" \
#       --work-dir /tmp/gpu-check
#
# Usage: tools/gpu_bundle.sh [DATA_ROOT]   (default $ADAPTCL_DATA, else ../shared/data)
# PYTHON (default python3) runs pip; PY_VERSION (default 3.12) is the target's Python.
set -euo pipefail

cd "$(dirname "$0")/.."
DATA=${1:-${ADAPTCL_DATA:-../shared/data}}
PYTHON=${PYTHON:-python3}
PY_VERSION=${PY_VERSION:-3.12}
SMILES=${SMILES:-2000}      # ZINC molecules: the check pre-trains on the first 2,000
SENTENCES=${SENTENCES:-2000}  # wiki sentences: the check trains SimCSE on the first 512

if [ ! -d "$DATA/tu/MUTAG/raw" ]; then
    echo "gpu_bundle.sh: $DATA holds no tu/MUTAG/raw; pass the benchmark data folder" >&2
    exit 2
fi

rm -rf .gpu-data
mkdir -p .gpu-data/tu .gpu-data/cifar10 .gpu-data/moleculenet .gpu-data/zinc/moses \
    .gpu-data/wiki .gpu-data/senteval/downstream/STS
cp -r "$DATA/tu/MUTAG" .gpu-data/tu/
cp "$DATA"/cifar10/cifar10_train_lossless_0-3999.npz "$DATA"/cifar10/cifar10_test_lossless_0-999.npz \
    .gpu-data/cifar10/
cp -r "$DATA/moleculenet/bbbp" .gpu-data/moleculenet/
# the first rows (header included) of the ZINC file the recipe reads by default: a run on its
# first $SMILES molecules reads the same rows as from the whole file
(gzip -dc "$DATA/zinc/moses/test.csv.gz" || true) | head -n $((SMILES + 1)) | gzip -n \
    > .gpu-data/zinc/moses/test.csv.gz
wiki=$(basename "$DATA"/wiki/wiki1m_for_simcse*.txt)
head -n "$SENTENCES" "$DATA/wiki/$wiki" > ".gpu-data/wiki/$wiki"
cp -r "$DATA/senteval/downstream/STS/STSBenchmark" .gpu-data/senteval/downstream/STS/

# Wheels: the project's needs that the GPU image lacks (KINDS.md lists what it has) or holds
# in an older version (sentence-transformers 6.0.1; the floor is 6.2). Pinned to what the
# tests ran with here. antlr4-python3-runtime 4.9.3 is published as an sdist only: built here.
rm -rf .gpu-wheels
mkdir -p .gpu-wheels
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .gpu-wheels \
    lightly==1.6.0 hydra-core==1.3.8 omegaconf==2.3.1 \
    sentence-transformers==6.2.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 \
    tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1 \
    ogb==1.3.6 outdated==0.2.2 littleutils==0.2.4 rdkit==2026.9.1 \
    open-clip-torch==3.3.0 ftfy==6.3.1 wcwidth==0.9.4 inf-cl==1.2.1
"$PYTHON" -m pip wheel -q --no-deps -w .gpu-wheels antlr4-python3-runtime==4.9.3

du -sh .gpu-data .gpu-wheels
echo "gpu_bundle.sh: carry .gpu-data and .gpu-wheels (with the checkout: under 64 MiB)"
