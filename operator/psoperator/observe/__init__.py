"""What the operator sees of a job: the views of its pods, children and nodes (views.py), the watch
cache that reconciles read from (cache.py), and what happened to a pod, as a `Failure` (failures.py).
Nothing here decides anything."""
