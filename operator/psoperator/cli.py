"""The `psoperator` command: run the operator, render a job's manifests, print the CRD and the metrics
reference, plan PS sizing."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from psoperator import API_TIMEOUT_SECONDS
from psoperator.contract import DEFAULT_PROGRESS_PORT
from psoperator.sizing import cli as sizing_cli

CHIEF_KEY_FILE_ENV = "PSOPERATOR_CHIEF_KEY_FILE"
_CHIEF_KEY_HELP = (
    "a file of at least 32 secret bytes (e.g. `head -c 32 /dev/urandom`), the same for every replica; "
    "each job's chief answers its progress port only to a token derived from it"
)


@dataclass(frozen=True)
class KopfOptions:
    """kopf's own `run` flags, as the keywords of `kopf.configure` and `kopf.run`."""

    logging: dict[str, Any]
    run: dict[str, Any]


_KOPF_LOGGING = ("verbose", "debug", "quiet", "log_format", "log_refkey", "log_prefix")


def _positive(text: str) -> float:
    """An argparse type: a number above zero."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not above zero")
    return value


def _labels(text: str) -> tuple[tuple[str, str], ...]:
    """An argparse type: `name=value,...` as (name, value) pairs, sorted."""
    pairs = [item.strip().partition("=") for item in text.split(",") if item.strip()]
    if any(not name or not equals for name, equals, _ in pairs):
        raise argparse.ArgumentTypeError(f"{text!r} is not name=value,...")
    return tuple(sorted((name.strip(), value.strip()) for name, _, value in pairs))


def kopf_options(argv: Sequence[str]) -> KopfOptions:
    """Parse the flags `psoperator run` does not know with `kopf run`'s own parser.

    So every flag kopf documents (--peering, --log-format, --verbose, ...) means what kopf says and
    is checked as kopf checks it. kopf's command itself cannot be called: it takes no memo, which
    is how the handlers get the operator's state. Exits 2 with kopf's message on a bad flag.
    """
    import click
    from kopf import cli as kopf_cli

    try:
        params = dict(kopf_cli.run.make_context("psoperator run", list(argv)).params)
        if params.pop("modules") or params.pop("paths"):
            raise click.UsageError("the handlers are psoperator's own: no -m/--module and no paths")
        if params["namespaces"] and params["clusterwide"]:
            raise click.UsageError("--namespace or --all-namespaces, not both")
    except click.ClickException as error:
        error.show()
        raise SystemExit(error.exit_code) from None
    # As `kopf run --dev` does: a priority that wins over every other peer.
    if params.pop("dev"):
        params["priority"] = 666
    logging = {key: params.pop(key) for key in _KOPF_LOGGING}
    return KopfOptions(logging=logging, run=params)


def _run(args: argparse.Namespace) -> int:
    # Imported here: rendering and planning must work without the operator's dependencies.
    import kopf

    from psoperator import handlers  # noqa: F401  (registers the handlers)
    from psoperator.control.chief_key import ChiefKey
    from psoperator.control.leader import Election
    from psoperator.control.state import Config, OperatorState
    from psoperator.faults import faults_from_environment
    from psoperator.kube import Kube, load_config
    from psoperator.metrics.registry import Metrics

    options = kopf_options(args.kopf_args)  # a bad flag stops here, before any cluster is touched
    try:
        faults = faults_from_environment()
        if not args.chief_key_file:
            raise ValueError(f"--chief-key-file (or ${CHIEF_KEY_FILE_ENV}) is required: {_CHIEF_KEY_HELP}")
        chief_key = ChiefKey.from_file(args.chief_key_file)
    except ValueError as error:
        return _usage_error("run", str(error))
    load_config()
    metrics = Metrics()
    if args.metrics_port:
        metrics.serve(args.metrics_port)
    election = None
    if args.leader_election:
        if not args.operator_namespace:
            return _usage_error("run", "--leader-election needs --operator-namespace (or $POD_NAMESPACE)")
        election = Election(args.operator_namespace, args.leader_election, args.lease_seconds)
    config = Config(
        cluster_domain=args.cluster_domain,
        operator_namespace=args.operator_namespace or None,
        operator_pod_labels=args.operator_pod_labels,
        resync_seconds=args.resync_seconds,
        resyncs_per_second=args.resyncs_per_second,
        fresh_reads_per_second=args.fresh_reads_per_second,
        progress_port=args.progress_port,
        chief_key=chief_key,
        kueue=args.kueue,
        faults=faults,
    )
    kube = Kube(on_response=metrics.api_request, timeout=args.api_timeout_seconds)
    state = OperatorState(kube, metrics, config, election=election)
    kopf.configure(**options.logging)
    kopf.run(**options.run, memo=kopf.Memo(state=state))
    return 0


def _load_documents(file: str) -> list[Any]:
    """The YAML documents of a file, or of standard input for `-` (kubectl's habit)."""
    text = sys.stdin.read() if file == "-" else Path(file).read_text()
    return list(yaml.safe_load_all(text))


def _usage_error(command: str, message: str) -> int:
    """One line on stderr and argparse's exit code for bad input, instead of a traceback."""
    print(f"psoperator {command}: error: {message}", file=sys.stderr)
    return 2


def _render(args: argparse.Namespace) -> int:
    from psoperator.render import RenderOptions, render_children

    try:
        documents = _load_documents(args.file)
    except OSError as error:
        return _usage_error("render", f"{args.file}: {error.strerror or error}")
    except yaml.YAMLError as error:
        return _usage_error("render", f"{args.file}: not YAML: {' '.join(str(error).split())}")
    out = sys.stdout
    for job in documents:
        if not isinstance(job, dict) or job.get("kind") != "PSTrainingJob":
            continue
        job.setdefault("metadata", {}).setdefault("namespace", args.namespace)
        job["metadata"].setdefault("uid", "00000000-0000-0000-0000-000000000000")
        manifests = render_children(job, RenderOptions(cluster_domain=args.cluster_domain))
        if args.tf_config:
            for pod, text in _tf_configs(manifests):
                out.write(f"{pod}: {json.dumps(json.loads(text), sort_keys=True)}\n")
            continue
        yaml.safe_dump_all(manifests, out, sort_keys=False)
    return 0


def _tf_configs(manifests: list[Any]) -> list[tuple[str, str]]:
    """Each pod's TF_CONFIG, as the kubelet expands it or the runtime composes it from the ConfigMap."""
    from psoperator import contract
    from psoperator.api.names import TF_CONFIG_FILE
    from psoperator.render.tfconfig import INDEX_REFERENCE

    files = [m["data"][TF_CONFIG_FILE] for m in manifests if m["kind"] == "ConfigMap"]
    result = []
    for manifest in manifests:
        if manifest["kind"] not in ("StatefulSet", "Job"):
            continue
        env = {
            e["name"]: e.get("value") for e in manifest["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        for index in range(manifest["spec"].get("replicas", 1)):
            task_env = {**env, contract.ENV_TASK_INDEX: str(index)}
            text = env.get(contract.ENV_TF_CONFIG)
            if text is None and files:
                text = contract.tf_config_from_file(files[0], task_env)
            result.append(
                (f"{manifest['metadata']['name']}-{index}", (text or "").replace(INDEX_REFERENCE, str(index)))
            )
    return result


def _crd(args: argparse.Namespace) -> int:
    from psoperator.api import crd

    return crd.main(write=args.write)


def _metrics(args: argparse.Namespace) -> int:
    from psoperator.metrics import doc as metrics_doc

    return metrics_doc.main(write=args.write)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="psoperator", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run",
        help="run the operator",
        description="Run the operator. Every flag not listed here is `kopf run`'s and passes through.",
        epilog=(
            "kopf's flags (see `kopf run --help`): --namespace/-n NS (repeatable) | --all-namespaces/-A, "
            "--standalone, --liveness URL, --peering NAME, --priority N, --verbose, --debug, --quiet, "
            "--log-format {plain,full,json}, --log-refkey KEY, --log-prefix/--no-log-prefix"
        ),
        # An abbreviation of a kopf flag must reach kopf, not match one of ours.
        allow_abbrev=False,
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        default=_env_int("PSOPERATOR_METRICS_PORT", 0),
        help="serve Prometheus metrics on this port (0: off)",
    )
    run.add_argument(
        "--cluster-domain",
        default="cluster.local",
        help="the cluster's DNS domain, in every TF_CONFIG address",
    )
    run.add_argument(
        "--operator-namespace",
        default=os.environ.get("POD_NAMESPACE", ""),
        help=(
            "the namespace the operator runs in (default: $POD_NAMESPACE, which the chart sets): "
            "the jobs' NetworkPolicies let only it read the chiefs' progress port"
        ),
    )
    run.add_argument(
        "--operator-pod-labels",
        type=_labels,
        default=os.environ.get("PSOPERATOR_POD_LABELS", ""),
        help=(
            "the labels of the operator's own pods, name=value,... (default: $PSOPERATOR_POD_LABELS, "
            "which the chart sets): of --operator-namespace, only those pods may reach the chiefs' "
            "progress port; empty: any pod of it may"
        ),
    )
    run.add_argument(
        "--leader-election",
        metavar="LEASE",
        default="",
        help=(
            "run as one of several replicas: only the holder of the coordination.k8s.io Lease LEASE "
            "in --operator-namespace reconciles jobs (off when empty)"
        ),
    )
    run.add_argument(
        "--lease-seconds",
        type=int,
        default=8,
        help="how long the Lease lasts unrenewed before another replica takes over",
    )
    run.add_argument(
        "--resync-seconds",
        type=_positive,
        default=10.0,
        help="reconcile every job at least this often (progress polling)",
    )
    run.add_argument(
        "--resyncs-per-second",
        type=_positive,
        default=20.0,
        help=(
            "at most this many unwoken reconciles a second across all jobs: with more jobs than "
            "--resync-seconds times this, each job's resync (and progress poll) stretches to fit"
        ),
    )
    run.add_argument(
        "--fresh-reads-per-second",
        type=_positive,
        default=0.5,
        help=(
            "at most this many periodic fresh reads of a job (every 10 minutes each) a second across "
            "all jobs: with more than 300 jobs at 0.5, each job's stretches to fit"
        ),
    )
    run.add_argument(
        "--api-timeout-seconds",
        type=float,
        default=API_TIMEOUT_SECONDS,
        help="give up on an API request that has no answer after this long, and retry",
    )
    run.add_argument(
        "--progress-port",
        type=int,
        default=DEFAULT_PROGRESS_PORT,
        help="port of the chief's progress endpoint (the trainer's PSOP_PROGRESS_PORT)",
    )
    run.add_argument(
        "--chief-key-file",
        default=os.environ.get(CHIEF_KEY_FILE_ENV, ""),
        help=f"required (default: ${CHIEF_KEY_FILE_ENV}, which the chart sets): {_CHIEF_KEY_HELP}",
    )
    run.add_argument(
        "--no-kueue",
        dest="kueue",
        action="store_false",
        help="never queue jobs with Kueue, even where it is installed (labelled jobs wait, saying so)",
    )
    run.set_defaults(func=_run)

    render = sub.add_parser("render", help="print the manifests a job would produce (no cluster needed)")
    render.add_argument("file", help="the PSTrainingJob manifest; - reads standard input")
    render.add_argument("--namespace", default="default", help="of a job whose manifest names none")
    render.add_argument(
        "--cluster-domain",
        default="cluster.local",
        help="the cluster's DNS domain, in every TF_CONFIG address",
    )
    render.add_argument("--tf-config", action="store_true", help="print each pod's TF_CONFIG instead")
    render.set_defaults(func=_render)

    crd = sub.add_parser(
        "crd", help="print the CustomResourceDefinition, or write it into crds/ and the chart"
    )
    crd.add_argument("--write", action="store_true", help="write it into the checkout instead of printing it")
    crd.set_defaults(func=_crd)

    metrics = sub.add_parser(
        "metrics",
        help="print the reference of every Prometheus metric, or write it into docs/reference/metrics.md",
    )
    metrics.add_argument(
        "--write", action="store_true", help="write it into the checkout instead of printing it"
    )
    metrics.set_defaults(func=_metrics)

    sizing_cli.add_plan_command(sub)
    return parser


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else default


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line; `run` keeps the flags it does not know in `kopf_args`, for kopf."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.command != "run":
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.kopf_args = unknown
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args: Any = parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
