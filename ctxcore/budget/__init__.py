"""The budget stage: how many tokens are left for retrieved memories, settled before any
store is queried.

The first stage of an assembly (request -> budget -> retrieval -> scoring -> pack ->
format). What it decides lives here, in three modules:

* `compute` -- the budget by subtraction: every obligation (response, safety buffer,
  directive, messages, tools, the formatter's fixed text) paid from the model's window
  or the caller's token budget, and what is left for memories (`compute_budget`,
  `Budget`, `BudgetPolicy`);
* `history` -- the conversation as turn groups (an assistant's tool calls with their
  results), and trimming the oldest groups to free a shortfall;
* `plan` -- budget before work: the messages and tools priced (by ``ctxcore.pricing``),
  whether the request fits or history must go, and the budget once the directive is
  known, with the trimming already planned.

The package names the computation's public types; the pipeline (``ctxcore.assembly``)
calls `plan.make_plan` before retrieval and `plan.settle` once the directive is back.
The stage imports the pricing, the formatter and the request and result types beside it,
and nothing of the pipeline.
"""

from .compute import (
    CONSTRAINED_BELOW,
    RESPONSE_FRACTION,
    RESPONSE_MAX,
    RESPONSE_MIN,
    Budget,
    BudgetPolicy,
    check_token_budget,
    compute_budget,
)

__all__ = [
    "CONSTRAINED_BELOW",
    "RESPONSE_FRACTION",
    "RESPONSE_MAX",
    "RESPONSE_MIN",
    "Budget",
    "BudgetPolicy",
    "check_token_budget",
    "compute_budget",
]
