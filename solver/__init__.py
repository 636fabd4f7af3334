"""Plans, how they are found and what the user touches, in layers (each
imports only the ones before it): `plan` (the Plan every layer speaks),
`search` (space, CP-SAT, MCTS), `planning` (specs, tactics, the planner),
`frontend` (CLI, check, compare, explain, export, JAX bridge). `iopddl`
stands apart: the contest's problem, its own reader and solver."""
