"""Search for a plan: the space of decisions over the NDA's colors
(`space`), the exact CP-SAT backend (`cpsat`), the Monte Carlo tree search
backend (`mcts`) and what both report (`report`: results, progress, the
no-fit message). Knows plans, the NDA and the cost table; nothing of specs,
tactics or the command line."""

# A search's default budget, in seconds (an auto tactic's `time_limit`, `plan --time-limit`): the
# rest of a minute is for building the program and the model, the expert floor and the lowering, so
# that `plan --solver` answers in under a minute where a search runs to its limit (unet's CP-SAT: 63 s
# at 60, 52 s at 50, the same plan).
SEARCH_TIME_LIMIT_S = 50.0
