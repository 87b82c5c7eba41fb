"""The running operator: what it keeps, one `JobState` per job (state.py), each job's loop and its
pace (loop.py), one reconcile's reads and writes in order (protocol.py), the chief's progress
(polling.py) and leader election (leader.py)."""
