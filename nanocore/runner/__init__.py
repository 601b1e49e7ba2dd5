"""The runner: the model, its KV cache and CUDA graphs on each rank, and the executors that run a step plan on
every rank. It never imports the engine: the scheduler's ``StepPlan`` is all it sees."""
