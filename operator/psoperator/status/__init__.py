"""The job's status, computed purely from what was observed: replica counts and the phase they add up
to (replicas.py), conditions (conditions.py), the tracking records (tracking.py), the chief's
progress (progress.py), lastFailure (last_failure.py), and the merge patch that writes it (patch.py)."""
