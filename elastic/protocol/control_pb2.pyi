from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterRequest(_message.Message):
    __slots__ = ("worker_id", "pid")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    pid: int
    def __init__(self, worker_id: _Optional[str] = ..., pid: _Optional[int] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("heartbeat_interval",)
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval: float
    def __init__(self, heartbeat_interval: _Optional[float] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("worker_id", "reason", "commit")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    reason: str
    commit: int
    def __init__(self, worker_id: _Optional[str] = ..., reason: _Optional[str] = ..., commit: _Optional[int] = ...) -> None: ...

class LeaveResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UnreachableRequest(_message.Message):
    __slots__ = ("worker_id", "round", "ranks")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    round: int
    ranks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, worker_id: _Optional[str] = ..., round: _Optional[int] = ..., ranks: _Optional[_Iterable[int]] = ...) -> None: ...

class UnreachableResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NoticeRequest(_message.Message):
    __slots__ = ("worker_id", "leaving_at")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEAVING_AT_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    leaving_at: float
    def __init__(self, worker_id: _Optional[str] = ..., leaving_at: _Optional[float] = ...) -> None: ...

class NoticeResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EventsRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("hosts_updated", "epoch_broken")
    HOSTS_UPDATED_FIELD_NUMBER: _ClassVar[int]
    EPOCH_BROKEN_FIELD_NUMBER: _ClassVar[int]
    hosts_updated: HostsUpdated
    epoch_broken: EpochBroken
    def __init__(self, hosts_updated: _Optional[_Union[HostsUpdated, _Mapping]] = ..., epoch_broken: _Optional[_Union[EpochBroken, _Mapping]] = ...) -> None: ...

class HostsUpdated(_message.Message):
    __slots__ = ("version", "added", "removed", "next_epoch", "slot", "job_commit", "broken_epoch", "broken_reason", "leave")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ADDED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    NEXT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    JOB_COMMIT_FIELD_NUMBER: _ClassVar[int]
    BROKEN_EPOCH_FIELD_NUMBER: _ClassVar[int]
    BROKEN_REASON_FIELD_NUMBER: _ClassVar[int]
    LEAVE_FIELD_NUMBER: _ClassVar[int]
    version: int
    added: _containers.RepeatedScalarFieldContainer[str]
    removed: _containers.RepeatedScalarFieldContainer[str]
    next_epoch: int
    slot: Slot
    job_commit: int
    broken_epoch: int
    broken_reason: str
    leave: bool
    def __init__(self, version: _Optional[int] = ..., added: _Optional[_Iterable[str]] = ..., removed: _Optional[_Iterable[str]] = ..., next_epoch: _Optional[int] = ..., slot: _Optional[_Union[Slot, _Mapping]] = ..., job_commit: _Optional[int] = ..., broken_epoch: _Optional[int] = ..., broken_reason: _Optional[str] = ..., leave: _Optional[bool] = ...) -> None: ...

class Slot(_message.Message):
    __slots__ = ("hostname", "rank", "local_rank", "cross_rank", "size", "local_size", "cross_size")
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RANK_FIELD_NUMBER: _ClassVar[int]
    CROSS_RANK_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    CROSS_SIZE_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    rank: int
    local_rank: int
    cross_rank: int
    size: int
    local_size: int
    cross_size: int
    def __init__(self, hostname: _Optional[str] = ..., rank: _Optional[int] = ..., local_rank: _Optional[int] = ..., cross_rank: _Optional[int] = ..., size: _Optional[int] = ..., local_size: _Optional[int] = ..., cross_size: _Optional[int] = ...) -> None: ...

class EpochBroken(_message.Message):
    __slots__ = ("epoch", "reason", "rejoin")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REJOIN_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    reason: str
    rejoin: bool
    def __init__(self, epoch: _Optional[int] = ..., reason: _Optional[str] = ..., rejoin: _Optional[bool] = ...) -> None: ...
