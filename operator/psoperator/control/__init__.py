"""The running operator: what it keeps, one `JobState` per job (state.py), each job's loop and its
pace (loop.py), one reconcile's reads and writes in order (reconciler.py), the chief's progress
(chief_client.py) and leader election (leader.py)."""
