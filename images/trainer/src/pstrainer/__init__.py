"""pstrainer: the TensorFlow parameter-server training runtime of ps-training-operator."""

__version__ = "0.1.0"
