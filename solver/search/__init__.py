"""Search for a plan: the space of decisions over the NDA's colors
(`space`), the exact CP-SAT backend (`cpsat`), the Monte Carlo tree search
backend (`mcts`) and what both report (`report`: results, progress, the
no-fit message). Knows plans, the NDA and the cost table; nothing of specs,
tactics or the command line."""

# The searches' default budgets (an auto tactic's `time_limit`, `plan --time-limit`), in seconds.
# CP-SAT's is deterministic time (`cpsat.solve`: the same plan however loaded the machine), and the
# rest of a minute is for building the program and the model, the expert floor and the lowering, so
# that `plan --solver cpsat` answers in under a minute where a search runs to its limit: the two
# bundled specs whose solve proves no optimum (unet, deepseek_v3_moe) reach the same plan and gap at 30
# as at 50, and answered in 64-65 s wall at 50 (a wall second was 1.2 deterministic ones; in a loaded
# hour 2.5). The MCTS's is wall time and a backstop (`mcts`, "Determinism"): its searches stop by
# themselves, and on a loaded machine a tighter one would cut them short.
CPSAT_TIME_LIMIT_S = 30.0
MCTS_TIME_LIMIT_S = 50.0


def default_time_limit_s(solver: str) -> float:
    """The budget of a search by `solver` ("cpsat" or "mcts") that sets none."""
    return MCTS_TIME_LIMIT_S if solver == "mcts" else CPSAT_TIME_LIMIT_S
