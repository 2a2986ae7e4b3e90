#!/usr/bin/env bash
# Check elasticrun against torch releases other than the pinned 2.13.0: for each release, a
# venv under $TORCH_VENVS (default ~/.cache/elasticrun/torch-venvs) with that torch and this
# checkout installed editable with its test extras, then the tests that exercise torch
# (collectives, DistributedOptimizer, state, process groups, training end to end). Not run
# in CI: every release but 2.13.0 is a CUDA build of several GB from PyPI, and pyproject.toml's
# torch range names the releases last checked this way. Exits non-zero if any release failed.
#
#   tests/support/torch_versions.sh                  # the oldest and newest releases of the range
#   tests/support/torch_versions.sh 2.9.1 2.12.1     # others
#
# Where pip caps torch below a release (this project's machines cap it at 2.14.1 through
# /etc/xdg/pip), run it with PIP_CONSTRAINT=/dev/null.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
venvs=${TORCH_VENVS:-$HOME/.cache/elasticrun/torch-venvs}
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(2.9.1 2.14.1 2.15.0)
tests=(
  tests/e2e/process_groups/test_collectives.py
  tests/e2e/process_groups/test_optimizer.py
  tests/e2e/process_groups/test_state.py
  tests/e2e/process_groups/test_process_group.py
  tests/e2e/horovod/test_training.py
)
failed=()
for version in "${versions[@]}"; do
  venv=$venvs/torch-$version
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  pins=$venv/pins.txt
  echo "torch==$version" > "$pins"
  "$venv/bin/python" -m pip install -q -c "$pins" "torch==$version"
  "$venv/bin/python" -m pip install -q -c "$pins" -e "$repo[dev]"
  echo "== torch $version ($venv)"
  if ! (cd "$repo" && PYTHONPATH="$repo" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
      "${tests[@]}"); then
    failed+=("$version")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "torch releases that failed: ${failed[*]}"
  exit 1
fi
echo "every torch release passed: ${versions[*]}"
