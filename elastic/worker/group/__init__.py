"""One round's process group: the communicator that a round's collectives run on.

Entering a round (`formation`) takes this worker's slot in it, forms the default
`torch.distributed` group over the round's key-value store (`process_group`: Gloo, and NCCL
too for CUDA tensors) and installs the context that collectives read. Each formation keys its
store apart, so a new group never reads the addresses published for an old one. When the
round ends, its group is abandoned, not destroyed: a collective may still be blocked on a
dead peer, and destroying the group would wait for it.

Gloo binds the interface that reaches the driver unless the user names one
(`gloo_interface`). A collective that stays blocked makes the worker probe its peers
(`reachability`) and report the silent ones to the driver, which then breaks the round.
"""
