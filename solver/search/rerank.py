"""The simulator's figure for a searched plan: lower it and run the
two-stream schedule (`costmodel.simulate`). CP-SAT proves the serial step
time; `cpsat.solve` with `rerank` > 1 asks this for the makespan of each of
its best plans and keeps the shortest (docs/costmodel.md, "What the
solver proves")."""

from __future__ import annotations

from costmodel.simulate import simulate
from costmodel.table import CostTable
from ir.lower import lower
from ir.sharding import FactorSharding


def simulated_makespan_s(table: CostTable, sharding: FactorSharding) -> float:
    """The makespan of `sharding`'s device-local program (default lowering
    options: the ones the cost table prices)."""
    return simulate(lower(table.fn, table.nda, sharding).function, table.hardware).makespan_s


__all__ = ["simulated_makespan_s"]
