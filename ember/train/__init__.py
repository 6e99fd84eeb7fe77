"""Training: one explicit loop parameterised by an objective or a task."""
