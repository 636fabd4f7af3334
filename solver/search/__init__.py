"""Search for a plan: the space of decisions over the NDA's colors
(`space`), the exact CP-SAT backend (`cpsat`), the Monte Carlo tree search
backend (`mcts`) and what both report (`report`: results, progress, the
no-fit message). Knows plans, the NDA and the cost table; nothing of specs,
tactics or the command line."""

# The searches' default budgets (an auto tactic's `time_limit`, `plan --time-limit`), in seconds of
# work, not of the clock, so that a search its limit cuts gives the same plan on a loaded machine:
# CP-SAT's deterministic time (`cpsat.solve`), the MCTS's tasks counted as on an idle machine
# (`mcts_pricing`, "Budget"). For CP-SAT the rest of a minute is for building the program and the
# model, the expert floor and the lowering, so that `plan --solver cpsat` answers in under a minute
# where a search runs to its limit: the two bundled specs whose solve proves no optimum (unet,
# deepseek_v3_moe) reach the same plan and gap at 30 as at 50, and answered in 64-65 s wall at 50 (a
# deterministic second was 1.2 wall ones; in a loaded hour 2.5). The MCTS's is a backstop: its
# searches stop by themselves, mixtral_8x7b's, the longest, at 40 s of its clock.
CPSAT_TIME_LIMIT_S = 30.0
MCTS_TIME_LIMIT_S = 50.0


def default_time_limit_s(solver: str) -> float:
    """The budget of a search by `solver` ("cpsat" or "mcts") that sets none."""
    return MCTS_TIME_LIMIT_S if solver == "mcts" else CPSAT_TIME_LIMIT_S
