"""Benchmark: start-up and PS-failure recovery of a large job on the local control plane.

Prints figures; asserts nothing about speed (a timed test would flake on a noisy machine).

    python -m e2e.bench_recovery --ps 8 --workers 200 --rounds 5

Measures, with the operator running as a process against the cluster:
- create -> Running: children created, all pods scheduled and running (KWOK), status written;
- PS failure -> new chief pod: the coordinated restart the operator makes at once;
- PS failure -> Running again;
- the operator's own reconcile durations (from its Prometheus metrics).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from kubernetes import client, config

from e2e import chaos, psjobs
from e2e.conftest import OperatorProcess
from e2e.util import free_port, wait_for

CRD = Path(__file__).resolve().parent.parent / "crds" / "psoperator.io_pstrainingjobs.yaml"


def _summary(label: str, values: list[float]) -> str:
    return (
        f"{label:<32} n={len(values):<3} min={min(values):6.2f}s  median={statistics.median(values):6.2f}s  "
        f"max={max(values):6.2f}s"
    )


def _reconcile_seconds(port: int) -> tuple[float, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    values = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("psoperator_reconcile_duration_seconds_")
    }
    ok = '{outcome="ok"}'
    return values.get(f"psoperator_reconcile_duration_seconds_count{ok}", 0.0), values.get(
        f"psoperator_reconcile_duration_seconds_sum{ok}", 0.0
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ps", type=int, default=8)
    parser.add_argument("--workers", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    kubeconfig = os.environ.get("KUBECONFIG")
    if not kubeconfig:
        sys.exit("set KUBECONFIG (e.g. KUBECONFIG=$(e2e/cluster/cluster.sh up))")
    api = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    core = client.CoreV1Api(api)
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    wait_for(lambda: core.read_namespaced_service_account("default", namespace), timeout=30, message="sa")
    os.system(
        f"{Path.home()}/.cache/psoperator/bin/kubectl --kubeconfig {kubeconfig} apply --server-side "
        f"-f {CRD} >/dev/null"
    )

    metrics_port = free_port()
    log = Path(tempfile.mkdtemp()) / "operator.log"
    operator = OperatorProcess(Path(kubeconfig), namespace, log, ["--metrics-port", str(metrics_port)])
    operator.start()
    try:
        cpu_worker = {"replicas": args.workers, "template": {"spec": {"containers": [{"name": "trainer"}]}}}
        started = time.monotonic()
        psjobs.create(api, namespace, psjobs.manifest("big", ps={"replicas": args.ps}, worker=cpu_worker))
        psjobs.wait_phase(api, namespace, "big", "Running", timeout=600)
        wait_for(
            lambda: (
                psjobs.status(api, namespace, "big").get("workersReady") == f"{args.workers}/{args.workers}"
            ),
            timeout=600,
            message="all workers ready",
        )
        startup = time.monotonic() - started
        wait_for(
            lambda: psjobs.status(api, namespace, "big")["tracking"]["psEstablished"],
            timeout=60,
            message="PS established",
        )

        to_chief, to_running = [], []
        for attempt in range(1, args.rounds + 1):
            chief_uid = psjobs.running_pod(api, namespace, "big", "chief")["metadata"]["uid"]
            victim = psjobs.running_pod(api, namespace, "big", "ps", attempt % args.ps)["metadata"]["name"]
            failed_at = time.monotonic()
            chaos.fail_container(api, namespace, victim, exit_code=1)

            def new_chief(uid: str = chief_uid, n: int = attempt) -> bool:
                return any(
                    p["metadata"]["uid"] != uid
                    and p["metadata"]["labels"].get(psjobs.LABEL_ATTEMPT) == str(n)
                    for p in psjobs.live_pods(api, namespace, "big", "chief")
                )

            wait_for(new_chief, timeout=120, interval=0.05, message=f"chief of attempt {attempt}")
            to_chief.append(time.monotonic() - failed_at)
            psjobs.wait_phase(api, namespace, "big", "Running", timeout=300)
            wait_for(
                lambda: psjobs.status(api, namespace, "big")["tracking"]["psEstablished"],
                timeout=120,
                message="PS established again",
            )
            to_running.append(time.monotonic() - failed_at)

        count, total = _reconcile_seconds(metrics_port)
        pods = 1 + args.ps + args.workers
        print(
            f"job: 1 chief + {args.ps} PS + {args.workers} workers = {pods} pods on "
            f"{len(core.list_node().items)} simulated nodes"
        )
        print(f"{'create -> all pods running':<32} {startup:6.2f}s")
        print(_summary("PS failure -> new chief pod", to_chief))
        print(_summary("PS failure -> Running again", to_running))
        print(f"{'operator reconciles':<32} n={int(count)}  mean={total / max(count, 1) * 1000:6.1f}ms")
        print(f"{'restarts recorded in status':<32} {psjobs.status(api, namespace, 'big')['restarts']}")
    finally:
        operator.stop()
        core.delete_namespace(namespace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
