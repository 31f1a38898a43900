"""Metrics logged by training and evaluation: rehearsal fidelity (``fidelity/*``, docs/design.md §5)."""

from envace.metrics.fidelity import (
    NAMES,
    FidelityMetrics,
    FidelityScores,
    FidelityTracker,
    canonical,
    decision_f1,
    error_agreement,
    exact_match,
    fidelity_table,
    json_valid,
    key_paths,
    key_set_f1,
    leaf_value_f1,
    leaf_values,
    score_pair,
)

__all__ = [
    "NAMES",
    "FidelityMetrics",
    "FidelityScores",
    "FidelityTracker",
    "canonical",
    "decision_f1",
    "error_agreement",
    "exact_match",
    "fidelity_table",
    "json_valid",
    "key_paths",
    "key_set_f1",
    "leaf_value_f1",
    "leaf_values",
    "score_pair",
]
