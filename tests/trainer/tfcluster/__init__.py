"""Test kit: run a PSTrainingJob's rendered pods as local processes in private network namespaces."""
