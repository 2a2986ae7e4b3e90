"""The rendezvous: the driver forms rounds, workers join them.

A round is one formed membership of the job, numbered from 1: its members in rank order and
each one's slot (`assignment.py`: rank, local and cross rank, Horovod's way). Workers join the
first round newer than the one they were in, waiting until it forms (`membership.py`); every
request for a new round made before it forms is answered by that one round (`batcher.py`), and
the `RoundKeeper` (`round_keeper.py`) forms and breaks rounds and tells the workers. Each
round's torch.distributed keys live under their own prefix in the rendezvous key-value store
(`store.py`: the interface; `memory_store.py`), so one round never sees another's.
"""
