"""Benchmark of the operator on the local control plane: one command, a table and a JSON file.

    KUBECONFIG=$(e2e/cluster/cluster.sh up) python -m e2e.bench [--full] [--json bench.json]

Scenarios (sizes: `--full` is the issue's, the default a short run of the same):
- burst: N jobs (1 chief + 2 PS + 4 workers) created at once, create -> all pods Running, with the
  operator ("ours") and with the same children created by the benchmark itself ("floor"),
  interleaved round by round in one run;
- recovery: N jobs Running, one PS failed in each at once: failure -> new chief pod;
- steady: N Running jobs for some time: the operator's RSS, CPU, API requests (counted by the API
  server) and reconciles, per job per minute;
- big: one job of P PS + W workers: create -> all pods Running, PS failure -> new chief pod, the
  operator's peak RSS;
- lifecycle: N jobs created, Running, their chiefs exit 0, Succeeded, deleted: the operator's API
  writes and requests per job over the whole lifecycle.

The operator runs as a process under the chart's ServiceAccount; two FlowSchemas match that account
(one for writes, one for everything else) so the API server counts its requests
(`apiserver_flowcontrol_dispatched_requests_total`). Prints figures, asserts nothing about speed.
"""
