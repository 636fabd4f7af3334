"""The IOPDDL intra-operator parallelism problem (ASPLOS/EuroSys 2025
contest; instances in ../shared/iopddl/): read it, evaluate a solution
exactly, and solve it under a time limit.

A problem: nodes, each with strategies (a cost and a memory usage each) and
a live interval [start, end) of time steps; edges between two nodes, each
with a cost per pair of their strategies; a memory limit. A solution picks
one strategy per node; its cost is the chosen node costs plus the chosen
edge entries, and it is feasible when at every time step the usages of the
live nodes sum to at most the limit. 10^18 marks a forbidden choice.

Solver (`solve`):
  1. presolve: drop forbidden and dominated strategies, fold nodes left
     with one strategy into their neighbours, merge parallel edges;
  2. a feasible start: every node at its least-usage strategy (the limit
     is about 1.1x that peak in every instance), then greedy descent:
     each node to its cheapest strategy that keeps memory feasible;
  3. unless the problem is small enough for one tight model, nodes a
     neighbour determines (each of its strategies allows one of theirs,
     every other pair forbidden) absorbed into it, exactly: tens of
     thousands of free nodes become a few hundred on most instances,
     whose memory is then piecewise constant in time; greedy again;
  4. a small reduced problem: its LP relaxation (the local polytope,
     memory rows added as the LP overfills them) solved by GLOP, rounded
     along the edges, repaired to fit memory and improved greedily,
     replaces the incumbent when cheaper; then one CP-SAT model, hinted
     with the incumbent, solved for the rest of the time. A large one gets
     large-neighbourhood search: CP-SAT re-solves a neighbourhood (grown in
     the graph from one of the most expensive nodes together with its whole
     star, a random node, or the nodes live at a step near the memory peak)
     with everything else fixed at the incumbent, which hints it; an
     improvement of the exact cost is kept. The memory of a model is one
     constraint per segment of time over which its nodes' usages are
     constant (the others' usage enters as the segment's peak), only where
     the model could exceed the limit and no neighbouring segment implies
     it; written as explicit sums, or as a running sweep when those sums
     would be large.
Costs are summed in Python ints (they overflow int64); CP-SAT sees costs
relative to each node's and edge's minimum, which fit.
"""

from solver.iopddl.driver import SolveOptions, SolveResult, solve
from solver.iopddl.memory import _implied_segments, _repair_memory, _sweep_constraints
from solver.iopddl.model import _subsolve
from solver.iopddl.neighbourhood import _hot_nodes, _neighbourhood, _whole_model
from solver.iopddl.presolve import _combined_load, _merge_determined, presolve
from solver.iopddl.problem import (
    INFINITE,
    Evaluation,
    IopddlError,
    Problem,
    evaluate,
    parse_problem,
    read_problem,
    read_solution,
    usage_profile,
)
from solver.iopddl.relaxation import _lp_roundings, _lp_start, _round_along_edges
from solver.iopddl.state import _greedy_sweeps, _merged_state, _start, _State

# The public API; the tests also reach the stages' own functions through here.
__all__ = ["INFINITE", "Evaluation", "IopddlError", "Problem", "SolveOptions", "SolveResult", "evaluate",
           "parse_problem", "presolve", "read_problem", "read_solution", "solve", "usage_profile",
           "_combined_load", "_greedy_sweeps", "_hot_nodes", "_implied_segments", "_lp_roundings", "_lp_start",
           "_merge_determined", "_merged_state", "_neighbourhood", "_repair_memory", "_round_along_edges",
           "_start", "_State", "_subsolve", "_sweep_constraints", "_whole_model"]
