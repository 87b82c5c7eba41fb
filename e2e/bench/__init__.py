"""Benchmark of the operator on the local control plane: one command, a table and a JSON file.

    KUBECONFIG=$(e2e/cluster/cluster.sh up) python -m e2e.bench [--full] [--json bench.json]

Scenarios (sizes: `--full` those of docs/performance.md, the default a short run of the same), for
up to three kinds of the same job (`--kinds`, default all): "ours"; "floor", the same children
created by the benchmark itself; "tfjob", a TFJob of Kubeflow's training-operator v1 (built on first
use, run as a process: see peer.py):
- burst: N jobs (1 chief + 2 PS + 4 workers) created at once, create -> all pods Running, every kind
  in each round (the order reversed every other round), in one run;
- recovery: N jobs Running, one PS failed in each at once: failure -> new chief pod and where the
  time goes (ours, and the floor: the operator's deletions and new chief Job made by the benchmark
  the moment it sees each PS fail, floor.py), failure -> a replacement PS Running and how many
  chiefs were restarted (every kind), each kind in each round as in the burst;
- steady: N Running jobs for some time: the operator's RSS, CPU, API requests (counted by the API
  server) and reconciles, per job per minute; at rest, in training, and at rest after the operator
  restarted (with its peak RSS from the restart until it had reconciled every job); its metrics
  scraped every 30 s, as the chart's ServiceMonitor has Prometheus do; with `--steady-read-round`
  the window at rest lasts one round of the jobs' periodic fresh reads;
- big: one job of P PS + W workers: create -> all pods Running, PS failure -> new chief pod, the
  operator's peak RSS;
- lifecycle: N jobs created, Running, their chiefs exit 0, Succeeded, deleted: the operator's API
  writes and requests per job over the whole lifecycle.

The operator runs as a process under the chart's ServiceAccount, the training-operator under its
own; two FlowSchemas match each account (one for writes, one for everything else) so the API server
counts their requests (`apiserver_flowcontrol_dispatched_requests_total`). Prints figures, asserts
nothing about speed.
"""
