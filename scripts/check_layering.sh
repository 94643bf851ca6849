#!/usr/bin/env bash
# Checks the layering of docs/ARCHITECTURE.md ("Layers": who may use whom) on every
# `#include "..."` of the project's C++ and CUDA sources: a file in folder F may include headers of
# the folders F may use, nothing else. graph/ and planner/ also never include a CUDA, MPI or NCCL
# header. The build enforces the same table (each layer's target sees only its own and its
# dependencies' include roots, CMakeLists.txt); this test names the file and the back-edge.
#
# usage: check_layering.sh [source dir]   (exit 0: clean; 1: back-edges, one line each)
set -uo pipefail
root=$(cd "${1:-$(dirname "$0")/..}" && pwd)

declare -A allowed=(
  [graph]="graph"
  [importer]="importer graph"
  [planner]="planner graph"
  [kernels]="kernels"
  [executor]="executor graph planner kernels"
  [tools]="tools executor planner importer graph kernels"
  [tests]="tests tools executor planner importer graph kernels"
)
layers=" ${!allowed[*]} "
no_device_headers="graph planner"  # never a CUDA, MPI or NCCL header

bad=0
for layer in "${!allowed[@]}"; do
  [[ -d "$root/$layer" ]] || continue
  while IFS= read -r hit; do
    file=${hit%%:*}
    rest=${hit#*:}
    line=${rest%%:*}
    text=${rest#*:}
    rel=${file#"$root"/}
    if [[ $text =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*\"([^\"]+)\" ]]; then
      inc=${BASH_REMATCH[1]}
      target=$inc
      if [[ $inc == .* ]]; then  # relative include: the folder it lands in
        target=$(realpath -m --relative-to="$root" "$(dirname "$file")/$inc")
      fi
      top=${target%%/*}
      [[ $layers == *" $top "* ]] || continue  # a system or third-party header, or a local one
      if [[ " ${allowed[$layer]} " != *" $top "* ]]; then
        echo "$rel:$line: $layer/ may not include $top/ (#include \"$inc\"; $layer/ may use: ${allowed[$layer]})"
        bad=1
      fi
    elif [[ " $no_device_headers " == *" $layer "* && $text =~ \<(cuda|cublas|cudnn|nccl|mpi)[^\>]*\> ]]; then
      echo "$rel:$line: $layer/ may not include a CUDA, MPI or NCCL header (${BASH_REMATCH[0]})"
      bad=1
    fi
  done < <(grep -rnE --include='*.h' --include='*.hpp' --include='*.cpp' --include='*.cc' --include='*.cu' --include='*.cuh' \
             '^[[:space:]]*#[[:space:]]*include' "$root/$layer" | sort)
done
if ((bad)); then
  echo "layering: back-edges found (the allowed table is in docs/ARCHITECTURE.md and scripts/check_layering.sh)"
  exit 1
fi
echo "layering: every include follows the table"
