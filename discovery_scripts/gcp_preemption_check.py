#!/usr/bin/env python3
"""Preemption check for GCP spot and preemptible VMs (`elasticrun --preemption-check`).

Asks the metadata server's `instance/preempted` (header `Metadata-Flavor: Google`); when it
says TRUE, prints when the VM goes: GCP gives about 30 s from the notice, so now + 30 s, in
Unix seconds. Prints nothing otherwise.

The metadata address is `$ELASTIC_GCP_METADATA_URL` (default
`http://metadata.google.internal`), so that tests can point it at a server of their own.
Exits 1, with one line on stderr, when the server cannot be asked.
"""

from __future__ import annotations

import os
import sys
import time
import urllib.error
import urllib.request

TIMEOUT = 2.0  # seconds
GRACE = 30.0  # seconds GCP gives a preempted VM


def main() -> int:
    base = os.environ.get("ELASTIC_GCP_METADATA_URL", "http://metadata.google.internal")
    request = urllib.request.Request(
        f"{base.rstrip('/')}/computeMetadata/v1/instance/preempted",
        headers={"Metadata-Flavor": "Google"},
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            preempted = answer.read().decode().strip()
    except (OSError, ValueError) as err:
        print(f"gcp metadata at {base}: {err}", file=sys.stderr)
        return 1
    if preempted == "TRUE":
        print(f"{time.time() + GRACE:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
