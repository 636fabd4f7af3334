"""From a spec to a plan: the spec (`spec`: model, mesh, hardware, schedule,
expectations, loaded from YAML), the schedule's tactics (`tactics`) and the
planner that builds the program, runs the schedule and calls the search
for its `auto` tactics (`planner`)."""
