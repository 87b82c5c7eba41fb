"""The decision of one reconcile, pure: the named stages (stages.py) that build it on one draft
(draft.py), and the children diff (children.py) that says what to change so the children are as
rendered. The API calls that carry it out are kube.py's; the order they run in is control/'s."""
