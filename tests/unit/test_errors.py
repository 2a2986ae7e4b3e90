"""Every exception class the project defines derives from `ElasticError`, so a user catches the
project's failures with one `except`; a bare exception added later fails here."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import elastic
from elastic.errors import ElasticError


def elastic_exception_classes() -> list[type[BaseException]]:
    """Every `BaseException` subclass defined in a module under `elastic/` (the `__main__`
    modules, which run a program when imported, aside)."""
    found: dict[str, type[BaseException]] = {}
    for module_info in pkgutil.walk_packages(elastic.__path__, prefix="elastic."):
        if module_info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        module = importlib.import_module(module_info.name)
        for value in vars(module).values():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__.startswith("elastic.")
            ):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return [found[name] for name in sorted(found)]


def test_every_exception_of_the_project_is_an_elastic_error() -> None:
    classes = elastic_exception_classes()
    assert len(classes) > 10, "the walk found the project's exceptions"
    bare = [f"{c.__module__}.{c.__qualname__}" for c in classes if not issubclass(c, ElasticError)]
    assert bare == [], f"derive these from elastic.errors.ElasticError: {bare}"


def test_exceptions_that_users_catch_as_builtins_keep_those_bases() -> None:
    from elastic.protocol.etcd import EtcdConfigError
    from elastic.torch import NotInitializedError, NotLaunchedError
    from elastic.worker.errors import HostsUpdatedInterrupt, WorkerLostError

    for runtime_error in (
        WorkerLostError,
        HostsUpdatedInterrupt,
        NotInitializedError,
        NotLaunchedError,
    ):
        assert issubclass(runtime_error, RuntimeError)
    assert issubclass(EtcdConfigError, ValueError)


def test_one_name_for_a_worker_the_job_excluded() -> None:
    from elastic.driver.rendezvous import membership

    assert issubclass(membership.NotMemberError, ElasticError)
    assert not hasattr(membership, "NotMember")
