"""Horovod's `horovod.common`, for scripts that import from it directly.

`elastic.common.exceptions` holds the exceptions a Horovod script catches, under Horovod's
names: `HorovodInternalError` (elasticrun's `WorkerLostError`: a peer was lost, or the round
broke; `hvd.elastic.run` restores the last commit and re-joins), `HostsUpdatedInterrupt` (the
membership changes at a commit) and `CollectiveArgumentError`. They are the worker runtime's
own classes (`elastic.worker.errors`), re-exported: nothing in elasticrun imports this
package; a script migrated from Horovod changes `horovod.common` to `elastic.common` and
nothing else.
"""
