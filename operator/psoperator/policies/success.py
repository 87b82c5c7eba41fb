"""Success: the chief's completion is the job's; then the long-running roles are cleaned up."""

from __future__ import annotations

from psoperator.api.models import PSTrainingJobSpec
from psoperator.api.vocabulary import Phase
from psoperator.observe.views import Observed


def chief_succeeded(observed: Observed, attempt: int) -> bool:
    job = observed.current_chief_job(attempt)
    return job is not None and job.succeeded


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
