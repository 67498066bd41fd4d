"""The client API: ``Team``, ``RunHandle``, ``BatchHandle`` and fleet budgets.
It enqueues by task name, so a client needs no worker code."""
