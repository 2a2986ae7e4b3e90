"""Environment variables the driver sets for every worker process.

They are documented in the README ("Worker environment"); the worker runtime reads them in
`elastic.worker.config`.
"""

HOSTNAME = "ELASTIC_HOSTNAME"
RANK = "ELASTIC_RANK"
SIZE = "ELASTIC_SIZE"
LOCAL_RANK = "ELASTIC_LOCAL_RANK"
LOCAL_SIZE = "ELASTIC_LOCAL_SIZE"
CROSS_RANK = "ELASTIC_CROSS_RANK"
CROSS_SIZE = "ELASTIC_CROSS_SIZE"
DRIVER_URL = "ELASTIC_DRIVER_URL"
CONTROL_ADDRESS = "ELASTIC_CONTROL_ADDRESS"  # host:port of the gRPC control service
WORKER_ID = "ELASTIC_WORKER_ID"  # this worker process's id in the job, stable across epochs
ELASTIC = "ELASTIC_ELASTIC"  # "1" in an elastic job
JOB_ID = "ELASTIC_JOB_ID"
COLLECTIVE_TIMEOUT = "ELASTIC_COLLECTIVE_TIMEOUT"
START_TIMEOUT = "ELASTIC_START_TIMEOUT"
# The secret: in the environment of local children, read from ssh's stdin on remote hosts.
# Never on a command line.
TOKEN = "ELASTIC_TOKEN"

AUTH_SCHEME = "Bearer"
