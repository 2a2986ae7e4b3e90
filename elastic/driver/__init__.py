"""The launcher process (`elasticrun`).

`job.py` owns one job's lifecycle; around it, by purpose: `cli/` (flags, settings, the
`status` subcommand), `policy/` (pure decisions), `discovery/` (hosts, cooldown), `launch/`
(processes, host access, output), `rendezvous/` (rounds and their key-value store),
`server/` (HTTP API), `control/` (gRPC control stream) and `journal/` (what outlives the
driver).
"""
