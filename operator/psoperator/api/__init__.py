"""The PSTrainingJob API: its models (models.py), the words of its status (vocabulary.py), the labels
on its children (labels.py), its children's names (names.py) and the CRD generated from the models
(crd.py, schemas/)."""
