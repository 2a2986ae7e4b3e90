"""The control plane between the driver and each worker, beside the HTTP API.

Each worker registers over gRPC (`server.py`) and keeps an event stream open, on which the
driver pushes what it must hear at once (`events.py`: a new round, a broken round;
`channels.py` keeps them while a stream is down). Workers beat on a separate heartbeat port
(`heartbeat_port.py`), and the liveness watch (`liveness_watch.py`) judges every live worker
from its beats, its stream and its start. What workers say is turned into reports for the
conductor (`inputs.py`); nothing a peer without the job token sends costs more than
`port_limits.py` allows.
"""
