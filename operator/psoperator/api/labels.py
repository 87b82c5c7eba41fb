"""The labels and annotations on a job's children and pods: what the renderers write and the watches,
the cache, the views and the API client read."""

from __future__ import annotations

from psoperator import GROUP

LABEL_JOB = f"{GROUP}/job-name"
LABEL_ROLE = f"{GROUP}/role"
LABEL_ATTEMPT = f"{GROUP}/attempt"
ANNOTATION_HASH = f"{GROUP}/spec-hash"
# On a pod template: the name of the container that runs the training code, as opposed to sidecars.
# Set by the user to choose it, else by the renderer to the template's first container.
ANNOTATION_TRAINER_CONTAINER = f"{GROUP}/trainer-container"
# The StatefulSet controller labels each pod with its ordinal (Kubernetes >= 1.28).
LABEL_POD_INDEX = "apps.kubernetes.io/pod-index"
# Kueue's labels on a job (queueing.py): the LocalQueue it waits in, and its WorkloadPriorityClass.
LABEL_QUEUE = "kueue.x-k8s.io/queue-name"
LABEL_PRIORITY_CLASS = "kueue.x-k8s.io/priority-class"
# The kinds of a job's children, as the renderers make them and the API client lists them; a
# queued job's Workload is one only where Kueue is installed (QUEUE_KINDS).
CHILD_KINDS = ("ConfigMap", "Service", "StatefulSet", "Job", "NetworkPolicy", "Workload")
QUEUE_KINDS = ("Workload",)
