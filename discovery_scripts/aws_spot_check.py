#!/usr/bin/env python3
"""Preemption check for AWS spot instances (`elasticrun --preemption-check`).

Asks the instance metadata service (IMDSv2: a session token first, then
`meta-data/spot/instance-action`) whether this instance is being reclaimed, and prints the
time it goes (ISO 8601, as AWS gives it) or nothing. AWS announces a reclaim 2 minutes ahead.

The metadata address is `$ELASTIC_AWS_METADATA_URL` (default `http://169.254.169.254`), so
that tests can point it at a server of their own. Exits 1, with one line on stderr, when the
service cannot be asked (elasticrun logs it once and keeps running the check).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request

TIMEOUT = 2.0  # seconds for each request


def main() -> int:
    base = os.environ.get("ELASTIC_AWS_METADATA_URL", "http://169.254.169.254").rstrip("/")
    try:
        token_request = urllib.request.Request(
            f"{base}/latest/api/token",
            method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"},
        )
        with urllib.request.urlopen(token_request, timeout=TIMEOUT) as answer:
            token = answer.read().decode()
        action_request = urllib.request.Request(
            f"{base}/latest/meta-data/spot/instance-action",
            headers={"X-aws-ec2-metadata-token": token},
        )
        with urllib.request.urlopen(action_request, timeout=TIMEOUT) as answer:
            action = json.loads(answer.read())
    except urllib.error.HTTPError as err:
        if err.code == 404:  # no reclaim scheduled
            return 0
        print(f"aws metadata at {base}: HTTP {err.code}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as err:
        print(f"aws metadata at {base}: {err}", file=sys.stderr)
        return 1
    if action.get("action") in ("terminate", "stop", "hibernate") and action.get("time"):
        print(action["time"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
