"""The PSTrainingJob API: its models (models.py), the words of its status (vocabulary.py), the labels
on its children (labels.py), its children's names (names.py), a job's shape (shape.py) and the CRD
generated from the models (crd.py: the models' schemas by crd_schema.py, the rules of crd_rules.py,
the upstream schemas of schemas/)."""
