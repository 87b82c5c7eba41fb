"""Success: the chief's completion is the job's; then the long-running roles are cleaned up."""

from __future__ import annotations

from psoperator.api import PSTrainingJobSpec
from psoperator.observe import Observed


def chief_succeeded(observed: Observed, attempt: int) -> bool:
    job = observed.current_chief_job(attempt)
    return job is not None and job.succeeded


def stop_pods_after_finish(spec: PSTrainingJobSpec) -> bool:
    """Parameter servers and workers never exit on their own: stop them unless cleanPodPolicy is None.

    All and Running mean the same here, since every pod left when the chief finished is running.
    """
    return spec.run_policy.clean_pod_policy != "None"
