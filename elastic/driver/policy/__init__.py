"""The re-forming policy: what the driver decides, as pure functions of the job and the time.

A policy function reads a `JobView` (`view.py`: the job's phase, workers, the current round's
members, who waits at the rendezvous), an event and `now`, and returns a `Decision`
(`actions.py`): the actions to carry out, in order, and the reason a user reads. It does no
I/O, reads no clock and writes nothing; the conductor (`elastic.driver.conductor`) gathers the
view, asks the function a report calls for, and carries the actions out. The reason goes to the
log (`--verbose`) and to `/v1/status`, so a user reads the sentence the tests assert on.

By question: `forming` (the next round, free slots, the job's end), `worker_events` (a worker
exited, was judged, waits, stalled), `leaving` (leaving at a commit, handing state over),
`host_changes` (hosts removed, drained, shrunk), `fleet_loss` (every worker lost),
`reachability` (which host to cut off), `liveness` and `planning` (the arithmetic they share).
"""
