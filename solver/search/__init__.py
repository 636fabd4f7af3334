"""Search for a plan: the space of decisions over the NDA's colors
(`space`), the exact CP-SAT backend (`cpsat`), the Monte Carlo tree search
backend (`mcts`) and what both report (`report`: results, progress, the
no-fit message). Knows plans, the NDA and the cost table; nothing of specs,
tactics or the command line."""
