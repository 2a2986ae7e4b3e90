"""`--config-file FILE`: launcher flags from a YAML file, as horovodrun's `--config-file`.

Keys are flag names, with '-' or '_' (`min-np: 2`, `host_discovery_script: ./hosts.sh`).
horovodrun's sectioned keys are read where a flag of ours means the same:
`library_options: {gloo_timeout_seconds: S}` is `--collective-timeout S`, and
`logging: {level: DEBUG}` (or TRACE) is `--verbose`. horovodrun's other settings (`controller`,
`params`, `autotune`, `timeline`, `stall_check`, the rest of `library_options` and `logging`)
tune Horovod's own engine, which elasticrun does not have: they are ignored with a warning, so
a Horovod config file works unchanged. Any other key, or a value a flag would refuse, is one
`UsageError` naming the file and the key.
"""

from __future__ import annotations

import argparse
from typing import Any

import yaml

from elastic.driver.cli.flag_sources import FlagValues, convert, flag_actions
from elastic.driver.errors import UsageError

HOROVOD_LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")

HOROVOD_FLAGS = {("library_options", "gloo_timeout_seconds"): "collective_timeout"}
"""horovodrun's sectioned keys that are one of our flags (by dest)."""

HOROVOD_ONLY = {
    "params": {
        "fusion_threshold_mb",
        "cycle_time_ms",
        "cache_capacity",
        "hierarchical_allreduce",
        "hierarchical_allgather",
    },
    "autotune": {
        "enabled",
        "log_file",
        "warmup_samples",
        "steps_per_sample",
        "bayes_opt_max_samples",
        "gaussian_process_noise",
    },
    "timeline": {"filename", "mark_cycles"},
    "stall_check": {"enabled", "warning_time_seconds", "shutdown_time_seconds"},
    "library_options": {"mpi_threads_disable", "num_nccl_streams", "ccl_bgt_affinity"},
    "logging": {"with_timestamp"},
}
"""horovodrun's sectioned keys that tune Horovod's engine: ignored with a warning."""


def read_config_file(path: str) -> Any:
    """The file's YAML content; `UsageError` when it cannot be read or is not YAML."""
    try:
        with open(path, encoding="utf-8") as file:
            return yaml.safe_load(file)
    except OSError as err:
        raise UsageError(f"--config-file {path}: {err.strerror or err}") from None
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        problem = getattr(err, "problem", None) or err
        raise UsageError(f"config file {path}: not valid YAML{line}: {problem}") from None


def config_flags(
    parser: argparse.ArgumentParser, path: str, content: Any
) -> tuple[FlagValues, list[str]]:
    """The flags that a config file's parsed `content` gives, and the horovodrun-only keys it
    holds (as `section.key`, for one warning). Raise `UsageError` naming `path` and the key for
    an unknown key or a bad value."""
    found = FlagValues()
    ignored: list[str] = []
    if content is None:  # an empty file
        return found, ignored
    if not isinstance(content, dict):
        raise UsageError(f"config file {path}: expected 'flag: value' lines, got {content!r}")
    names = flag_actions(parser)
    for key, value in content.items():
        source = f"config file {path}, key {key}"
        name = str(key).replace("-", "_").upper()
        if name == "CONFIG_FILE":
            raise UsageError(f"{source}: a config file cannot name another")
        if name in names:
            if value is not None:
                found.put(names[name].dest, convert(names[name], value, source), source)
        elif key == "controller" or str(key) in HOROVOD_ONLY or key == "library_options":
            _horovod_section(parser, path, str(key), value, found, ignored)
        else:
            raise UsageError(f"{source}: no such elasticrun flag (see elasticrun --help)")
    return found, ignored


def _horovod_section(
    parser: argparse.ArgumentParser,
    path: str,
    section: str,
    value: Any,
    found: FlagValues,
    ignored: list[str],
) -> None:
    """Read one of horovodrun's sections into `found` and `ignored`."""
    if section == "controller":  # gloo or mpi: elasticrun runs torch.distributed either way
        ignored.append(section)
        return
    if not isinstance(value, dict):
        raise UsageError(f"config file {path}, key {section}: expected a section of keys")
    actions = {action.dest: action for action in flag_actions(parser).values()}
    for key, item in value.items():
        source = f"config file {path}, key {section}.{key}"
        dest = HOROVOD_FLAGS.get((section, str(key)))
        if dest is not None:
            found.put(dest, convert(actions[dest], item, source), source)
        elif (section, key) == ("logging", "level"):
            level = str(item).upper()
            if level not in HOROVOD_LOG_LEVELS:
                raise UsageError(f"{source}: use one of {', '.join(HOROVOD_LOG_LEVELS)}")
            found.put("verbose", level in ("TRACE", "DEBUG"), source)
        elif key in HOROVOD_ONLY.get(section, ()):
            ignored.append(f"{section}.{key}")
        else:
            raise UsageError(f"{source}: no such horovodrun setting")
