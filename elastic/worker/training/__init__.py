"""Training helpers built on the collectives, under Horovod's names.

`DistributedOptimizer` (`optimizer`) wraps any torch optimizer so that `step()` applies
gradients averaged (or summed) over the ranks; their reduction starts while backward runs
(`gradient_reducer`; sparse gradients in `sparse_gradients`). `SyncBatchNorm` normalizes
with statistics over every rank's batch. `broadcast_parameters` and
`broadcast_optimizer_state` (`state_broadcasts`) make every rank start from the root's state.
`hvd.elastic.DistributedDataParallel` (`ddp`; its gradient reduction in `ddp_gradients`, what
it refuses in `ddp_checks`) is torch's DDP rebuilt over each round's process group.

A peer lost during any of them raises `WorkerLostError`, as the collectives do; an optimizer
step whose reduction failed is dropped, so that it runs again after the job re-forms.
"""
