"""What the benchmarks share; none of these modules is a benchmark of its own.

* where things are (`paths`) and what a result records about the code and the machine
  (`provenance`, `machine_load`, `profiles`);
* one machine's trials: the systems compared and how they launch (`local_systems`), the
  processes of a trial and their parsed output (`trial_processes`), what the step lines tell
  (`step_timing`), a benchmark file's own workers under `elasticrun` (`elasticrun_launch`);
* the sharded recovery benchmark: its FSDP2 jobs under elasticrun and torchrun
  (`sharded_jobs`), what its workloads' lines tell (`sharded_metrics`), its report
  (`sharded_report`);
* the multi-host bed: both systems on it (`bed_systems`), torchrun's store as a process
  (`torchrun_store`), a spot trace replayed on it (`spot_trace`) and its goodput
  (`goodput_ledger`);
* the driver without real workers: simulated workers (`simulated_workers`, a process of
  their own), the driver's side of them (`simulated_job`), many such processes as one fleet
  (`simulated_fleet`), the driver in a process of its own (`driver_process`), torch's
  TCPStore clients as the reference (`tcpstore_rendezvous`), children's environment and
  limits (`child_processes`);
* a driver watched and abused from outside (`driver_watch`, `abuse_probes`);

Some run as processes of their own (`python -m bench.support.simulated_workers`,
`driver_process`, `abuse_probes`, `tcpstore_rendezvous`, `torchrun_store`): the benchmarks
start them.
"""
