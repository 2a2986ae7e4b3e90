"""The sharded recovery benchmark's report: each system's figures over its trials, the
issue's targets with whether they were met, and the markdown table of docs/benchmarks.md.
Pure functions of the trials' records (`bench/sharded_recovery.py`)."""

from __future__ import annotations

from typing import Any

from bench.support.step_timing import summarize

SYSTEMS = ["elasticrun", "torchrun"]
METRICS = [
    "launch_to_first_step_s", "step_s_no_commits", "step_s_with_commits", "commit_cost_pct",
    "commit_blocking_s", "recovery_s", "steps_lost", "scale_up_s", "joiner_first_step_s",
    "incumbent_stall_s", "step_interval_s", "scale_up_steps_lost", "host_recovery_s",
    "host_steps_lost",
]  # fmt: skip
MEMORY = ["share_mib", "live_mib", "rest_mib", "peak_mib", "held_at_rest_x_share",
          "held_at_peak_x_share", "bound_x_share"]  # fmt: skip


def summarize_system(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Median, min and max over the trials of every metric, memory figure, phase and
    milestone that had a value; the failures with their reasons."""

    def over(values: list[Any]) -> dict[str, Any] | None:
        values = [v for v in values if v is not None]
        return summarize(values) if values else None

    found: dict[str, Any] = {
        "trials": len(records),
        "trials_ok": sum(r["ok"] for r in records),
        "metrics": {k: m for k in METRICS if (m := over([r.get(k) for r in records]))},
        "memory": {
            k: m for k in MEMORY if (m := over([r.get("memory", {}).get(k) for r in records]))
        },
    }  # fmt: skip
    for group in ("recovery_phases_s", "host_recovery_phases_s", "recovery_milestones",
                  "host_recovery_milestones", "scale_up_milestones"):  # fmt: skip
        labels = next((list(r[group]) for r in records if group in r), [])
        found[group] = {
            label: m
            for label in labels
            if (m := over([r.get(group, {}).get(label) for r in records]))
        }
    found["failures"] = [f"trial {r['trial']}: {r['error']}" for r in records if "error" in r]
    found["leftovers"] = sum(
        len(r.get("stop", {}).get("leftover_processes_sigkilled", [])) for r in records
    )
    return found


def targets(doc: dict[str, Any], commit_every: int) -> list[dict[str, Any]]:
    """The issue's targets for elasticrun, each with its measured median and `met`."""

    def median(system: str, key: str) -> float | None:
        m = doc["systems"].get(system, {}).get("metrics", {}).get(key)
        return m["median"] if m else None

    found = []

    def add(what: str, value: float | None, ok: bool | None) -> None:
        found.append({"target": what, "value": value, "met": ok})

    cost = median("elasticrun", "commit_cost_pct")
    add("commits cost at most 5 % of step time", cost, None if cost is None else cost <= 5)
    for key in ("recovery_s", "host_recovery_s"):
        ours, theirs = median("elasticrun", key), median("torchrun", key)
        add(f"{key} at most 3 s", ours, None if ours is None else ours <= 3)
        ratio = theirs / ours if ours and theirs else None
        add(f"{key}: torchrun + DCP / elasticrun at least 5", ratio and round(ratio, 2),
            None if ratio is None else ratio >= 5)  # fmt: skip
    for key in ("steps_lost", "host_steps_lost"):
        lost = median("elasticrun", key)
        add(f"{key} at most the commit interval ({commit_every})", lost,
            None if lost is None else lost <= commit_every)  # fmt: skip
    return found


def markdown(doc: dict[str, Any]) -> str:
    """The table of docs/benchmarks.md: each metric's median [min-max] per system, and
    torchrun's over elasticrun's."""
    systems = [s for s in SYSTEMS if s in doc["systems"]]
    header = " | ".join(systems) + (" | torchrun / elasticrun" if len(systems) == 2 else "")
    rows = [f"| metric | {header} |", "|---" * (len(systems) + 1 + (len(systems) == 2)) + "|"]

    def cell(m: dict[str, Any] | None) -> str:
        if not m:
            return "—"
        return f"{m['median']:g}" if m["n"] == 1 else f"{m['median']:g} [{m['min']:g}–{m['max']:g}]"

    for section, keys in (("metrics", METRICS), ("memory", MEMORY)):
        for key in keys:
            found = [doc["systems"][s][section].get(key) for s in systems]
            if not any(found):
                continue
            cells = [cell(m) for m in found]
            if len(systems) == 2:
                a, b = found
                ok = a and b and a["median"] and key.endswith("_s")
                cells.append(f"{b['median'] / a['median']:.1f}x" if ok else "")
            rows.append(f"| {key} | " + " | ".join(cells) + " |")
    trials = [f"{doc['systems'][s]['trials_ok']}/{doc['systems'][s]['trials']}" for s in systems]
    rows.append("| trials ok | " + " | ".join(trials) + (" | |" if len(systems) == 2 else " |"))
    phases = doc["systems"].get("elasticrun", {}).get("recovery_phases_s", {})
    if phases:
        rows.append("")
        rows.append("elasticrun's re-form after the SIGKILL, seconds (slowest rank): " + ", ".join(
            f"{label} {m['median']:g}" for label, m in phases.items()))  # fmt: skip
    return "\n".join(rows)
