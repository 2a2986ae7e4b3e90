"""The body of `/v1/status` (and of `elasticrun status --json`): the protocol's `JobStatus`
with the job's round under the word every other status field uses.

`round` is the current round's number. `epoch` is its deprecated first name, kept as a
duplicate with the same value so that readers written against it go on working; it will go
in a later release. (The model lives here, not in `elastic.protocol.http`, while the worker
protocol keeps its field names.)
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from elastic.protocol.http import JobStatus as ProtocolJobStatus


class JobStatus(ProtocolJobStatus):
    """A running job as its driver sees it: its round, hosts, workers, decisions, rounds
    timeline, stall, durable commits and the launcher's newest lines. Never the token."""

    epoch: int = Field(
        description="deprecated: the same as `round`, under its first name",
        json_schema_extra={"deprecated": True},
    )
    round: int = Field(description="the current round's number (0 before the first)")

    @model_validator(mode="before")
    @classmethod
    def _both_names(cls, data: Any) -> Any:
        """Either name given alone sets both: the driver gives `round`, an older driver's
        answer has `epoch` alone."""
        if isinstance(data, dict) and ("round" in data) != ("epoch" in data):
            number = data["round"] if "round" in data else data["epoch"]
            return {**data, "round": number, "epoch": number}
        return data
