"""The wire contract: everything the driver and a worker say to each other, and the only
package both import (neither imports the other's internals).

A worker hears from its driver four ways: the variables it is launched with (`env`:
`WorkerEnvironment`, written by the driver, read by the worker), the HTTP API (`http`: the
bodies of `/v1/rendezvous` joins, the `/v1/kv` store, `/v1/status`), the gRPC control service
(`control_pb2`, `control_pb2_grpc`: generated from `protos/control.proto` by
`protos/generate.py`; register, the event stream, leave, notices, unreachable peers) and the
heartbeat port (`beats`: length-prefixed frames). With `--backend etcd` both read the job's
keys there (`etcd`: the layout; `etcd_trust`: MACs keyed by the job token, since etcd may be
shared). Beside them: `pinning` (a TLS context that trusts exactly the driver's
certificate), `notice` (when a host goes), `leave` (the Leave reasons that are not requests).

What it promises: a field on the wire keeps its name once published (a round is still
`epoch` in the worker protocol's bodies and messages), nothing on the wire is pickled, and the
job token travels in requests' headers, the heartbeat's HELLO, standard input and the
environment: never on a command line, nor in clear in etcd.
"""
