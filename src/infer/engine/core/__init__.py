"""One engine step and its parts: the scheduler decides, the runner launches the forward
pass and sampling, the engine collects and updates its requests."""
