"""The driver's HTTP API and the job's page, served by uvicorn on the driver's event loop.

One router per resource (`rendezvous.py`, `kv.py`, `status.py`, `host_drain.py`, `stop.py`,
`login_codes.py`, `metrics.py`, the page's `page.py` and `page_api.py`), one schema per body,
one authentication check (`auth.py`: the job token, or a page session); everything that
listens bounds connections, bytes and time before authenticating (`connections.py`,
`limits.py`, `host_check.py`). `endpoints.py` starts the API and the gRPC control service
together, with one TLS identity (`tls.py`).
"""
