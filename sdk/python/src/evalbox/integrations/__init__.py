"""Adapters of evalbox to the frameworks that run evals and RL (docs/integrations/).

Each is a thin, typed layer over the SDK: :mod:`evalbox.integrations.trl` (TRL's reward
functions), :mod:`evalbox.integrations.nemo_gym` (NeMo Gym's sandbox provider). A framework is
never a dependency of the SDK itself: install it beside.
"""
