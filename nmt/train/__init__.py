"""Training: the config schema, the loop, resume, distributed runs, logging and the final evaluation."""
