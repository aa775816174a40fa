"""The build engine: actions, their keys, the scheduler and the workers that run them."""
