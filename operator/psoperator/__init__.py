"""ps-training-operator: a Kubernetes operator for TensorFlow parameter-server training jobs."""

GROUP = "psoperator.io"
VERSION = "v1alpha1"
KIND = "PSTrainingJob"
PLURAL = "pstrainingjobs"
