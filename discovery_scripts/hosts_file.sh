#!/usr/bin/env bash
# Host discovery from a file: prints the host lines of a file that you edit while the job runs.
#
# Usage:  ELASTIC_HOSTS_FILE=/path/hosts.txt elasticrun --host-discovery-script hosts_file.sh ...
#         hosts_file.sh [FILE]        (FILE wins over $ELASTIC_HOSTS_FILE)
#
# The file holds one `hostname` or `hostname:slots` a line; blank lines and `#` comments are
# passed through (elasticrun ignores them). To change the hosts, replace the file atomically
# (write a new file, then `mv` it over the old one) so that a run never sees half a file.
# Exits 1 with a message on stderr when the file cannot be read, 2 when none is named.
set -euo pipefail

file="${1:-${ELASTIC_HOSTS_FILE:-}}"
if [[ -z "$file" ]]; then
    echo "hosts_file.sh: name the hosts file as an argument or in ELASTIC_HOSTS_FILE" >&2
    exit 2
fi
if [[ ! -f "$file" || ! -r "$file" ]]; then
    echo "hosts_file.sh: cannot read hosts file $file" >&2
    exit 1
fi
cat -- "$file"
