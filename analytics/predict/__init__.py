"""The failure predictor: labels from fault events, features, training, evaluation, scoring.

``history``: a subject's own fault history as features and "fails within H" labels.
``model``: gradient boosting with calibrated probabilities, time splits, save/load.
``metrics``: PR-AUC, precision/recall at a threshold, lead time.
``stepfun``: the REAL StepFun fault trace as a benchmark problem.
"""
