"""What not rolling back costs a step (`--rollback step`): `TorchState`'s post-hook on its
optimizer (it counts the step and marks it unbooked) and the booking mark that
`record_batch`, the next `DistributedOptimizer.step()` and a DDP forward make.

    python -m bench run step_count_cost

Times, in one process with `timeit` (best of 5 repeats of 20,000 calls, 3 rounds), a plain SGD
step of a tiny model with and without the hook, and the booking mark alone; the difference is
what each step pays, to set against the step times of the training-step table. Prints a JSON
document.
"""

from __future__ import annotations

import argparse
import json
import timeit

REPEATS, CALLS = 5, 20_000


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    import torch

    from elastic.state.torch_state import TorchState
    from elastic.worker.training import step_boundary

    def optimizer() -> torch.optim.Optimizer:
        model = torch.nn.Linear(4, 4)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        return torch.optim.SGD(model.parameters(), lr=0.1)

    bare, tracked = optimizer(), optimizer()
    state = TorchState(optimizer=tracked)  # registers the hook on `tracked`

    def best(call) -> float:
        return min(timeit.repeat(call, number=CALLS, repeat=REPEATS)) / CALLS * 1e6

    rounds = []
    for _ in range(args.rounds):
        plain, hooked = best(bare.step), best(tracked.step)
        rounds.append({"step_us": round(plain, 3), "step_with_hook_us": round(hooked, 3),
                       "hook_us": round(hooked - plain, 3),
                       "booking_mark_us": round(best(step_boundary.boundary), 3)})  # fmt: skip
    assert state.commit_count == 0 and state._steps == args.rounds * REPEATS * CALLS
    hooks = sorted(r["hook_us"] for r in rounds)
    doc = {"benchmark": "step_count_cost", "rounds": rounds,
           "hook_us_median": hooks[len(hooks) // 2]}  # fmt: skip
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
