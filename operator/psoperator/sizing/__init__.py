"""Parameter-server sizing, pure functions and no I/O: Kubernetes quantities (quantity.py), how
TensorFlow shards and places a model on the PS (placement.py), the planner that turns model hints
into a PS count and memory (planner.py), the admission check of a job's PS memory (admission.py),
the advice after an OOMKilled PS (oom.py) and `psoperator plan` (cli.py). The planner backs all of
them, so the CLI and the operator never disagree about a number."""
