"""The worker's link to its driver: everything the worker says to the driver and hears from it.

* `http_client`: the driver's HTTP API, retried for a bounded time (`retries`) over a plain
  or TLS-pinned connection (`transport`), following a restarted driver to its new address
  (`locator`); a worker joins each round through it;
* `kv_store`: a `torch.distributed.Store` over the driver's key-value API, one namespace per
  round: the store a round's process group forms over;
* `control_client`: the gRPC control stream: registering, asking to leave, and the driver's
  events, posted to the mailbox `membership_events` (newer rounds with this worker's slot,
  broken rounds, a request to leave);
* `heartbeats`: a beat every interval, carrying the round, the commit count and what the
  process is doing (`progress`).

What it promises: calls are retried for a bounded time, then raise (`DriverError`,
`ControlError`); the control stream and the heartbeats reconnect for as long as the worker
lives, so a driver that restarts finds its workers again, and a round trains on without the
driver until it re-forms. A driver that answers NOT_FOUND has declared this worker dead: the
process exits.
"""
