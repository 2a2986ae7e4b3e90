#!/usr/bin/env bash
# Host discovery inside a Slurm allocation: prints the allocation's nodes.
#
# Usage (inside sbatch/salloc):  elasticrun --host-discovery-script slurm.sh ...
#
# Nodes come from `scontrol show hostnames "$SLURM_JOB_NODELIST"`, one a line. Slots per node:
# $SLURM_NTASKS_PER_NODE (set by `--ntasks-per-node`), else $ELASTIC_SLOTS_PER_HOST, else none
# printed (elasticrun then gives each node --slots-per-host, or 1).
# To drop nodes while the job runs, list them one a line in the file named by
# $ELASTIC_EXCLUDE_FILE (optional; a missing file excludes nothing).
# A Slurm allocation does not grow, so this script only ever shrinks the job: it is for jobs
# that must survive node failures and drains. Exits non-zero with a message on stderr when
# SLURM_JOB_NODELIST is unset or scontrol fails.
set -euo pipefail

if [[ -z "${SLURM_JOB_NODELIST:-}" ]]; then
    echo "slurm.sh: SLURM_JOB_NODELIST is not set (run inside a Slurm allocation)" >&2
    exit 2
fi
slots="${SLURM_NTASKS_PER_NODE:-${ELASTIC_SLOTS_PER_HOST:-}}"
if [[ -n "$slots" && ! "$slots" =~ ^[1-9][0-9]*$ ]]; then
    echo "slurm.sh: slots per node must be a positive number, got '$slots'" >&2
    exit 2
fi
exclude="${ELASTIC_EXCLUDE_FILE:-}"

nodes="$(scontrol show hostnames "$SLURM_JOB_NODELIST")"
while IFS= read -r node; do
    [[ -n "$node" ]] || continue
    if [[ -n "$exclude" && -f "$exclude" ]] && grep -qxF -- "$node" "$exclude"; then
        continue
    fi
    echo "${node}${slots:+:$slots}"
done <<< "$nodes"
