"""The benchmark suite: every figure the docs publish, and the command that measures it again.

    python -m bench list                  every benchmark: name, time, the table it makes
    python -m bench run NAME [ARGS...]    run one; its JSON goes to bench/results/

* `catalog.py`: the entries, one per published table (name, module, arguments, time, needs);
* the other modules of this folder are the benchmarks themselves, one file each, named after
  what they measure; each has `main(argv)`;
* `support/`: what they share (launching and watching trials, simulated workers, the
  multi-host bed's systems, provenance); none of it is a benchmark;
* `workloads/`: the training scripts the recovery benchmarks run under elasticrun and
  torchrun (a tiny MLP; an FSDP2 language model for the sharded one);
* `results/`: their JSON and transcripts (not committed).
"""
