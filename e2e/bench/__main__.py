"""`python -m e2e.bench [--full] [--scenarios burst,recovery,steady,big] [--kinds ours,floor,tfjob]
[--json PATH]`: see __init__."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from kubernetes import client, config

from e2e.accounts import CHART_NAMESPACE, chart_account_kubeconfig
from e2e.bench import measure, peer, scenarios, traced
from e2e.clusters import CRD_FILE
from e2e.kubectl import kubectl
from e2e.operator_process import OperatorProcess
from e2e.util import free_port

SCENARIOS = ("burst", "recovery", "steady", "big", "lifecycle")
KINDS = ("ours", "floor", "tfjob")


@dataclass(frozen=True)
class Sizes:
    burst_jobs: int
    burst_rounds: int  # each round runs every kind, in reversed order every other round
    recovery_jobs: int
    recovery_rounds: int  # as the burst's
    steady_jobs: int
    steady_seconds: float
    big_ps: int
    big_workers: int
    lifecycle_jobs: int


SHORT = Sizes(20, 2, 20, 2, 50, 60, 10, 500, 20)
FULL = Sizes(200, 2, 100, 2, 1000, 300, 50, 5000, 100)


def run(
    bench: scenarios.Bench, sizes: Sizes, chosen: list[str], kinds: list[str], read_round: bool = False
) -> dict[str, Any]:
    results: dict[str, Any] = {"sizes": asdict(sizes)}
    if "burst" in chosen:
        results["burst"] = _rounds(
            kinds, sizes.burst_rounds, "burst", lambda kind: scenarios.burst(bench, kind, sizes.burst_jobs)
        )
    if "recovery" in chosen:
        results["recovery"] = _rounds(
            kinds,
            sizes.recovery_rounds,
            "recovery",
            lambda kind: scenarios.recovery(bench, kind, sizes.recovery_jobs),
        )
    if "steady" in chosen:
        results["steady"] = scenarios.steady(bench, sizes.steady_jobs, sizes.steady_seconds, read_round)
    if "big" in chosen:
        results["big"] = scenarios.big(bench, sizes.big_ps, sizes.big_workers)
    if "lifecycle" in chosen:
        results["lifecycle"] = scenarios.lifecycle(bench, sizes.lifecycle_jobs)
    return results


def _rounds(
    kinds: list[str], rounds: int, scenario: str, run_one: Callable[[str], dict[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    """Every kind in each round, in reversed order every other round: the kinds see the same cluster."""
    results: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    for r in range(rounds):
        for kind in kinds if r % 2 == 0 else kinds[::-1]:
            results[kind].append(run_one(kind))
            seconds = results[kind][-1].get("seconds") or results[kind][-1]["ps_replaced_seconds"]
            print(f"{scenario} round {r + 1} {kind}: {measure.percentiles(seconds)}", flush=True)
    return results


def _row(label: str, value: str, note: str = "") -> str:
    return f"{label:<56} {value:<40} {note}"


STAGES = (
    "inject_to_ps_failed",
    "ps_failed_to_chief_stopping",
    "chief_stopping_to_old_pods_gone",
    "old_pods_gone_to_new_chief",
)


def _ratios(p: dict[str, dict[str, float]], q: str) -> str:
    return ", ".join(f"ours/{kind} {p['ours'][q] / p[kind][q]:.2f}" for kind in p if kind != "ours")


def _burst_rows(sizes: dict[str, Any], burst: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = []
    for i in range(len(burst["ours"])):
        p = {kind: measure.percentiles(rounds[i]["seconds"]) for kind, rounds in burst.items()}
        label = f"burst {sizes['burst_jobs']} jobs, round {i + 1}: create -> Running"
        for q in ("p50", "p95", "p99", "last"):
            values = " ".join(f"{kind} {p[kind][q]:5.2f}s" for kind in p)
            lines.append(_row(f"{label} {q}", values, _ratios(p, q)))
        for kind, rounds in burst.items():
            if rounds[i]["writes_per_job"] is not None:
                counts = f"{rounds[i]['writes_per_job']:.1f} / {rounds[i]['requests_per_job']:.1f}"
                lines.append(_row(f"  {kind}: operator API writes / requests per job", counts))
    return lines


def _percentile_text(values: list[float]) -> str:
    p = measure.percentiles(values)
    return f"p50 {p['p50']:.2f}s p99 {p['p99']:.2f}s max {p['last']:.2f}s"


def _recovery_rows(sizes: dict[str, Any], recovery: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = []
    for i in range(len(recovery["ours"])):
        runs, label = (
            {kind: rounds[i] for kind, rounds in recovery.items()},
            f"recovery, {sizes['recovery_jobs']} jobs, round {i + 1}",
        )
        restarting = {kind: r for kind, r in runs.items() if "seconds" in r}
        for kind, r in restarting.items():
            lines.append(_row(f"{label}: PS failure -> new chief ({kind})", _percentile_text(r["seconds"])))
            lines += [_row(f"  {s.replace('_', ' ')}", _percentile_text(r[s])) for s in STAGES]
            if "deciding" in r:
                lines += _deciding_rows(r["deciding"])
        if len(restarting) > 1:
            p = {kind: measure.percentiles(r["seconds"]) for kind, r in restarting.items()}
            lines.append(_row("  new chief", f"p50 {_ratios(p, 'p50')}; p99 {_ratios(p, 'p99')}"))
        for kind, r in runs.items():
            restarted = f"chief restarted in {r['chiefs_restarted']} of {r['jobs']} jobs"
            text = _percentile_text(r["ps_replaced_seconds"])
            lines.append(_row(f"{label}: PS failure -> new PS Running ({kind})", text, restarted))
    return lines


def _deciding_rows(d: dict[str, Any]) -> list[str]:
    """The operator from the failures until every old chief was asked to stop (measure.load_between)."""
    requests = ", ".join(f"{verb} {count:.0f} at {ms:.0f} ms" for verb, (count, ms) in d["requests"].items())
    count, ms = d["reconciles"]
    reconciles = f"{count:.0f} at {ms:.0f} ms; {d['reconciles_at_once']:.1f}"
    return [
        _row(
            f"  while deciding, {d['seconds']:.1f}s: CPU (the event loop's)",
            f"{d['cpu_percent']:.0f}% ({d['loop_cpu_percent']:.0f}%) of a core",
        ),
        _row("    API requests: count at mean; in flight", f"{requests}; {d['requests_in_flight']:.1f}"),
        _row("    reconciles: count at mean; at once", reconciles),
    ]


def _steady_rows(sizes: dict[str, Any], steady: dict[str, dict[str, float]]) -> list[str]:
    lines = []
    for window, s in steady.items():
        label = f"steady, {sizes['steady_jobs']} Running jobs, {window}, {s['seconds']:.0f}s"
        lines.append(_row(f"{label}: RSS, CPU", f"{s['rss_mib']:.0f} MiB, {s['cpu_percent']:.1f}% of a core"))
        if "peak_rss_mib" in s:
            peak = f"{s['peak_rss_mib']:.0f} MiB"
            lines.append(_row("  peak RSS from the restart until every job was reconciled", peak))
        requests = f"{s['requests_per_job_minute']:.2f} ({s['writes_per_job_minute']:.2f})"
        lines.append(_row("  per job per minute: API requests (writes)", requests))
        polls = f"{s['reconciles_per_job_minute']:.2f}, {s['progress_fetches_per_job_minute']:.2f}"
        lines.append(_row("  per job per minute: reconciles, progress polls", polls))
        lines.append(_row("  the process's CPU per reconcile", f"{s['cpu_ms_per_reconcile']:.2f} ms"))
        if "job_reads_peak_per_minute" in s:
            lines.append(
                _row("  the most jobs read fresh in a minute", f"{s['job_reads_peak_per_minute']:.0f}")
            )
    return lines


def _big_rows(sizes: dict[str, Any], b: dict[str, float]) -> list[str]:
    label = f"big job, {sizes['big_ps']} PS + {sizes['big_workers']} workers"
    return [
        _row(f"{label}: create -> Running", f"{b['startup_seconds']:.1f}s"),
        _row(
            "  PS failure -> new chief; peak operator RSS",
            f"{b['recovery_seconds']:.2f}s; {b['peak_rss_mib']:.0f} MiB",
        ),
        _row(
            "  inject -> PS Failed -> chief stopping -> old pods gone -> new",
            " / ".join(f"{b.get(k, 0):.2f}s" for k in STAGES),
        ),
    ]


def _lifecycle_rows(sizes: dict[str, Any], life: dict[str, Any]) -> list[str]:
    label = f"lifecycle, {sizes['lifecycle_jobs']} jobs: create -> Succeeded -> deleted"
    counts = f"{life['writes_per_job']:.1f} / {life['requests_per_job']:.1f}"
    by_request = life["writes_per_job_by_request"]
    kopf = life["writes_per_job"] - sum(by_request.values())
    parts = [f"{request} {n:.1f}" for request, n in by_request.items()] + [f"kopf (events) {kopf:.1f}"]
    return [
        _row(f"{label}: operator API writes / requests per job", counts),
        _row("  writes per job, by request", ", ".join(parts)),
    ]


def table(results: dict[str, Any]) -> list[str]:
    rows: dict[str, Callable[[dict[str, Any], Any], list[str]]] = {
        "burst": _burst_rows,
        "recovery": _recovery_rows,
        "steady": _steady_rows,
        "big": _big_rows,
        "lifecycle": _lifecycle_rows,
    }
    lines = [_row("metric", "value", "note")]
    for scenario, rows_of in rows.items():
        if scenario in results:
            lines += rows_of(results["sizes"], results[scenario])
    return lines


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="the operator's benchmark (see e2e/bench/__init__.py)")
    parser.add_argument(
        "--full", action="store_true", help="docs/performance.md's sizes (long: tens of minutes)"
    )
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated subset")
    parser.add_argument("--kinds", default=",".join(KINDS), help="ours and any of floor, tfjob")
    parser.add_argument("--json", type=Path, default=Path("bench.json"))
    parser.add_argument("--steady-jobs", type=int, help="the steady scenario's jobs instead of the size's")
    parser.add_argument(
        "--steady-read-round",
        action="store_true",
        help="the steady scenario's window at rest lasts until the operator has read every job once "
        "more, so that it holds one round of their periodic fresh reads (1,000 jobs: about 70 minutes; they "
        "were read together at their start, then are read in turn), and prints the most read in a minute",
    )
    parser.add_argument(
        "--trace-memory",
        action="store_true",
        help="run the operator under tracemalloc and report where its memory is after the steady "
        "scenario's windows at rest and after the restart (e2e/bench/traced.py; its CPU figures are "
        "then not the operator's)",
    )
    args = parser.parse_args()
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    args.kinds = [k for k in KINDS if k in args.kinds.split(",")]  # in KINDS' order
    if unknown := set(args.scenarios) - set(SCENARIOS):
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    if "ours" not in args.kinds:
        parser.error(f"--kinds: ours and any of floor, tfjob (known: {', '.join(KINDS)})")
    if not os.environ.get("KUBECONFIG"):
        sys.exit("set KUBECONFIG (e.g. KUBECONFIG=$(e2e/cluster/cluster.sh up))")
    return args


def _our_account(api: client.ApiClient) -> measure.Account:
    accounts = client.CoreV1Api(api).list_namespaced_service_account(CHART_NAMESPACE).items
    names = [str(a.metadata.name) for a in accounts if a.metadata and a.metadata.name != "default"]
    return measure.Account(CHART_NAMESPACE, names[0], "psoperator-bench", 600)


def main() -> int:
    args = _arguments()
    sizes = FULL if args.full else SHORT
    if args.steady_jobs:
        sizes = replace(sizes, steady_jobs=args.steady_jobs)
    kubeconfig = Path(os.environ["KUBECONFIG"])
    api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    workdir = Path(tempfile.mkdtemp(prefix="psoperator-bench-"))
    operator_kubeconfig = chart_account_kubeconfig(kubeconfig, api, "psoperator", workdir / "kubeconfig")
    accounts = {"ours": _our_account(api)}
    busiest = max(sizes.burst_jobs * 7, sizes.steady_jobs * 7, 1 + sizes.big_ps + sizes.big_workers)
    nodes = measure.add_nodes(api, busiest)
    metrics_port = free_port()
    arguments = ["--metrics-port", str(metrics_port)]
    launcher = "e2e.bench.traced" if args.trace_memory else "psoperator"
    operator = OperatorProcess(
        operator_kubeconfig, "bench-ours-*", workdir / "operator.log", arguments, launcher
    )
    memory_report = workdir / "memory.txt" if args.trace_memory else None
    if memory_report:
        operator.extra_env[traced.REPORT_ENV] = str(memory_report)
    processes: list[OperatorProcess] = [operator]
    try:
        operator.start()
        if "tfjob" in args.kinds:
            processes.append(peer.start(kubeconfig, workdir))
            accounts["tfjob"] = measure.Account(peer.NAMESPACE, peer.ACCOUNT, "psoperator-bench-tfjob", 602)
        for account in accounts.values():
            measure.count_requests(api, account)
        bench = scenarios.Bench(api, kubeconfig, operator, metrics_port, accounts, memory_report)
        scenarios.wait_watching(bench)
        results = run(bench, sizes, args.scenarios, args.kinds, args.steady_read_round)
    finally:
        for process in processes:
            process.stop()
            print(f"log: {process.log_path}")
        measure.remove_nodes(api, nodes)
    print("\n".join(table(results)))
    args.json.write_text(json.dumps(results, indent=1))
    print(f"written: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
