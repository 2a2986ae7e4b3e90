"""The launcher process (`elasticrun`): one asyncio event loop that runs a job.

`job.py` builds a job's parts and owns its lifecycle; `conductor.py` hears what the parts
report (one queue, `reports.py`), asks the pure policy (`policy/`) and carries its decisions
out. Around them, by purpose: `cli/` (flags, settings, the operator's commands), `discovery/`
(which hosts, cooldown), `launch/` (worker processes and reaching hosts), `rendezvous/`
(rounds, slots and the workers' key-value store), `control/` (the gRPC control stream,
heartbeats, liveness), `server/` (the HTTP API and the page), `observe/` (progress, stalls,
metrics) and `journal/` (what outlives the driver).
"""
