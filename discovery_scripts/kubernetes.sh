#!/usr/bin/env bash
# Host discovery on Kubernetes: prints the running, ready pods that match a label selector.
#
# Usage:  ELASTIC_K8S_SELECTOR=app=trainer elasticrun --host-discovery-script kubernetes.sh ...
#
# Environment:
#   ELASTIC_K8S_SELECTOR   label selector passed to `kubectl get pods -l` (required)
#   ELASTIC_K8S_NAMESPACE  namespace (default: kubectl's current namespace)
#   ELASTIC_K8S_ADDRESS    `ip` (default) prints pod IPs; `name` prints pod names (these must
#                          resolve from the driver, e.g. through a headless service)
#   ELASTIC_SLOTS_PER_HOST slots per pod (default: none printed; elasticrun then gives each
#                          pod --slots-per-host, or 1)
# A pod is listed when its phase is Running, its Ready condition is True, it has an IP and it
# is not being deleted. Needs `kubectl` with a context allowed to list pods. Exits non-zero
# with a message on stderr when the selector is unset or kubectl fails.
set -euo pipefail

if [[ -z "${ELASTIC_K8S_SELECTOR:-}" ]]; then
    echo "kubernetes.sh: set ELASTIC_K8S_SELECTOR to a label selector, e.g. app=trainer" >&2
    exit 2
fi
address="${ELASTIC_K8S_ADDRESS:-ip}"
if [[ "$address" != ip && "$address" != name ]]; then
    echo "kubernetes.sh: ELASTIC_K8S_ADDRESS must be 'ip' or 'name', got '$address'" >&2
    exit 2
fi
slots="${ELASTIC_SLOTS_PER_HOST:-}"
if [[ -n "$slots" && ! "$slots" =~ ^[1-9][0-9]*$ ]]; then
    echo "kubernetes.sh: ELASTIC_SLOTS_PER_HOST must be a positive number, got '$slots'" >&2
    exit 2
fi
namespace=()
if [[ -n "${ELASTIC_K8S_NAMESPACE:-}" ]]; then
    namespace=(--namespace "$ELASTIC_K8S_NAMESPACE")
fi

# One pod a line: name|ip|phase|ready|deletionTimestamp ('|' because empty fields must stay).
template='{range .items[*]}{.metadata.name}{"|"}{.status.podIP}{"|"}{.status.phase}{"|"}'
template+='{.status.conditions[?(@.type=="Ready")].status}{"|"}'
template+='{.metadata.deletionTimestamp}{"\n"}{end}'
pods="$(kubectl get pods "${namespace[@]}" -l "$ELASTIC_K8S_SELECTOR" -o "jsonpath=$template")"

while IFS='|' read -r name ip phase ready deleting; do
    [[ -n "$name" && -n "$ip" && "$phase" == Running && "$ready" == True && -z "$deleting" ]] \
        || continue
    if [[ "$address" == ip ]]; then host="$ip"; else host="$name"; fi
    if [[ "$host" == *:* ]]; then host="[$host]"; fi  # IPv6 pod address
    echo "${host}${slots:+:$slots}"
done <<< "$pods"
