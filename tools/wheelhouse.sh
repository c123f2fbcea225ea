#!/usr/bin/env bash
# Wheels of the notebook test stack (and torchao, for notebook 10's GPU rungs) for an offline GPU host that
# already has torch and matplotlib,
# at the versions pinned in tests/constraints.txt.
#
#   tools/wheelhouse.sh [DIR] [PYTHON_VERSION]      # DIR: .whl (keep it out of git); Python: 3.12
#
# Then, on the GPU host:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site DIR/*.whl
#   export PYTHONPATH=/tmp/site:$PWD
#   make record && make gpu-check
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.whl}
py=${2:-3.12}
platforms=()
# pip matches these literally, so list the manylinux levels that x86-64 wheels are published for.
for tag in manylinux1 manylinux2010 manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_26 \
           manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34; do
    platforms+=(--platform "${tag}_x86_64")
done
rm -rf "$dir"
mkdir -p "$dir"
python3 -m pip download -q --only-binary=:all: --implementation cp --python-version "$py" \
    "${platforms[@]}" --platform any -c tests/constraints.txt -d "$dir" \
    pytest nbval ipykernel ipython ipywidgets nbclient nbformat tqdm torchao
count=$(find "$dir" -name '*.whl' | wc -l)
echo "wheelhouse: $count wheels ($(du -sh "$dir" | cut -f1)) in $dir, for Python $py"
