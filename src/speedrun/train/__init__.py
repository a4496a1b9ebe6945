"""Training: the loop (loop.py), its schedules, the gradient sums, the process group.

`python -m speedrun.train` and `torchrun ... -m speedrun.train` run cli.train.main (the command line stays out of the loop).
"""
