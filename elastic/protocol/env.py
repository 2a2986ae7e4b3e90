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
# With TLS: the driver's certificate (PEM) that workers pin as their only CA. Public, not secret.
TLS_CERT = "ELASTIC_TLS_CERT"
WORKER_ID = "ELASTIC_WORKER_ID"  # this worker process's id in the job, stable across epochs
ELASTIC = "ELASTIC_ELASTIC"  # "1" in an elastic job
JOB_ID = "ELASTIC_JOB_ID"
COLLECTIVE_TIMEOUT = "ELASTIC_COLLECTIVE_TIMEOUT"
START_TIMEOUT = "ELASTIC_START_TIMEOUT"
ELASTIC_TIMEOUT = "ELASTIC_ELASTIC_TIMEOUT"  # how long the job may wait for --min-np workers
# With the etcd backend: where workers look up a restarted driver's address, and how long
# they wait for one.
ETCD_ENDPOINTS = "ELASTIC_ETCD_ENDPOINTS"
ETCD_PREFIX = "ELASTIC_ETCD_PREFIX"
ETCD_CA_CERT = "ELASTIC_ETCD_CA_CERT"
ETCD_CERT = "ELASTIC_ETCD_CERT"
ETCD_KEY = "ELASTIC_ETCD_KEY"
ETCD_USER = "ELASTIC_ETCD_USER"
ETCD_PASSWORD = "ELASTIC_ETCD_PASSWORD"  # also how the user gives it to elasticrun
DRIVER_WAIT = "ELASTIC_DRIVER_WAIT"
# The secret: in the environment of local children, read from ssh's stdin on remote hosts.
# Never on a command line.
TOKEN = "ELASTIC_TOKEN"

AUTH_SCHEME = "Bearer"
