"""ps-training-operator: a Kubernetes operator for TensorFlow parameter-server training jobs."""

GROUP = "psoperator.io"
VERSION = "v1alpha1"
KIND = "PSTrainingJob"
PLURAL = "pstrainingjobs"
# Seconds the operator waits for an answer to an API request before it gives up and retries.
API_TIMEOUT_SECONDS = 30.0
