"""The rules, one per module, each pure: observed state and the job's status in, a decision out.
recovery.py (what a failure calls for), success.py, deadline.py, ttl.py, stall.py, scheduling.py,
node_lost.py and ps_recycle.py. The stages in plan/stages.py apply them in order."""
