"""Success: the chief's completion is the job's; then the long-running roles are cleaned up."""

from __future__ import annotations

from datetime import datetime

from psoperator.api.models import PSTrainingJobSpec
from psoperator.api.vocabulary import Phase
from psoperator.observe.views import Observed
from psoperator.timeutil import parse_time


def chief_succeeded(observed: Observed, attempt: int) -> bool:
    job = observed.current_chief_job(attempt)
    return job is not None and job.succeeded


def chief_completed_at(observed: Observed, attempt: int) -> datetime | None:
    """When the chief of this attempt completed: its Job's completionTime, else its pod's
    finishedAt; None while it has not succeeded, or when neither is known."""
    job = observed.current_chief_job(attempt)
    if job is None or not job.succeeded:
        return None
    pod = observed.last_chief_pod(attempt)
    finished = pod.terminated.finished_at if pod is not None and pod.terminated is not None else None
    return parse_time(job.completion_time) or parse_time(finished)


def stop_pods_after_finish(spec: PSTrainingJobSpec) -> bool:
    """Parameter servers and workers never exit on their own: stop them unless cleanPodPolicy is None.

    All and Running mean the same here, since every pod left when the chief finished is running.
    """
    return spec.run_policy.clean_pod_policy != "None"


def stop_chief_after_finish(spec: PSTrainingJobSpec, phase: Phase, observed: Observed, attempt: int) -> bool:
    """A job that failed while its chief still ran (the deadline passed, a PS never started, a worker
    has a bug) stops the chief with the other roles: its Job is suspended, which deletes the pod.

    A chief Job that ended by itself (completed, or failed) is left as it ended: its record stays.
    """
    job = observed.current_chief_job(attempt)
    still_runs = job is not None and not (job.succeeded or job.failed)
    return phase is Phase.FAILED and stop_pods_after_finish(spec) and still_runs
