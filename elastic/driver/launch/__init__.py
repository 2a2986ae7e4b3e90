"""Starting worker processes and reaching hosts.

A `Launcher` (`launcher.py`: the interface) starts one worker and returns a `WorkerProcess`
to watch and signal: `local.py` on this machine, `ssh.py` (with `ssh_agent.py` on the other
end) on another host, and, when the job's state outlives the driver, detached (`detached.py`
under a `keeper.py`, `ssh_detached.py` remotely) so that workers outlive it too. `HostAccess`
(`host_access.py`) picks the launcher per host; the `Fleet` (`fleet.py`) numbers, starts,
follows and stops the job's workers, and `staffing.py` puts them on free slots;
`standbys.py` keeps warm standby processes on the job's hosts that refilled slots start in.
"""
